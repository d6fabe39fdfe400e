"""A study's quality against its cost, and its ``--estimate`` checked against what it took.

Each trial's fit records its cost in its MLflow run (``lit.module.RunCost``): here every complete reported trial's
steady tokens/s and s/step are read back (one search of the study's trial runs), and per grid point (or search trial)
set beside its metric: the point's mean tokens/s with the 95 % t interval over its seeds, its mean s/step, and its
measured hours a fit (the trials' run times in the journal, ``report.trial_seconds``). The plot puts the metric
against tokens/s: every seed, each point's mean with both intervals, and the Pareto front (the points no other point
beats on both: at least as fast and at least as good, better on one) joined and marked.

``atlas-lab sweep FILE --estimate`` keeps its figures in ``runs/sweeps/<study>/estimate.json`` (``save_estimate``);
the report logs them to the study's parent run (artifact ``estimate/estimate.json``, metrics ``estimate/*``) and
compares each point's measured hours a fit with the hours its pilot projected (measured ÷ projected), and the
study's measured trial-hours (``report.trial_hours``: every trial's run time summed, the one figure ``--cost`` and the
results' cost lines give) with the hours projected in all, so a user learns how far to trust the next estimate. The
projection leaves out what a sweep does around a fit (its config check, the MLflow run, the learning-curve plot): a
measured hour is a trial's whole run time.
"""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.text import Text

from ..tables import print_table
from .estimate import ESTIMATE, estimate_path
from .report import _markdown, interval, point_name, trial_hours, trial_seconds
from .spec import short_names
from .study import is_superseded, is_tune

RATES = ("tokens_per_s", "s_per_step")  # each trial run's cost/steady/<rate>
HEADER = ["n", "mean", "tokens/s", "tokens/s 95% CI", "s/step", "h a fit", "h projected", "measured ÷ projected"]


def load_estimate(study: str, client=None, parent: str | None = None) -> dict | None:
    """The study's ``--estimate`` figures: ``runs/sweeps/<study>/estimate.json``, else the copy on its parent run;
    None where none was run."""
    path = estimate_path(study)
    if path.is_file():
        return json.loads(path.read_text())
    if client is None or parent is None:
        return None
    import tempfile

    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
    from mlflow.exceptions import MlflowException

    try:
        if f"estimate/{ESTIMATE}" not in {a.path for a in client.list_artifacts(parent, "estimate")}:
            return None
        shown = MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get_raw()
        MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.set("false")  # no progress bar on the report's output
        try:
            with tempfile.TemporaryDirectory() as folder:
                return json.loads(Path(client.download_artifacts(parent, f"estimate/{ESTIMATE}", folder)).read_text())
        finally:
            if shown is None:
                MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.unset()
            else:
                MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.set(shown)
    except (MlflowException, OSError):  # the run is gone from the store, or its artifacts
        return None


def trial_rates(client, study: optuna.Study) -> dict[tuple[int, int], dict[str, float]]:
    """{(trial number, repeat): {"tokens_per_s", "s_per_step"}} of every trial run of the study that recorded its
    steady cost (``cost/steady/*``), read in one search of the runs the trials list (``mlflow_run_ids``)."""
    if client is None:
        return {}
    listed = {run_id for t in study.get_trials(deepcopy=False) for run_id in t.user_attrs.get("mlflow_run_ids", [])}
    parent = study.user_attrs.get("mlflow_parent_run_id")
    if not listed or parent is None:
        return {}
    from mlflow.exceptions import MlflowException

    try:
        experiment = client.get_run(parent).info.experiment_id
    except MlflowException:  # the journal outlived its MLflow store
        return {}
    out, token = {}, None
    while True:
        page = client.search_runs([experiment], filter_string=f"tags.`atlas_lab.study` = '{study.study_name}' and "
                                                              "tags.`atlas_lab.role` = 'trial'",
                                  max_results=1000, page_token=token)
        for run in page:
            metrics, tags = run.data.metrics, run.data.tags
            if run.info.run_id in listed and all(f"cost/steady/{k}" in metrics for k in RATES):
                key = (int(tags["optuna.trial_number"]), int(tags.get("sweep.repeat", 0)))
                out[key] = {k: metrics[f"cost/steady/{k}"] for k in RATES}
        token = page.token
        if not token:
            return out


def _labels_key(labels: dict) -> str:
    return json.dumps(json.loads(json.dumps(labels, default=str)), sort_keys=True)


def cost_rows(study: optuna.Study, columns: list[str], rows: list[dict], rates: dict,
              estimate: dict | None) -> list[dict]:
    """Per row of ``report.result_rows`` (best first): its labels, n and mean; per seed (repeat) its value and
    tokens/s ("seeds": [(tokens/s, value)]); its tokens/s ``interval`` and mean s/step over the seeds that recorded
    them; its measured hours a fit (the complete reported trials' run times, per fit) and the hours its pilot
    projected (``estimate``: the configuration with its labels, or a search study's one configuration)."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    projected = {}
    for p in (estimate or {}).get("points", []):
        for labels in p.get("labels") or [{}]:
            projected.setdefault(_labels_key(labels), p.get("hours_a_fit"))
    search = study.user_attrs.get("sampler", "grid") != "grid"
    out = []
    for r in rows:
        trials = [by_number[int(n)] for n in r["trials"].split()]
        done = [t for t in trials if t.state == TrialState.COMPLETE and not is_superseded(study, t) and not is_tune(t)]
        seeds, tokens, steps, hours = [], [], [], []
        for t in done:
            repeats = range(len(t.user_attrs["repeat_values"])) if "repeat_values" in t.user_attrs else \
                [t.user_attrs.get("repeat", 0)]
            for repeat in repeats:
                rate = rates.get((t.number, repeat))
                if rate is not None:
                    tokens.append(rate["tokens_per_s"])
                    steps.append(rate["s_per_step"])
                    if repeat in r["values"]:
                        seeds.append((rate["tokens_per_s"], r["values"][repeat]))
            seconds = trial_seconds(t)
            if seconds is not None:
                hours += [seconds / 3600 / len(repeats)] * len(repeats)
        speed = interval(tokens)
        plan = projected.get(_labels_key({} if search else {k: r[k] for k in columns}))
        measured = sum(hours) / len(hours) if hours else None
        out.append({k: r[k] for k in columns} | {
            "n": r["n"], "mean": r["mean"], "low": r["low"], "high": r["high"], "seeds": seeds,
            "tokens_per_s": speed["mean"], "tokens_low": speed["low"], "tokens_high": speed["high"],
            "s_per_step": sum(steps) / len(steps) if steps else None, "hours": measured, "projected": plan,
            "ratio": measured / plan if measured is not None and plan else None})
    return out


def pareto(points: list[tuple[float, float]], maximize: bool) -> list[int]:
    """The indices of the points (tokens/s, metric) no other point beats on both: at least as fast and at least as
    good (in the metric's direction), better on one."""
    sign = 1.0 if maximize else -1.0

    def beats(a, b):
        return a[0] >= b[0] and sign * a[1] >= sign * b[1] and (a[0] > b[0] or sign * a[1] > sign * b[1])

    return [i for i, p in enumerate(points) if not any(beats(q, p) for j, q in enumerate(points) if j != i)]


def quality_cost_plot(columns: list[str], rows: list[dict], metric: str, maximize: bool, path: Path) -> Path | None:
    """The metric against steady tokens/s: every seed (a small dot in its point's colour), each point's mean with
    its 95 % intervals (the metric's over its seeds, vertical; tokens/s's, horizontal), labelled, and the Pareto
    front of the means joined by a line, its points ringed. None where no point has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["mean"] is not None and r["tokens_per_s"] is not None]
    if not shown:
        return None
    names = dict(zip(columns, short_names(columns)))
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for i, r in enumerate(shown):
        color = f"C{i % 10}"
        label = " ".join(f"{names[k]}={r[k]}" for k in columns) or f"trials {i}"
        if r["seeds"]:
            xs, ys = zip(*r["seeds"])
            ax.scatter(xs, ys, s=12, color=color, alpha=0.45)
        xerr = None if r["tokens_low"] is None else [[r["tokens_per_s"] - r["tokens_low"]],
                                                     [r["tokens_high"] - r["tokens_per_s"]]]
        yerr = None if r["low"] is None else [[r["mean"] - r["low"]], [r["high"] - r["mean"]]]
        ax.errorbar([r["tokens_per_s"]], [r["mean"]], xerr=xerr, yerr=yerr, fmt="o", color=color, capsize=3,
                    label=label)
    front = sorted((shown[i] for i in pareto([(r["tokens_per_s"], r["mean"]) for r in shown], maximize)),
                   key=lambda r: r["tokens_per_s"])
    ax.plot([r["tokens_per_s"] for r in front], [r["mean"] for r in front], color="black", linewidth=1,
            linestyle="--", marker="o", markersize=13, markerfacecolor="none", label="Pareto front (means)")
    ax.set_xlabel("training tokens/s (steady steps; every seed, mean and 95% CI)")
    ax.set_ylabel(f"{metric} ({'higher' if maximize else 'lower'} is better; mean, 95% CI)")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _num(v, digits: str = ".4g") -> str:
    return "—" if v is None else format(v, digits)


def _cells(r: dict) -> list:
    ci = "—" if r["tokens_low"] is None else f"[{r['tokens_low']:,.0f}, {r['tokens_high']:,.0f}]"
    return [r["n"], _num(r["mean"], ".4f"), _num(r["tokens_per_s"], ",.0f"), ci, _num(r["s_per_step"]),
            _num(r["hours"], ".3f"), _num(r["projected"], ".3f"), _num(r["ratio"], ".2f")]


def estimate_line(measured: float, estimate: dict | None) -> str:
    """One sentence: the study's measured trial-hours against what ``--estimate`` projected, or that none ran."""
    if estimate is None:
        return (f"measured: {measured:.3f} trial-hours; no --estimate was run for this study (atlas-lab sweep FILE "
                "--estimate projects its hours before it starts)")
    ratio = f"; measured ÷ projected {measured / estimate['hours']:.2f}" if estimate.get("hours") else ""
    return (f"measured: {measured:.3f} trial-hours against {estimate['hours']:.3f} h projected by --estimate "
            f"{estimate.get('steps')} ({estimate.get('device')}, {estimate.get('when')}, in "
            f"{estimate.get('pilot_seconds', 0):.0f} s){ratio}")


def reader(tracking_uri: str | None):
    """An MlflowClient of the tracking store ``tracking_uri`` (default the project's) to read the trials' runs; None
    where a SQLite store's file is not there (nothing is created)."""
    from mlflow.tracking import MlflowClient

    from ..store import resolve_uri, store_file

    uri = resolve_uri(tracking_uri, create=False)
    store = store_file(uri)
    return None if store is not None and not store.is_file() else MlflowClient(uri)


def quality_cost(study: optuna.Study, columns: list[str], rows: list[dict], metric: str, maximize: bool, out: Path,
                 console, client=None, parent: str | None = None, tracking_uri: str | None = None) -> list[Path]:
    """The quality-against-cost table (terminal, ``quality_cost.csv`` and ``.md``), its plot
    (``quality_cost.png``) and the estimate's check. The trials' runs are read with ``client``, else from the store
    ``tracking_uri`` (``reader``; none there: no tokens/s). With ``client`` and ``parent`` (the sweep's summary) the
    estimate's figures, each point's tokens/s and s/step and the measured hours go to the parent run too (the files
    are logged with the report's). Returns the files written."""
    tracked = any("mlflow_run_ids" in t.user_attrs for t in study.get_trials(deepcopy=False))
    client_of_runs = client if client is not None or not tracked else reader(tracking_uri)
    estimate = load_estimate(study.study_name, client_of_runs, study.user_attrs.get("mlflow_parent_run_id"))
    table = cost_rows(study, columns, rows, trial_rates(client_of_runs, study), estimate)
    measured = trial_hours(study)
    line = estimate_line(measured, estimate)
    keys = short_names(columns)
    print_table(console, f"study {study.study_name}: {metric} against its cost, best first (tokens/s and s/step: "
                         "the trials' steady steps, mean over seeds; h a fit: their run times)",
                keys + HEADER, [[str(r[k]) for k in columns] + _cells(r) for r in table], keys=len(columns))
    console.print(Text(line))
    files = [out / "quality_cost.csv", out / "quality_cost.md"]
    with files[0].open("w", newline="") as f:
        w = csv.writer(f)
        fields = ["n", "mean", "tokens_per_s", "tokens_low", "tokens_high", "s_per_step", "hours", "projected",
                  "ratio"]
        w.writerow(columns + fields)
        for r in table:
            w.writerow([r[k] for k in columns] + [r[k] for k in fields])
    files[1].write_text("\n".join([f"{metric} against its cost: tokens/s and s/step over the trials' steady steps "
                                   "(mean and 95 % t interval over the seeds), hours a fit from the journal beside "
                                   "the hours --estimate projected", ""]
                                  + _markdown(columns + HEADER, [[r[k] for k in columns] + _cells(r) for r in table])
                                  + ["", line]) + "\n")
    plot = quality_cost_plot(columns, table, metric, maximize, out / "quality_cost.png")
    files += [plot] if plot else []
    if client is not None and parent is not None:
        log_costs(client, parent, columns, table, measured, estimate)
    return files


def log_costs(client, parent: str, columns: list[str], table: list[dict], measured: float,
              estimate: dict | None) -> None:
    """The parent run's cost metrics: per point ``tokens_per_s/<point>``, ``s_per_step/<point>``,
    ``hours_a_fit/<point>`` and with an estimate ``estimate/hours_a_fit/<point>``; ``measured/trial_hours`` and
    ``estimate/hours``; the estimate's figures as the artifact ``estimate/estimate.json``."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric("measured/trial_hours", measured, now, 0)]
    for r in table:
        name = point_name(r, columns) if columns else None
        for key, value in (("tokens_per_s", r["tokens_per_s"]), ("s_per_step", r["s_per_step"]),
                           ("hours_a_fit", r["hours"]), ("estimate/hours_a_fit", r["projected"])):
            if name and value is not None:
                metrics.append(Metric(f"{key}/{name}", value, now, 0))
    if estimate is not None:
        metrics.append(Metric("estimate/hours", estimate["hours"], now, 0))
        client.log_dict(parent, estimate, f"estimate/{ESTIMATE}")
    for i in range(0, len(metrics), 500):
        client.log_batch(parent, metrics=metrics[i:i + 500])
