"""A capacity study: recall of N random pairs by memory component combinations, without training (Zoology's plot).

```yaml
study: capacity-memories
n_pairs: [8, 16, 32, 64, 128]   # N: pairs written, then recalled
head_dims: [8, 16, 32]          # d_k = d_v: the state-size axis
trials: 8                       # independent draws per N (the probe's batch)
seed: 0
combinations:                   # label -> the probed memory: MemoryConfig changes and the probe's gates
  delta rule: {architecture: linear}
  linear attention: {architecture: linear, attentional_bias: dot}
  delta rule, poly 2: {architecture: linear, feature_map: {name: polynomial, degree: 2}}
```

Each combination, head dim and N is one ``capacity_probe`` call (atlas_lab.data.capacity): N unit-norm pairs written
by ``memorize``, then every key read back; retrieval accuracy is the share of keys whose read-out is closest to its
own value (chance 1/N). A combination's state is counted tensor by tensor from the memory's state after the call:
weights, optimiser state and the Omega window's cache, per head. ``atlas-lab capacity FILE`` prints the table (the
largest N each combination holds at ≥ 0.9 accuracy, per head dim), writes capacity.csv / capacity.md /
capacity.png (accuracy against state size, one panel per N, chance dashed) under runs/capacity/<study>/, and logs
them to an MLflow run of the experiment ``atlas-lab-capacity``.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..data.capacity import GATES, capacity_probe, probe_config
from ..tables import print_table
from .spec import SweepError, read_mapping

KEYS = ("study", "n_pairs", "head_dims", "trials", "seed", "combinations")
HELD = 0.9  # a combination holds N pairs where its retrieval accuracy is at least this
EXPERIMENT = "atlas-lab-capacity"


def load_capacity(path: str | Path) -> dict:
    """Read and check a capacity file: every combination's memory is built before anything runs."""
    path = Path(path)

    def fail(key, message):
        raise SweepError(f"{path}: {key}: {message}")

    raw = read_mapping(path, "capacity", KEYS)
    if not isinstance(raw.get("study"), str) or not re.fullmatch(r"[\w.\-]+", raw["study"]):
        fail("study", "required: letters, digits, '_', '-' and '.'")
    for key in ("n_pairs", "head_dims"):
        values = raw.get(key)
        if not isinstance(values, list) or not values or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            fail(key, f"expected a non-empty list of ints >= 1, got {values!r}")
    for key, default in (("trials", 8), ("seed", 0)):
        value = raw.setdefault(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "trials" else 0):
            fail(key, f"expected an int >= {1 if key == 'trials' else 0}, got {value!r}")
    combos = raw.get("combinations")
    if not isinstance(combos, dict) or not combos:
        fail("combinations", "expected a mapping of labels to memory changes, e.g. {delta rule: {architecture: "
                             "linear}}")
    for label, changes in combos.items():
        if not isinstance(changes, dict):
            fail(f"combinations.{label}", f"expected a mapping of memory options, got {changes!r}")
        try:
            probe_config(f"combinations.{label}", **{k: v for k, v in changes.items() if k not in GATES})
        except ValueError as e:
            raise SweepError(f"{path}: {e}") from None
        for gate in set(changes) & set(GATES):
            flag = gate == "normalize_eta"
            if isinstance(changes[gate], bool) != flag or not isinstance(changes[gate], (int, float)):
                fail(f"combinations.{label}.{gate}", f"expected {'true or false' if flag else 'a number'}, got "
                                                     f"{changes[gate]!r}")
    return raw


def run_capacity(spec: dict) -> list[dict]:
    """One row per combination, head dim and N: the probe's row with the combination's label and state floats."""
    rows = []
    for label, changes in spec["combinations"].items():
        for d in spec["head_dims"]:
            for row in capacity_probe(spec["n_pairs"], d_k=d, d_v=d, trials=spec["trials"], seed=spec["seed"],
                                      **changes):
                rows.append({"combination": label, "head_dim": d} | row)
    return rows


def held(rows: list[dict]) -> dict[tuple, int]:
    """(combination, head dim) -> the largest N recalled at ≥ HELD accuracy (0 where none)."""
    out: dict[tuple, int] = {}
    for r in rows:
        key = (r["combination"], r["head_dim"])
        out[key] = max(out.get(key, 0), r["n_pairs"] if r["retrieval_acc"] >= HELD else 0)
    return out


def capacity_plot(rows: list[dict], path: Path) -> Path:
    """Zoology's view: retrieval accuracy against state floats per head (log scale), one line per combination, one
    panel per N, chance (1/N) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["n_pairs"] for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(4.2 * len(ns), 3.6), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], ns):
        for label in dict.fromkeys(r["combination"] for r in rows):
            line = sorted((r["state_floats"], r["retrieval_acc"]) for r in rows
                          if r["combination"] == label and r["n_pairs"] == n)
            ax.plot(*zip(*line), marker="o", label=label)
        ax.axhline(1 / n, color="grey", linestyle="--", linewidth=1, label="chance (1/N)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"N = {n} pairs")
        ax.set_xlabel("state floats per head")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("retrieval accuracy")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


COLUMNS = ["combination", "head_dim", "state_floats", "feature_dim", "n_pairs", "retrieval_acc", "cosine",
           "recall_error"]


def write_capacity(spec: dict, rows: list[dict], out: Path) -> list[Path]:
    """capacity.csv (every row), capacity.md (accuracy per N, the pairs held, chance) and capacity.png."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "capacity.csv", out / "capacity.md", capacity_plot(rows, out / "capacity.png")]
    with files[0].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows([[r[c] for c in COLUMNS] for r in rows])
    header, cells = table(spec, rows)
    lines = [f"retrieval accuracy of N pairs written into one memory head (chance 1/N: "
             f"{', '.join(f'{1 / n:.3f}' for n in spec['n_pairs'])}), {spec['trials']} draws per N, seed "
             f"{spec['seed']}; held: the largest N recalled at ≥ {HELD:g}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in cells]
    files[1].write_text("\n".join(lines) + "\n")
    return files


def table(spec: dict, rows: list[dict]) -> tuple[list[str], list[list]]:
    """The summary table: one row per combination and head dim."""
    ns = spec["n_pairs"]
    header = ["combination", "head dim", "state floats"] + [f"N={n}" for n in ns] + ["held"]
    capacity = held(rows)
    cells = []
    for (label, d), n_held in capacity.items():
        mine = {r["n_pairs"]: r for r in rows if r["combination"] == label and r["head_dim"] == d}
        cells.append([label, d, mine[ns[0]]["state_floats"]] + [f"{mine[n]['retrieval_acc']:.3f}" for n in ns]
                     + [n_held])
    return header, cells


def capacity_study(path: str, tracking_uri: str | None = None, console: Console | None = None) -> Path:
    """Run a capacity file: the table in the terminal, the files under runs/capacity/<study>/, an MLflow run."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from ..store import init_store, resolve_uri
    from .tracking import experiment_id

    console = console or Console()
    spec = load_capacity(path)
    rows = run_capacity(spec)
    out = Path("runs") / "capacity" / spec["study"]
    files = write_capacity(spec, rows, out)
    header, cells = table(spec, rows)
    print_table(console, f"capacity study {spec['study']}: retrieval accuracy of N pairs, per head (chance 1/N)",
                header, cells, keys=2)
    uri = resolve_uri(tracking_uri)
    init_store(uri)
    client = MlflowClient(uri)
    run = client.create_run(experiment_id(client, EXPERIMENT), run_name=spec["study"],
                            tags={"atlas_lab.role": "capacity"})
    params = [Param("file", str(path)), Param("n_pairs", str(spec["n_pairs"])),
              Param("head_dims", str(spec["head_dims"])), Param("trials", str(spec["trials"])),
              Param("seed", str(spec["seed"]))]
    metrics = [Metric(re.sub(r"[^\w\-./ ]", "_", f"acc/{r['combination']}/d{r['head_dim']}"), r["retrieval_acc"], 0,
                      r["n_pairs"]) for r in rows]
    metrics += [Metric(re.sub(r"[^\w\-./ ]", "_", f"held/{label}/d{d}"), n, 0, 0) for (label, d), n in
                held(rows).items()]
    for i in range(0, len(metrics), 500):
        client.log_batch(run.info.run_id, metrics=metrics[i:i + 500], params=params if i == 0 else [])
    for f in files:
        client.log_artifact(run.info.run_id, str(f))
    client.set_terminated(run.info.run_id)
    console.print(Text(f"files: {', '.join(str(f) for f in files)}; MLflow run {run.info.run_id} in experiment "
                       f"{EXPERIMENT}"))
    return out
