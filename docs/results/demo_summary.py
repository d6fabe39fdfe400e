"""`make demo`'s last step: one 80-column table and one plot from the files the demo's commands wrote.

Reads the capacity probe's rows (runs/capacity/capacity-demo/capacity.csv) and the trained study's report
files (runs/sweeps/demo-recall/results.csv, differences.csv: `atlas-lab report demo-recall --power DELTA` fills
their power columns),
prints per memory rule and head dim the probe's accuracy at the task's N beside the trained mean and interval, then
each comparison's difference, Holm p, verdict and the power of both tests (a difference of DELTA; equivalence within
the study's margin where the points are equal), and draws both on one plot against the state size
(floats per head): the probe's curve per rule, the trained means with their 95 % intervals, chance and 1/N
dotted. The report's own tables, with every column, are in runs/sweeps/demo-recall/results.md.

    python docs/results/demo_summary.py [--study demo-recall] [--capacity FILE] [--n-pairs 4] [--chance 0.03125]
                                        [--delta 0.05]
"""
from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

from rich.console import Console
from rich.text import Text

from atlas_lab.tables import print_table

AXIS = "model"  # the grid axis: "<rule>, head dim <d>"


def head_dim(label: str) -> int:
    """'delta rule, head dim 16' -> 16."""
    return int(re.search(r"head dim (\d+)", label).group(1))


def rule(label: str) -> str:
    """'delta rule, head dim 16' -> 'delta rule'."""
    return label.split(", head dim")[0]


def fmt(value: str | None, digits: int = 3) -> str:
    return "—" if value in (None, "", "None") else f"{float(value):.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default="demo-recall")
    p.add_argument("--capacity", default="runs/capacity/capacity-demo/capacity.csv")
    p.add_argument("--n-pairs", type=int, default=4, help="the task's N: the probe's row drawn and shown")
    p.add_argument("--chance", type=float, default=1 / 32, help="the trained model's chance (1 / values)")
    p.add_argument("--delta", type=float, default=0.05, help="the difference `report --power` was given")
    args = p.parse_args(argv)
    folder = Path("runs/sweeps") / args.study
    points = list(csv.DictReader((folder / "results.csv").open()))
    diffs = list(csv.DictReader((folder / "differences.csv").open()))
    probe = {(r["combination"], int(r["head_dim"])): r for r in csv.DictReader(Path(args.capacity).open())
             if int(r["n_pairs"]) == args.n_pairs}
    console = Console()
    rows = sorted(points, key=lambda r: (rule(r[AXIS]), head_dim(r[AXIS])))
    seeds = sorted({int(r["n"]) for r in rows})
    print_table(console, f"{args.study}: val/acc (the best validation) of trained models, mean and 95 % interval "
                         f"over {'/'.join(map(str, seeds))} seeds, beside the capacity probe's recall of "
                         f"N = {args.n_pairs} random pairs in one head (no training); state: floats per head",
                ["rule", "head dim", "state", "probe", "trained", "95% CI"],
                [[rule(r[AXIS]), head_dim(r[AXIS]), head_dim(r[AXIS]) ** 2,
                  fmt((probe.get((rule(r[AXIS]), head_dim(r[AXIS]))) or {}).get("retrieval_acc")), fmt(r["mean"]),
                  f"{fmt(r['ci_low'])}–{fmt(r['ci_high'])}"] for r in rows], keys=2)
    if diffs:
        base = next(r[AXIS] for r in points if r[AXIS] not in {d["changes"].split("=", 1)[1] for d in diffs})
        setting = diffs[0]["verdict"].split(" at ", 1)[1] if " at " in diffs[0]["verdict"] else ""
        console.print(Text(f"each point − {base}, paired by seed: mean and 95 % t interval, Holm p over "
                           f"{len(diffs)} comparison(s), power of the paired t test against ±{args.delta:g} at its "
                           f"Holm level and, where the study has a margin, of the equivalence test for equal points "
                           f"(with the seeds that give 0.8), the verdict at {setting}:"))
    for d in diffs:
        power = f", power {fmt(d['power'], 2)} (0.8 at {d['seeds'] or '—'} seeds)" if d.get("power") else ""
        if d.get("power_equiv"):
            power += (f"; equivalence within ±{float(d['margin']):g}: power {fmt(d['power_equiv'], 2)} "
                      f"(0.8 at {d['seeds_equiv'] or '—'} seeds)")
        console.print(Text(f"  {d['changes'].split('=', 1)[1]}: {d['verdict'].split(' at ', 1)[0]}\n"
                           f"    {float(d['diff']):+.3f} [{fmt(d['ci_low'])}, {fmt(d['ci_high'])}], "
                           f"Holm p {fmt(d['p_holm'], 2)}{power}"))
    path = plot(points, probe, args, folder / "demo.png", seed_values(args.study))
    console.print(Text(f"plot: {path}; every column: {folder / 'results.md'}"))


def seed_values(study: str) -> dict[str, list[float]]:
    """Each grid point's value per seed, from the study's journal ({} where it cannot be read)."""
    from atlas_lab.sweep.report import result_rows
    from atlas_lab.sweep.spec import default_storage
    from atlas_lab.sweep.study import load_existing

    try:
        columns, rows = result_rows(load_existing(default_storage(study), study))
    except Exception:  # the plot is drawn without them
        return {}
    return {r[AXIS]: list(r["values"].values()) for r in rows if AXIS in columns}


def plot(points: list[dict], probe: dict, args, path: Path, seeds: dict[str, list[float]]) -> Path:
    """Accuracy against floats per head (log 2): per rule the probe's line and the trained means with their 95 %
    intervals and each seed's value, chance and 1/N dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    rules = list(dict.fromkeys(rule(r[AXIS]) for r in points))
    for name, color in zip(rules, ("tab:blue", "tab:orange", "tab:green", "tab:purple")):
        line = sorted((int(r["state_floats"]), float(r["retrieval_acc"])) for (c, _), r in probe.items() if c == name)
        if line:
            ax.plot(*zip(*line), color=color, linestyle="--", marker="x",
                    label=f"{name}: probe, N = {args.n_pairs} random pairs")
        mine = sorted(((head_dim(r[AXIS]) ** 2, r) for r in points if rule(r[AXIS]) == name and r["mean"]),
                      key=lambda x: x[0])
        xs = [x * (1.06 if rules.index(name) else 0.94) for x, _ in mine]
        ys = [float(r["mean"]) for _, r in mine]
        err = [[y - float(r["ci_low"] or y) for y, (_, r) in zip(ys, mine)],
               [float(r["ci_high"] or y) - y for y, (_, r) in zip(ys, mine)]]
        ax.errorbar(xs, ys, yerr=err, color=color, fmt="o", capsize=3, label=f"{name}: trained (mean, 95% CI)")
        dots = [(x * 1.04, v) for x, (_, r) in zip(xs, mine) for v in seeds.get(r[AXIS], [])]
        if dots:
            ax.scatter(*zip(*dots), color=color, s=9, alpha=0.5, label=f"{name}: trained, each seed")
    ax.axhline(args.chance, color="tab:red", linestyle=":", linewidth=1, label=f"chance ({args.chance:.4g})")
    ax.axhline(1 / args.n_pairs, color="tab:purple", linestyle=":", linewidth=1,
               label=f"1/N plateau ({1 / args.n_pairs:.4g})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("state floats per memory head (head dim²)")
    ax.set_ylabel("recall accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
