"""The generated blocks of a results document: every number in docs/results.md (and each sweep file's cost line) is
written by ``atlas-lab results-doc`` from the committed journals, never by hand.

A block opens with a marker naming what it holds and closes with an end marker; the command rewrites what lies
between them and nothing else. In markdown::

    <!-- generated: table6-components differences sweep=sweeps/table6_components.yaml -->
    ...
    <!-- end generated -->

and in a YAML file the same markers as comments (``# generated: ...`` / ``# end generated``), every generated line
a comment. The first word is a study (its journal: ``<journals>/<study>.journal``) or ``capacity``; the second the
kind of block; ``key=value`` words follow:

    points        per point: n, mean, std, the 95 % t interval, failed / pruned / unfinished trials
    seeds         per point its value at each seed, and the escapes beyond the study's threshold
    differences   the paired differences to the baseline with their intervals, p-values and verdict marks
    verdicts      each comparison's verdict, naming the metric and the study's setting
    power         each comparison's power and the seeds a resolving design needs (``power=DELTA`` or a margin)
    tuned         a tuned study's choices and every candidate's pilot median
    cost          trial-hours, wall time, minutes per trial and the designs that resolve the open comparisons
    cost-line     the same totals in one line (a sweep file's header)
    answers       one row per comparison: difference [95 % interval], Holm p, power, seeds and verdict
    curves        each trial's metric at every validation (``trials=finished`` keeps complete and running ones)
    capacity      ``capacity FILE.csv capacity``: retrieval accuracy per combination and head dim, one column per N
    capacity-growth  ``capacity FILE.csv capacity-growth``: where recall does not grow with the head dim
    journals cost ``journals cost``: every committed journal's trials and trial-hours, and their sum

``sweep=FILE`` words a study's verdicts with that sweep file's setting, claims, escape and margin
(``report.sweep_wording``); ``power=DELTA`` sizes the power and cost blocks; ``journal=FILE`` reads another journal.
"""
from __future__ import annotations

import csv
import functools
import re
import shlex
from pathlib import Path

from . import report as rp
from .spec import SweepError

OPEN = {".md": re.compile(r"^<!-- generated: (.+?) -->$"), ".yaml": re.compile(r"^# generated: (.+)$")}
CLOSE = {".md": "<!-- end generated -->", ".yaml": "# end generated"}
JOURNALS = Path("docs/results")


@functools.lru_cache(maxsize=None)
def _study(name: str, journal: str):
    from .study import load_existing

    return load_existing(journal, name)


@functools.lru_cache(maxsize=None)
def _analysed(name: str, journal: str, sweep: str | None, power: float | None):
    """(study, attrs, columns, rows, diffs, tuned) of a committed journal, worded by ``sweep``."""
    study = _study(name, journal)
    attrs = dict(study.user_attrs) | (rp.sweep_wording(study, sweep) if sweep else {})
    columns, rows = rp.result_rows(study)
    diffs = rp.differences(study, columns, rows, power, attrs)
    return study, attrs, columns, rows, diffs, rp.tuned_rows(study, columns, rows)


def _options(words: list[str], where: str) -> dict:
    out = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in ("sweep", "power", "journal", "trials"):
            raise SweepError(f"{where}: {word!r}: expected sweep=FILE, power=DELTA, journal=FILE or trials=finished")
        out[key] = value
    return out


def block(spec: str, where: str = "block") -> list[str]:
    """The lines of one generated block, from its marker's words (``STUDY KIND key=value ...``)."""
    words = shlex.split(spec)
    if len(words) < 2:
        raise SweepError(f"{where}: {spec!r}: expected 'STUDY KIND [key=value ...]'")
    if words[0] == "capacity":
        return _capacity(words[1], words[2] if len(words) > 2 else "capacity", where)
    if words[:2] == ["journals", "cost"]:
        return _every_cost()
    name, kind, options = words[0], words[1], _options(words[2:], where)
    journal = options.get("journal") or str(JOURNALS / f"{name}.journal")
    if not Path(journal).is_file():
        raise SweepError(f"{where}: journal {journal} not found (study {name!r})")
    power = float(options["power"]) if "power" in options else None
    study, attrs, columns, rows, diffs, tuned = _analysed(name, journal, options.get("sweep"), power)
    metric, escape = attrs.get("metric", "value"), attrs.get("escape")
    maximize = attrs.get("direction", "maximize") == "maximize"
    margin = diffs[0]["margin"] if diffs else None
    if kind == "points":
        return rp._markdown(columns + ["n", "mean", "std", "95% CI", "failed / pruned / unfinished"],
                            [[r[k] for k in columns] + rp._point_cells(r)[:4]
                             + [f"{r['failed']} / {r['pruned']} / {r['unfinished']}"] for r in rows])
    if kind == "seeds":
        repeats, header = rp._seed_header(rows, escape)
        return rp._markdown(columns + header, [[r[k] for k in columns] + rp._seed_cells(r, repeats, escape, maximize)
                                               for r in rows])
    if kind == "differences":
        return rp._markdown(rp._diff_header("p_rank" in diffs[0], margin), [rp._diff_cells(d) for d in diffs])
    if kind == "verdicts":
        return rp._markdown(rp.VERDICT_HEADER, [[d["changes"], metric, rp.verdict(d, attrs)] for d in diffs])
    if kind in ("power", "cost", "answers") and power is None:
        if margin is None:
            raise SweepError(f"{where}: a {kind} block needs power=DELTA (study {name!r} declares no margin)")
        power = margin
        study, attrs, columns, rows, diffs, tuned = _analysed(name, journal, options.get("sweep"), power)
    if kind == "power":
        return rp._markdown(rp._power_header(power, margin), [rp._power_cells(d) for d in diffs])
    if kind == "tuned":
        return rp._markdown(columns + rp.TUNED_HEADER, [[t[k] for k in columns] + [rp._chosen(t), t["candidates"]]
                                                        for t in tuned])
    if kind == "cost":
        return rp.cost_lines(rp.study_cost(study, columns, rows, diffs), columns, power, attrs.get("margin"))
    if kind == "cost-line":
        cost = rp.study_cost(study, columns, rows, diffs)
        return [f"measured (atlas-lab report {name} --cost, from its journal): {cost['trials']} trials, "
                f"{cost['trial_hours']:.2f} trial-hours, {cost['busy_hours']:.2f} h with a trial running"]
    if kind == "answers":  # with a margin, the equivalence test's Holm p and the seeds it needs beside the t test's
        equiv = margin is not None
        header = ["comparison", "pairs", "difference [95% CI]", "Holm p"] + ([f"Holm p (TOST ±{margin:g})"]
                                                                            if equiv else [])
        header += [f"power for ±{power:g}", f"seeds for ±{power:g}"] + ([f"seeds for equivalence ±{margin:g}"]
                                                                        if equiv else [])
        return rp._markdown(header + ["verdict"],
                            [[d["changes"], d["pairs"], f"{rp._fmt(d['diff'])} {rp._ci(d)}", rp._fmt(d["p_holm"])]
                             + [rp._fmt(d["p_equiv_holm"])] * equiv + [rp._fmt(d["power"]), d["seeds"] or "—"]
                             + [d["seeds_equiv"] or "—"] * equiv + [rp.verdict(d, attrs)] for d in diffs])
    if kind == "curves":  # the validations themselves, not their summary
        return _curves(study, columns, options.get("trials"), re.sub(r"\.(best|final|mean|steps_to_.+)$", "", metric))
    raise SweepError(f"{where}: unknown block kind {kind!r}; valid choices: points, seeds, differences, verdicts, "
                     "power, tuned, cost, cost-line, answers, curves, capacity, capacity-growth")


def _every_cost() -> list[str]:
    """Each committed journal's trials and trial-hours, and their sum."""
    rows, total = [], 0.0
    for path in sorted(JOURNALS.glob("*.journal")):
        name = path.stem
        study = _study(name, str(path))
        columns, points = rp.result_rows(study)
        cost = rp.study_cost(study, columns, points, [])
        total += cost["trial_hours"]
        rows.append([name, cost["trials"], f"{cost['trial_hours']:.2f}", f"{cost['busy_hours']:.2f}"])
    return rp._markdown(["study", "trials", "trial-hours", "hours with a trial running"], rows) + \
        ["", f"all committed journals: {total:.2f} trial-hours"]


def _curves(study, columns: list[str], which: str | None, metric: str) -> list[str]:
    """Each reported trial's metric at every validation (its reported intermediate values, in order)."""
    from optuna.trial import TrialState

    from .study import is_tune

    trials = [t for t in study.get_trials(deepcopy=False) if not is_tune(t) and t.intermediate_values
              and (which != "finished" or t.state in (TrialState.COMPLETE, TrialState.RUNNING))]
    width = max((len(t.intermediate_values) for t in trials), default=0)
    return rp._markdown(columns + ["seed", "state"] + [f"{metric} @ {i + 1}" for i in range(width)],
                        [[t.user_attrs.get("labels", {}).get(k) for k in columns]
                         + [t.user_attrs.get("repeat", 0), t.state.name.lower()]
                         + [f"{t.intermediate_values[i]:.3f}" if i in t.intermediate_values else "—"
                            for i in range(width)] for t in trials])


def _capacity(path: str, kind: str, where: str) -> list[str]:
    """A capacity table (the rows ``atlas-lab capacity`` wrote) as one row per combination and head dim, or the
    places where a combination's recall does not grow with its head dim."""
    if not Path(path).is_file():
        raise SweepError(f"{where}: capacity table {path} not found")
    rows = list(csv.DictReader(Path(path).open()))
    ns = sorted({int(r["n_pairs"]) for r in rows})
    table: dict[tuple, dict[int, float]] = {}
    for r in rows:
        table.setdefault((r["combination"], int(r["head_dim"]), int(r["state_floats"])), {})[int(r["n_pairs"])] = \
            float(r["retrieval_acc"])
    if kind == "capacity":
        return rp._markdown(["combination", "head dim", "state floats"] + [f"N={n}" for n in ns],
                            [list(key) + [f"{acc[n]:.3f}" if n in acc else "—" for n in ns]
                             for key, acc in table.items()])
    if kind == "capacity-growth":
        out = []
        for name in dict.fromkeys(k[0] for k in table):
            dims = sorted((k[1], acc) for k, acc in table.items() if k[0] == name)
            for n in ns:
                for (d_a, a), (d_b, b) in zip(dims, dims[1:]):
                    if n in a and n in b and b[n] <= a[n]:
                        out.append(f"- {name}, N = {n}: head dim {d_b} recalls {b[n]:.3f}, head dim {d_a} "
                                   f"{a[n]:.3f}")
        return out or ["- every combination recalls more at every N as its head dim grows"]
    raise SweepError(f"{where}: unknown capacity block kind {kind!r}; valid choices: capacity, capacity-growth")


def regenerate(path: Path) -> str:
    """``path``'s text with every generated block written again (SweepError on a malformed or unknown block)."""
    suffix = ".yaml" if path.suffix in (".yaml", ".yml") else ".md"
    opening, closing = OPEN[suffix], CLOSE[suffix]
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        found = opening.match(lines[i])
        i += 1
        if not found:
            continue
        end = next((j for j in range(i, len(lines)) if lines[j] == closing), None)
        if end is None:
            raise SweepError(f"{path}:{i}: generated block without its end marker {closing!r}")
        body = block(found.group(1), f"{path}:{i}")
        out += [f"# {x}".rstrip() for x in body] if suffix == ".yaml" else body
        out.append(closing)
        i = end + 1
    return "\n".join(out) + "\n"


def write_docs(paths: list[str | Path], check: bool = False) -> list[Path]:
    """Regenerate every block of each file; write the ones that changed (``check``: write nothing). Returns the
    files whose blocks differed from what is written there."""
    changed = []
    for path in map(Path, paths):
        if not path.is_file():
            raise SweepError(f"{path}: not found")
        text = regenerate(path)
        if text != path.read_text():
            changed.append(path)
            if not check:
                path.write_text(text)
    return changed


def numbers_outside_blocks(text: str) -> list[str]:
    """The lines of a results document that state a number outside its generated blocks, quoted passages (between
    ``<!-- quoted -->`` and ``<!-- end quoted -->``: the paper's own figures), code and links; a reference (Table 6,
    Fig. 5, §5) and the 1/N plateau's name are words, not numbers."""
    out, inside = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if inside:
            inside = None if line == inside else inside
            continue
        if OPEN[".md"].match(line):
            inside = CLOSE[".md"]
            continue
        if line == "<!-- quoted -->":
            inside = "<!-- end quoted -->"
            continue
        if line.startswith("```"):
            inside = "```"
            continue
        plain = re.sub(r"`[^`]*`|\]\([^)]*\)|(\bTable|\bFig\.|\bFigure|§)\s?\d+|\b1/N\b", "", line)
        if re.search(r"\d", plain):
            out.append(f"{n}: {line}")
    return out
