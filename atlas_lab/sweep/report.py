"""Study summaries: the results table (terminal, CSV, Markdown), the ablation plot, parameter importances."""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.text import Text

from ..tables import print_table
from .spec import short_names
from .study import is_superseded

MARK = {TrialState.FAIL: "FAIL", TrialState.PRUNED: "PRUNED", TrialState.RUNNING: "RUNNING",
        TrialState.WAITING: "WAITING"}


def result_rows(study: optuna.Study) -> tuple[list[str], list[dict]]:
    """(parameter columns, rows) best first; a grid point's repeats are one row (mean ± std)."""
    attrs = study.user_attrs
    maximize = attrs.get("direction", study.direction.name.lower()) == "maximize"
    trials = [t for t in study.get_trials(deepcopy=False) if not is_superseded(study, t)]
    if attrs.get("sampler", "grid") == "grid":
        columns = list(attrs.get("grid_keys", []))
        groups: dict[tuple, list] = {}
        for t in trials:
            labels = t.user_attrs.get("labels", {})
            groups.setdefault(tuple(labels.get(k) for k in columns), []).append(t)
        rows = []
        for key, ts in groups.items():
            values = [t.value for t in ts if t.state == TrialState.COMPLETE]
            states = sorted({MARK[t.state] for t in ts if t.state in MARK})
            rows.append(dict(zip(columns, key)) | {
                "mean": statistics.fmean(values) if values else None,
                "std": statistics.stdev(values) if len(values) > 1 else None,  # no spread from one seed
                "complete": f"{len(values)}/{len(ts)}", "status": ",".join(states) or "ok",
                "trials": " ".join(str(t.number) for t in ts),
                "reason": "; ".join(t.user_attrs["fail_reason"] for t in ts if "fail_reason" in t.user_attrs)})
    else:
        columns = sorted({k for t in trials for k in t.params})
        rows = [dict({k: t.params.get(k) for k in columns}, mean=t.value if t.state == TrialState.COMPLETE else None,
                     std=None, complete="1/1" if t.state == TrialState.COMPLETE else "0/1",
                     status=MARK.get(t.state, "ok"), trials=str(t.number), reason=t.user_attrs.get("fail_reason", ""))
                for t in trials]
    rows.sort(key=lambda r: (r["mean"] is None, -(r["mean"] or 0) if maximize else (r["mean"] or 0)))
    return columns, rows


def _fmt(v):
    if v is None:
        return "—"
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def write_tables(columns: list[str], rows: list[dict], metric: str, out: Path) -> tuple[Path, Path]:
    header = columns + [f"{metric} mean", "std", "complete", "status", "trials", "reason"]
    keys = columns + ["mean", "std", "complete", "status", "trials", "reason"]
    csv_path, md_path = out / "results.csv", out / "results.md"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow([r[k] for k in keys])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def ablation_plot(columns: list[str], rows: list[dict], metric: str, path: Path) -> Path | None:
    """One panel per grid axis: the metric of every point against that axis' label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["mean"] is not None]
    if not columns or not done:
        return None
    fig, axes = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.5), squeeze=False)
    for ax, col in zip(axes[0], columns):
        labels = list(dict.fromkeys(str(r[col]) for r in rows))
        for r in done:
            ax.errorbar(labels.index(str(r[col])), r["mean"], yerr=r["std"] or 0, fmt="o", alpha=0.7)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_xlabel(col)
        ax.set_ylabel(metric)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summarize(study: optuna.Study, client=None, parent: str | None = None, console: Console | None = None,
              out_dir: str | Path | None = None) -> Path:
    """Print the table, write results.{csv,md}, ablation.png (and importances.csv) and attach them to the
    parent run. Returns the folder."""
    console = console or Console()
    metric = study.user_attrs.get("metric", "value")
    columns, rows = result_rows(study)
    out = Path(out_dir or Path("runs") / "sweeps" / study.study_name)
    out.mkdir(parents=True, exist_ok=True)
    files = list(write_tables(columns, rows, metric, out))
    plot = ablation_plot(columns, rows, metric, out / "ablation.png")
    files += [plot] if plot else []
    if study.user_attrs.get("sampler") in ("tpe", "random"):
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
            importances = optuna.importance.get_param_importances(study)
            path = out / "importances.csv"
            path.write_text("parameter,importance\n" + "".join(f"{k},{v:.6f}\n" for k, v in importances.items()))
            files.append(path)
    print_table(console, f"study {study.study_name}: {metric} ({study.user_attrs.get('direction', '')}), best first",
                short_names(columns) + [f"{metric}", "± std", "complete", "status"],
                [[_fmt(r[c]) for c in columns] + [_fmt(r["mean"]), _fmt(r["std"]), r["complete"], r["status"]]
                 for r in rows], keys=len(columns),
                styles=["red" if "FAIL" in r["status"] else "yellow" if r["status"] != "ok" else None for r in rows])
    if client is not None and parent is not None:
        for f in files:
            client.log_artifact(parent, str(f), "summary")
    console.print(Text(f"files: {', '.join(str(f) for f in files)}"))
    console.print("browse every run: [bold]make ui[/bold]  (or: atlas-lab ui)")
    return out
