"""Study summaries: per-point statistics, paired differences to the baseline, the ablation plot, importances.

A grid point's repeats (seeds) give n values v_1..v_n: the row shows n, their mean, the sample standard deviation
s and the 95 % confidence interval of the mean, mean ± t_{0.975, n-1} · s / √n (Student's t; none for n = 1).
Repeat r of every point sees the same data and initialisation seed, so a point is compared with the sweep's
``baseline`` point seed by seed: d_r = v_r(point) − v_r(baseline) over the repeats both completed, with the same
interval on the d_r, beside the percentile bootstrap interval (exact over every resample at up to 6 pairs), the
paired t test's p, the exact sign-flip permutation test's p with the least it can reach at that n (2/2ⁿ), and the t
p adjusted by Holm's method across the study's comparisons; a comparison is resolved ("*") where that adjusted p is
below 0.05 on at least 3 pairs (fewer: "too few seeds"; no spread: no t p, never resolved). Each verdict names the
study's setting and metric, and says "agrees / disagrees with the paper" only where the sweep file declares the
paper's setting (``paper_setting``); a proxy study's verdict is "same / opposite ordering at <setting>; does not
test <claim>" (``verdict``). A study of steps to a threshold (``summary: {steps_to: x}``), or with an ``escape``
threshold, counts each point's escapes (seeds beyond it) and compares them with Fisher's exact test; a steps_to
study's steps, censored where x was never reached, go to Gehan's rank test, whose p is the one Holm adjusts. A tuned
study's chosen settings and every candidate's pilot median and range are a table of their own. ``power`` adds each
seed's value and, per comparison, the power of the paired t test at its pairs against a difference of that size, at
its observed spread and the level Holm's method holds it to (α/(m − i + 1) at p-rank i of m), and the seeds that
give power 0.8 there. Values are rounded once, from the stored values, to DIGITS decimals.
Failed, pruned and unfinished trials are counted in their own columns and never averaged in.
"""
from __future__ import annotations

import csv
import json
import math
import re
import statistics
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.text import Text

from ..tables import print_table
from . import statistics as stats_
from .spec import short_names
from .study import is_superseded, is_tune, tuned_setting
from .tracking import browse_hint

LEVEL = 0.95
DIGITS = 4  # decimals of a value as shown: the tables, each trial's line, the parent run's metrics


def interval(values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """n, mean, std and the 95 % t interval of the mean of ``values``, cut to the metric's ``bounds`` where every
    value lies within them (std and interval None below two values)."""
    n = len(values)
    out = {"n": n, "mean": statistics.fmean(values) if n else None, "std": None, "low": None, "high": None}
    if n > 1:
        from scipy.stats import t

        out["std"] = statistics.stdev(values)
        half = float(t.ppf(0.5 + LEVEL / 2, n - 1)) * out["std"] / math.sqrt(n)
        out["low"], out["high"] = out["mean"] - half, out["mean"] + half
        if all(bounds[0] <= v <= bounds[1] for v in values):
            out["low"], out["high"] = max(bounds[0], out["low"]), min(bounds[1], out["high"])
    return out


def _repeat_values(t) -> dict[int, tuple[float, bool]]:
    """{repeat: (value, censored)} of a complete trial: a grid trial is one repeat; a search trial keeps each
    repeat's value. Censored: a steps_to value whose threshold was never reached."""
    if t.state != TrialState.COMPLETE:
        return {}
    values = t.user_attrs.get("repeat_values", [t.value])
    censored = t.user_attrs.get("censored", [False] * len(values))
    repeats = range(len(values)) if "repeat_values" in t.user_attrs else [t.user_attrs.get("repeat", 0)]
    return {r: (v, c) for r, v, c in zip(repeats, values, censored)}


def _counts(ts) -> dict:
    live = {TrialState.RUNNING, TrialState.WAITING}
    return {"failed": sum(t.state == TrialState.FAIL for t in ts),
            "pruned": sum(t.state == TrialState.PRUNED for t in ts), "unfinished": sum(t.state in live for t in ts),
            "reason": "; ".join(t.user_attrs["fail_reason"] for t in ts if "fail_reason" in t.user_attrs)}


def result_rows(study: optuna.Study) -> tuple[list[str], list[dict]]:
    """(parameter columns, rows) best first: one row per grid point (its repeats) or per search trial, with
    ``values`` ({repeat: value}), the ``interval`` statistics and the failed / pruned / unfinished counts."""
    attrs = study.user_attrs
    maximize = attrs.get("direction", study.direction.name.lower()) == "maximize"
    bounds = stats_.metric_bounds(attrs.get("metric", ""))
    trials = [t for t in study.get_trials(deepcopy=False) if not is_superseded(study, t) and not is_tune(t)]
    if attrs.get("sampler", "grid") == "grid":
        columns = list(attrs.get("grid_keys", []))
        groups: dict[tuple, list] = {}
        for t in trials:
            labels = t.user_attrs.get("labels", {})
            groups.setdefault(tuple(labels.get(k) for k in columns), []).append(t)
    else:
        columns = sorted({k for t in trials for k in t.params})
        groups = {(t.number,): [t] for t in trials}
    rows = []
    for key, ts in groups.items():
        found = {r: vc for t in ts for r, vc in _repeat_values(t).items()}
        values = {r: v for r, (v, _) in found.items()}
        labels = dict(zip(columns, key)) if attrs.get("sampler", "grid") == "grid" else \
            {k: ts[0].params.get(k) for k in columns}
        rows.append(labels | {"values": values, "censored": {r: c for r, (_, c) in found.items()},
                              "escaped": sum(not c for _, c in found.values())} |
                    interval(list(values.values()), bounds) | _counts(ts)
                    | {"trials": " ".join(str(t.number) for t in ts)})
    rows.sort(key=lambda r: (r["mean"] is None, -(r["mean"] or 0) if maximize else (r["mean"] or 0)))
    return columns, rows


def tuned_rows(study: optuna.Study, columns: list[str], rows: list[dict]) -> list[dict]:
    """Per grid point of a tuned study: its labels, the chosen setting ("chosen", None before any candidate
    completed) and every candidate's pilot median, range and seeds, or how many of its pilots diverged
    ("candidates": "lr=0.001: 0.5123 [0.4900, 0.5300] of 3 · lr=0.01: diverged in 2 of 3")."""
    if not study.user_attrs.get("tune_keys"):
        return []
    ran: dict[str, dict[str, dict]] = {}  # per point (its labels as JSON): the settings its reported trials ran at
    for t in study.get_trials(deepcopy=False):
        if not is_tune(t) and "tuned" in t.user_attrs and t.state == TrialState.COMPLETE \
                and not is_superseded(study, t):
            setting = t.user_attrs["tuned"]
            ran.setdefault(json.dumps(t.user_attrs["labels"], sort_keys=True), {})[
                json.dumps(setting, sort_keys=True)] = setting
    out = []
    for r in rows:
        labels = {k: r[k] for k in columns}
        chosen, candidates = tuned_setting(study, labels)
        out.append(labels | {"chosen": chosen, "ran": list(ran.get(json.dumps(labels, sort_keys=True), {}).values()),
                             "candidates": " · ".join(_candidate(c) for c in candidates)})
    return out


def _candidate(c: dict) -> str:
    """One tune candidate as the tuned table shows it: its setting, then the median and range of its pilots'
    summaries over the seeds that completed, or the pilots that diverged."""
    name = " ".join(f"{k.split('.')[-1]}={v}" for k, v in c["tune"].items())
    if c["diverged"]:
        return f"{name}: diverged in {c['diverged']} of {c['pilots']}"
    if c["median"] is None:
        return f"{name}: —"
    spread = f" [{_fmt(c['low'])}, {_fmt(c['high'])}]" if len(c["values"]) > 1 else ""
    return f"{name}: {_fmt(c['median'])}{spread} of {len(c['values'])}"


def _setting(chosen: dict | None) -> str:
    return "—" if chosen is None else " ".join(f"{k}={v}" for k, v in chosen.items())


def _chosen(t: dict) -> str:
    """A tuned row's choice, and the settings its reported trials ran at where those differ from it (no candidate
    stable on every pilot seed: none chosen, the reported trials keep the setting they ran at)."""
    other = [x for x in t["ran"] if x != t["chosen"]]
    if not other:
        return _setting(t["chosen"])
    ran = ", ".join(_setting(x) for x in other)
    return (f"none stable; reported at {ran}" if t["chosen"] is None
            else f"{_setting(t['chosen'])} (reported at {ran})")


def baseline_row(rows: list[dict], columns: list[str], baseline: dict | None) -> dict | None:
    """The row of the baseline point (its labels on every grid axis), or None."""
    return next((r for r in rows if baseline and all(r[k] == baseline.get(k) for k in columns)), None)


def escaped(values: list[float], threshold: float, maximize: bool) -> int:
    """How many of ``values`` lie beyond ``threshold`` in the metric's direction (left the plateau)."""
    return sum(v > threshold if maximize else v < threshold for v in values)


def differences(study: optuna.Study, columns: list[str], rows: list[dict], power: float | None = None,
                attrs: dict | None = None) -> list[dict]:
    """Every other grid point against the study's ``baseline`` point, paired by repeat: the axes it changes, the
    number of pairs, the mean paired difference (point − baseline), its 95 % t interval (``excludes_0`` where it lies
    on one side of 0) and bootstrap interval (``boot_exact``, ``boot_mc``: its Monte-Carlo error), the t and sign-flip
    p and the least sign-flip p its pairs allow (``p_flip_min``), the Holm-adjusted p across the comparisons
    (``resolved`` below 0.05 on at least ``MIN_PAIRS`` pairs; ``too_few`` below), its Holm rank and level, ``better``
    when the difference goes the metric's way, the escapes beyond the study's threshold with Fisher's p, and with
    ``power`` the power at the pairs and Holm level (``power``) and the seeds that resolve a difference of that size
    there (``seeds``). ``attrs``: the study's attributes, where not its own (``sweep_wording``). [] without a
    baseline."""
    attrs = study.user_attrs if attrs is None else attrs
    base = baseline_row(rows, columns, attrs.get("baseline"))
    if base is None:
        return []
    maximize = attrs.get("direction", "maximize") == "maximize"
    steps_to = attrs.get("summary") == "steps_to"
    escape, margin = attrs.get("escape"), attrs.get("margin")
    bounds = stats_.difference_bounds(stats_.metric_bounds(attrs.get("metric", "")))
    out = []
    for r in rows:
        if r is base:
            continue
        pairs = sorted(set(r["values"]) & set(base["values"]))
        d = [r["values"][p] - base["values"][p] for p in pairs]
        error = stats_.rounding([r["values"][p] for p in pairs], [base["values"][p] for p in pairs])
        runs = [[(x["values"][p], x["censored"][p]) for p in pairs] for x in (r, base)]
        stats = interval(d, bounds)
        excludes = stats["low"] is not None and (stats["low"] > 0 or stats["high"] < 0)
        boot = stats_.bootstrap_interval(d)
        out.append({k: r[k] for k in columns} | {
            "changes": ", ".join(f"{name}={r[k]}" for k, name in zip(columns, short_names(columns))
                                 if r[k] != base[k]),
            "changed": [str(r[k]) for k in columns if r[k] != base[k]],
            "pairs": stats["n"], "diff": stats["mean"], "std": stats["std"], "low": stats["low"],
            "high": stats["high"], "excludes_0": excludes, "boot_low": boot and boot.low,
            "boot_high": boot and boot.high, "boot_exact": boot and boot.exact, "boot_mc": boot and boot.mc_error,
            "p": stats_.paired_t_p(d, error), "p_flip": stats_.sign_flip_p(d),
            "p_flip_min": stats_.min_sign_flip_p(len(d)), "margin": None if steps_to else margin,
            "p_equiv": None if margin is None or steps_to else stats_.equivalence_p(d, margin, error),
            "too_few": 0 < len(d) < stats_.MIN_PAIRS, "no_spread": len(d) > 1 and stats_.no_spread(d, error),
            "escaped": None, "p_fisher": None,
            "better": None if stats["mean"] is None else (stats["mean"] > 0) == maximize and stats["mean"] != 0})
        if steps_to:  # escapes and censored steps: the rank test decides, and says which way
            counts = [sum(not c for _, c in x) for x in runs]
            u = stats_.gehan_u(*runs) if runs[0] else 0
            out[-1] |= {"p_rank": stats_.gehan_p(*runs), "better": u > 0 if u else None}
        elif escape is not None:
            counts = [escaped([v for v, _ in x], escape, maximize) for x in runs]
        if (steps_to or escape is not None) and pairs:
            out[-1] |= {"escaped": f"{counts[0]}/{len(pairs)} vs {counts[1]}/{len(pairs)}",
                        "p_fisher": stats_.fisher_p(counts[0], len(pairs), counts[1], len(pairs))}
    # Holm's family: every comparison with a p; one without (no spread, one pair) is left out, as if absent
    tested = [d["p_rank" if steps_to else "p"] for d in out]
    m = sum(stats_.holm_ranks(tested)[i] is not None for i in range(len(out)))
    equiv = [d["p_equiv"] for d in out]  # the equivalence tests: a family of their own
    m_equiv = sum(r is not None for r in stats_.holm_ranks(equiv))
    for d, adjusted, rank, adjusted_eq, rank_eq in zip(out, stats_.holm(tested), stats_.holm_ranks(tested),
                                                       stats_.holm(equiv), stats_.holm_ranks(equiv)):
        level = stats_.holm_level(rank, m) if rank else None
        level_eq = stats_.holm_level(rank_eq, m_equiv) if rank_eq else None
        d |= {"p_holm": adjusted, "holm_rank": rank, "holm_m": m, "holm_level": level,
              "resolved": adjusted is not None and adjusted < stats_.ALPHA and not d["too_few"],
              "p_equiv_holm": adjusted_eq, "equiv_rank": rank_eq, "equiv_m": m_equiv, "equiv_level": level_eq,
              "equivalent": adjusted_eq is not None and adjusted_eq < stats_.ALPHA and not d["too_few"]}
        spread = None if d["no_spread"] else d["std"]  # identical differences size no design
        if power:
            d |= {"power": stats_.paired_power(d["pairs"], power, spread, level or stats_.ALPHA),
                  "seeds": stats_.seeds_for_power(power, spread, level or stats_.ALPHA)}
        else:
            d |= {"power": None, "seeds": None}
        if power and margin is not None and not steps_to:  # the design for the other outcome: equal points
            d |= {"power_equiv": stats_.equivalence_power(d["pairs"], margin, spread, level_eq or stats_.ALPHA),
                  "seeds_equiv": stats_.seeds_for_equivalence(margin, spread, level_eq or stats_.ALPHA)}
        else:
            d |= {"power_equiv": None, "seeds_equiv": None}
    out.sort(key=lambda d: (d["changes"].count(",") if d["changes"] else -1, d["diff"] is None,
                            -(d["diff"] or 0) if maximize else (d["diff"] or 0)))
    return out


def verdict(d: dict, attrs: dict) -> str:
    """A comparison's verdict in words that name its setting: "better" / "worse" (its Holm-adjusted p below α),
    "equivalent within ±margin" (the sweep's ``margin``: its two one-sided tests, Holm-adjusted, below α), "not
    resolved", "no value" (no test's p: the differences are one value up to the metric's storage precision) or
    "too few seeds" (below ``MIN_PAIRS`` pairs). "agrees / disagrees with the paper" only where the study runs the
    paper's task, scale and metric (``paper_setting``); elsewhere "same / opposite ordering at <setting>; does not
    test <claim>" (``claims``: the paper's claim about the point and the side it puts it on)."""
    setting = attrs.get("setting") or "this study's setting (none declared)"
    claims = attrs.get("claims") or {}
    claim = claims.get(d["changed"][0]) if len(d["changed"]) == 1 else None
    untested = f"; does not test {claim['claim']}" if claim and not attrs.get("paper_setting") else ""
    margin = d.get("margin")
    if not d["pairs"]:
        return "—"
    if d["too_few"]:
        return f"too few seeds: {d['pairs']} pair(s), a verdict needs {stats_.MIN_PAIRS}"
    if d["p_holm"] is None and d.get("p_equiv_holm") is None:
        return (f"no value: the differences are one value up to the metric's storage precision (no t test) at "
                f"{setting}{untested}")
    within = f"equivalent within ±{margin:g}" if d.get("equivalent") else None
    if not d["resolved"] or d["better"] is None:
        if within is None:
            return f"not resolved at {setting}{untested}"
        if claim and attrs.get("paper_setting"):
            return f"disagrees with the paper ({within}) at {setting}: {claim['claim']}"
        return f"{within} at {setting}{untested}"
    side = "better" if d["better"] else "worse"
    side += f", by less than the margin ({within})" if within else ""
    if claim is None:
        return f"{side} at {setting}"
    same = side.split(",")[0] == claim["paper"]
    if attrs.get("paper_setting"):
        return f"{'agrees' if same else 'disagrees'} with the paper ({side}) at {setting}: {claim['claim']}"
    return f"{'same' if same else 'opposite'} ordering ({side}) at {setting}; does not test {claim['claim']}"


def _fmt(v):
    if v is None:
        return "—"
    if not isinstance(v, float):
        return str(v)
    text = f"{v:.{DIGITS}f}"
    return text[1:] if text.startswith("-") and text.strip("-0.") == "" else text  # zero, rounded, has no sign


def _ci(r) -> str:
    return "—" if r["low"] is None else f"[{_fmt(r['low'])}, {_fmt(r['high'])}]"


def _verdict(d) -> str:
    if not d["pairs"]:
        return "—"
    if d["too_few"]:
        return "too few seeds"
    if d["p_holm"] is None and d.get("p_equiv_holm") is None:
        return "no value"
    if d["resolved"] and d["better"] is not None:
        return ("* better" if d["better"] else "* worse") + (" (equivalent)" if d.get("equivalent") else "")
    return f"* equivalent ±{d['margin']:g}" if d.get("equivalent") else "not resolved"


def _boot(d) -> str:
    if d["boot_low"] is None:
        return "—"
    return f"[{_fmt(d['boot_low'])}, {_fmt(d['boot_high'])}]" + ("" if d["boot_exact"] else f" ±{d['boot_mc']:.1g}")


def _boot_words(diffs: list[dict]) -> str:
    """How the bootstrap intervals were found: every resample, or random draws with a Monte-Carlo error."""
    exact = {d["boot_exact"] for d in diffs if d["boot_low"] is not None}
    words = []
    if True in exact:
        words.append("exact over every nⁿ resample of the pairs")
    if False in exact:
        words.append(f"over {stats_.DRAWS:,} random resamples, ± the Monte-Carlo standard error of its ends")
    return " and ".join(words) or "none"


POINT_HEADER = ["n", "mean", "std", "95% CI", "failed", "pruned", "unfinished", "trials", "reason"]
DIFF_HEADER = ["changes", "pairs", "mean diff", "std", "95% CI", "bootstrap 95%", "p (t)", "p (sign flip)",
               "least p (flip)", "Holm p", "verdict"]
DIFF_COLUMNS = ["changes", "pairs", "diff", "std", "low", "high", "boot_low", "boot_high", "boot_exact", "boot_mc",
                "p", "p_flip", "p_flip_min", "p_holm", "holm_rank", "holm_level", "resolved", "too_few", "excludes_0",
                "better", "margin", "p_equiv", "p_equiv_holm", "equiv_level", "equivalent", "power", "seeds",
                "power_equiv", "seeds_equiv", "escaped", "p_fisher", "p_rank", "verdict"]
TUNED_HEADER = ["chosen", "candidates (pilot median [range] of seeds)"]
STEPS_HEADER = ["escaped", "p (Fisher)", "p (Gehan)"]  # a steps_to study's columns, before "Holm p"
EQUIV_HEADER = ["p (TOST)", "Holm p (TOST)"]  # with a margin: the equivalence tests, after "Holm p"
VERDICT_HEADER = ["comparison", "metric", "verdict"]
POWER_HEADER = ["changes", "pairs", "std", "Holm level", "power", "escaped", "p (Fisher)"]


# the terminal's point table: the three counts share a column ("0 / 1 / 0"), so that two grid axes fit 80 columns
SHOWN_POINT_HEADER = POINT_HEADER[:4] + [" / ".join(POINT_HEADER[4:7])]


def _shown_point_cells(r) -> list:
    return _point_cells(r)[:4] + [" / ".join(str(r[k]) for k in ("failed", "pruned", "unfinished"))]


def _point_cells(r) -> list:
    return [r["n"], _fmt(r["mean"]), _fmt(r["std"]), _ci(r), r["failed"], r["pruned"], r["unfinished"], r["trials"],
            r["reason"]]


def _diff_cells(d) -> list:
    cells = [d["changes"], d["pairs"], _fmt(d["diff"]), _fmt(d["std"]), _ci(d), _boot(d), _fmt(d["p"]),
             _fmt(d["p_flip"]), _fmt(d["p_flip_min"])]
    if "p_rank" in d:
        cells += [d["escaped"] or "—", _fmt(d["p_fisher"]), _fmt(d["p_rank"])]
    cells.append(_fmt(d["p_holm"]))
    if d.get("margin") is not None and "p_rank" not in d:
        cells += [_fmt(d["p_equiv"]), _fmt(d["p_equiv_holm"])]
    return cells + [_verdict(d)]


def _diff_header(steps_to: bool = False, margin: float | None = None) -> list[str]:
    equiv = [f"{h.split(' (')[0]} (TOST ±{margin:g})" for h in EQUIV_HEADER] if margin is not None and not steps_to \
        else []
    return DIFF_HEADER[:-2] + STEPS_HEADER * steps_to + DIFF_HEADER[-2:-1] + equiv + DIFF_HEADER[-1:]


def _power_header(power: float, margin: float | None = None) -> list[str]:
    equiv = ["Holm level (TOST)", "power (equal points)", f"seeds for equivalence ±{margin:g}"] if margin is not None \
        else []
    return POWER_HEADER[:5] + [f"seeds for ±{power:g}"] + equiv + POWER_HEADER[5:]


def _power_cells(d) -> list:
    level = "—" if d["holm_level"] is None else f"{d['holm_level']:.4g} ({d['holm_rank']} of {d['holm_m']})"
    equiv = []
    if d.get("margin") is not None and "p_rank" not in d:
        equiv = ["—" if d["equiv_level"] is None else f"{d['equiv_level']:.4g} ({d['equiv_rank']} of {d['equiv_m']})",
                 _fmt(d["power_equiv"]), d["seeds_equiv"] or "—"]
    return [d["changes"], d["pairs"], _fmt(d["std"]), level, _fmt(d["power"]), d["seeds"] or "—"] + equiv + \
        [d["escaped"] or "—", _fmt(d["p_fisher"])]


def _seed_header(rows: list[dict], escape: float | None) -> tuple[list[int], list[str]]:
    repeats = sorted({r for row in rows for r in row["values"]})
    return repeats, [f"seed {r}" for r in repeats] + (["escaped"] if escape is not None else [])


def _seed_cells(row: dict, repeats: list[int], escape: float | None, maximize: bool) -> list:
    """A point's value per seed (a censored steps_to value with '+': at least that), and its escapes."""
    cells = ["—" if r not in row["values"] else _fmt(row["values"][r]) + ("+" if row["censored"].get(r) else "")
             for r in repeats]
    if escape is not None:
        cells.append(f"{escaped(list(row['values'].values()), escape, maximize)}/{row['n']}")
    return cells


def _test_words(diffs: list[dict]) -> str:
    """Which test's p Holm adjusts: the paired t, or for steps to a threshold Gehan's rank test."""
    return "Gehan rank test's p (steps to the threshold, censored where never reached)" if "p_rank" in diffs[0] \
        else "t p"


def _equiv_words(diffs: list[dict]) -> str:
    """How an equivalence is resolved, where the study declares a margin ("" otherwise)."""
    margin = diffs[0]["margin"]
    if margin is None:
        return ""
    return (f"; * equivalent where the two one-sided t tests (TOST) that the difference is beyond ±{margin:g} "
            f"(the study's margin), their p adjusted by Holm's method across the {diffs[0]['equiv_m']} comparisons "
            f"with one, are below {stats_.ALPHA:g}")


def _power_words(power: float, escape: float | None, steps_to: bool, metric: str, margin: float | None = None) -> str:
    threshold = "its threshold" if steps_to else f"{metric} {escape:g}" if escape is not None else None
    return (f"power of the paired t test at each comparison's pairs against a difference of ±{power:g}, at its "
            f"observed std and the level Holm's method holds it to (α/(m − i + 1) at p-rank i of m), and the seeds "
            f"that give power {stats_.POWER:g} there"
            + (f"; for equal points, the power of the TOST to show equivalence within ±{margin:g} at its own Holm "
               f"level and the seeds that give {stats_.POWER:g}" if margin is not None else "")
            + (f"; escapes: the seeds beyond {threshold} (point vs baseline) and Fisher's exact p" if threshold
               else "; no escape threshold: declare one (escape:) in the sweep file"))


def _markdown(header: list[str], cells: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in cells]


def write_tables(columns: list[str], rows: list[dict], diffs: list[dict], metric: str, baseline: dict | None,
                 out: Path, power: float | None = None, tuned: list[dict] = (), marks: dict | None = None,
                 attrs: dict | None = None) -> list[Path]:
    """results.csv, results.md (the points, the differences to the baseline and their verdicts; with ``power`` each
    seed's value and each comparison's power and escapes; the tuned settings), differences.csv and tuned.csv.
    ``attrs``: the study's attributes that word the verdicts (setting, claims, escape, direction)."""
    attrs = attrs or {}
    escape, maximize = attrs.get("escape"), attrs.get("direction", "maximize") == "maximize"
    files = [out / "results.csv", out / "results.md"]
    with files[0].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns + ["n", "mean", "std", "ci_low", "ci_high", "failed", "pruned", "unfinished", "trials",
                              "reason"])
        for r in rows:
            w.writerow([r[k] for k in columns] + [r[k] for k in ("n", "mean", "std", "low", "high", "failed",
                                                                 "pruned", "unfinished", "trials", "reason")])
    lines = [f"{metric}: per point, n complete repeats, mean, std and the 95 % t interval of the mean"
             + "".join(f"; {label}: {value:.4g}" for label, value in (marks or {}).items()), ""]
    lines += _markdown(columns + POINT_HEADER, [[r[k] for k in columns] + _point_cells(r) for r in rows])
    if power and rows:
        repeats, header = _seed_header(rows, escape)
        lines += ["", f"{metric} per seed" + (f"; escaped: the seeds beyond {escape:g}" if escape is not None else ""),
                  ""]
        lines += _markdown(columns + header, [[r[k] for k in columns] + _seed_cells(r, repeats, escape, maximize)
                                              for r in rows])
    if diffs:
        steps_to = "p_rank" in diffs[0]
        files.append(out / "differences.csv")
        with files[-1].open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns + [{"low": "ci_low", "high": "ci_high"}.get(k, k) for k in DIFF_COLUMNS])
            for d in diffs:
                w.writerow([d[k] for k in columns] + [verdict(d, attrs) if k == "verdict" else d.get(k)
                                                      for k in DIFF_COLUMNS])
        where = ", ".join(f"{k}={v}" for k, v in baseline.items())
        lines += ["", f"paired differences to the baseline ({where}), point − baseline, seed by seed: the 95 % t "
                      f"interval and the bootstrap's ({_boot_words(diffs)}), the paired t and sign-flip p and the "
                      f"least sign-flip p the pairs allow (2/2ⁿ)"
                  + ("; the seeds that reached the threshold (point vs baseline) and Fisher's exact p" * steps_to)
                  + f"; * (resolved) where the {_test_words(diffs)} adjusted by Holm's method across these "
                    f"{diffs[0]['holm_m']} comparisons is below {stats_.ALPHA:g}, on at least {stats_.MIN_PAIRS} "
                    f"pairs{_equiv_words(diffs)}", ""]
        lines += _markdown(_diff_header(steps_to, diffs[0]["margin"]), [_diff_cells(d) for d in diffs])
        lines += ["", f"verdicts: {metric}, at the study's setting", ""]
        lines += _markdown(VERDICT_HEADER, [[d["changes"], metric, verdict(d, attrs)] for d in diffs])
        if power:
            lines += ["", _power_words(power, escape, steps_to, metric, diffs[0]["margin"]), ""]
            lines += _markdown(_power_header(power, diffs[0]["margin"]), [_power_cells(d) for d in diffs])
    if tuned:
        files.append(out / "tuned.csv")
        with files[-1].open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns + ["chosen", "reported_at", "candidates"])
            for t in tuned:
                w.writerow([t[k] for k in columns] + [json.dumps(t["chosen"]), json.dumps(t["ran"]), t["candidates"]])
        lines += ["", "tuned settings: per point, the candidate with the best median over its pilot seeds (never a "
                      "reported seed; a candidate that diverged on any is not chosen), and every candidate's median, "
                      "range and complete seeds", ""]
        lines += _markdown(columns + TUNED_HEADER, [[t[k] for k in columns] + [_chosen(t), t["candidates"]]
                                                    for t in tuned])
    files[1].write_text("\n".join(lines) + "\n")
    return files


def trial_end(t):
    """When a trial stopped running, from the journal: a complete trial at its completion; any other at its last
    heartbeat where it has one (a trial lost with its worker is marked failed only when that is noticed, and one
    running when the journal was copied never finishes), else at its completion; None where neither is known. The
    heartbeat is seconds since the epoch, read as UTC, the clock the journal's start and end times were written in
    (Optuna writes the host's local time; the studies' hosts ran in UTC), whatever the reader's time zone."""
    from datetime import datetime, timezone

    if t.state != TrialState.COMPLETE and "heartbeat" in t.user_attrs:
        beat = datetime.fromtimestamp(t.user_attrs["heartbeat"], timezone.utc).replace(tzinfo=None)
        return beat if t.datetime_complete is None else min(beat, t.datetime_complete)
    return t.datetime_complete


def trial_seconds(t) -> float | None:
    """A trial's run time in seconds, from the journal: ``trial_end`` minus its start (None where either is
    missing)."""
    end = trial_end(t)
    if t.datetime_start is None or end is None:
        return None
    return max(0.0, (end - t.datetime_start).total_seconds())


def trial_hours(study: optuna.Study) -> float:
    """A study's measured trial-hours: every trial's run time summed (``trial_seconds``: reported trials, tune pilots,
    superseded, failed, lost and stopped ones): what the study took."""
    return sum(trial_seconds(t) or 0.0 for t in study.get_trials(deepcopy=False)) / 3600


def _busy_seconds(spans: list[tuple]) -> float:
    """The length of the union of (start, end) spans: the time at least one trial ran."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + (b - a).total_seconds(), b
        elif b > end:
            total, end = total + (b - end).total_seconds(), b
    return total


def study_cost(study: optuna.Study, columns: list[str], rows: list[dict], diffs: list[dict]) -> dict:
    """A study's cost from its journal: the trial-hours (every trial's run time summed, ``trial_seconds``: reported
    trials, tune pilots, failed, lost and stopped ones), the wall time from the first start to the last finish and
    the busy time (at least one trial running), each point's mean minutes per complete reported trial (the study's
    own measured rate), and per
    comparison that is neither resolved nor equivalent the hours of the design that would resolve it: the seeds that
    give power 0.8 at its Holm level (``differences`` with ``power``; ``seeds_equiv`` for equivalence within the
    margin), run for the point and for the baseline. "open": every open comparison at once, the baseline run once at
    the most seeds any of them needs."""
    trials = [t for t in study.get_trials(deepcopy=False) if trial_seconds(t) is not None]
    reported = [t for t in trials if not is_superseded(study, t) and not is_tune(t)]
    spans = [(t.datetime_start, trial_end(t)) for t in trials]
    minutes: dict[tuple, float | None] = {}
    for r in rows:
        mine = [trial_seconds(t) for t in reported if t.state == TrialState.COMPLETE
                and tuple(t.user_attrs.get("labels", {}).get(k) for k in columns) == tuple(r[k] for k in columns)]
        minutes[tuple(r[k] for k in columns)] = statistics.fmean(mine) / 60 if mine else None
    base = baseline_row(rows, columns, study.user_attrs.get("baseline"))
    base_minutes = minutes.get(tuple(base[k] for k in columns)) if base else None
    designs = []
    for d in diffs:
        if d["resolved"] or d.get("equivalent") or d["too_few"]:
            continue
        rate = minutes.get(tuple(d[k] for k in columns))
        design = {"changes": d["changes"], "minutes": rate, "seeds": d["seeds"], "seeds_equiv": d.get("seeds_equiv")}
        for key, seeds in (("hours", d["seeds"]), ("hours_equiv", d.get("seeds_equiv"))):
            design[key] = None if seeds is None or rate is None or base_minutes is None else \
                seeds * (rate + base_minutes) / 60
        designs.append(design)
    sized = [x for x in designs if x["seeds"] is not None and x["minutes"] is not None]
    every = None if not sized or base_minutes is None or len(sized) < len(designs) else \
        (max(x["seeds"] for x in sized) * base_minutes + sum(x["seeds"] * x["minutes"] for x in sized)) / 60
    return {"trials": len(trials), "trial_hours": trial_hours(study),
            "reported_trials": len(reported), "reported_hours": sum(trial_seconds(t) for t in reported) / 3600,
            "wall_hours": (max(b for _, b in spans) - min(a for a, _ in spans)).total_seconds() / 3600 if spans
            else 0.0, "busy_hours": _busy_seconds(spans) / 3600,
            "first": min(a for a, _ in spans) if spans else None, "last": max(b for _, b in spans) if spans else None,
            "minutes": minutes, "baseline_minutes": base_minutes, "designs": designs, "open_hours": every}


def cost_lines(cost: dict, columns: list[str], power: float | None, margin: float | None) -> list[str]:
    """The study's cost as markdown: one sentence of totals, the minutes per trial of each point, and the designs
    that would resolve its open comparisons."""
    when = "" if cost["first"] is None else \
        f" ({cost['first']:%Y-%m-%d %H:%M} to {cost['last']:%Y-%m-%d %H:%M})"
    lines = [f"{cost['trials']} trials, {cost['trial_hours']:.2f} trial-hours (their run times summed; "
             f"{cost['reported_trials']} reported trials {cost['reported_hours']:.2f} h, the rest tune pilots and "
             f"superseded, failed, lost or stopped trials); wall time {cost['wall_hours']:.2f} h{when}, of which "
             f"{cost['busy_hours']:.2f} h with a trial running", ""]
    lines += _markdown(columns + ["minutes per reported trial"],
                       [list(key) + [_fmt(m) if m is None else f"{m:.1f}"] for key, m in cost["minutes"].items()])
    if cost["designs"]:
        header = ["open comparison", "minutes per trial (point)", f"seeds for ±{power:g}" if power else "seeds",
                  "hours (point and baseline)"]
        if margin is not None:
            header += [f"seeds for equivalence ±{margin:g}", "hours (equivalence)"]
        cells = []
        for x in cost["designs"]:
            row = [x["changes"], "—" if x["minutes"] is None else f"{x['minutes']:.1f}", x["seeds"] or "—",
                   "—" if x["hours"] is None else f"{x['hours']:.1f}"]
            if margin is not None:
                row += [x["seeds_equiv"] or "—", "—" if x["hours_equiv"] is None else f"{x['hours_equiv']:.1f}"]
            cells.append(row)
        baseline = "—" if cost["baseline_minutes"] is None else f"{cost['baseline_minutes']:.1f}"
        lines += ["", f"the designs that would resolve each open comparison: the seeds that give power "
                      f"{stats_.POWER:g} at its Holm level, each run for the point and for the baseline ({baseline} "
                      f"minutes a trial), at this study's measured minutes per trial", ""]
        lines += _markdown(header, cells)
        if cost["open_hours"] is not None:
            lines += ["", f"every open comparison at once (the baseline run once, at the most seeds any needs): "
                          f"{cost['open_hours']:.1f} trial-hours"]
    return lines


def axis_labels(rows: list[dict], col: str) -> list[str]:
    """A grid axis' labels in plotting order: numeric values ascending (a window, a step count), others as the rows
    list them."""
    values = list(dict.fromkeys(r[col] for r in rows))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        values = sorted(values)
    return [str(v) for v in values]


def ablation_plot(columns: list[str], rows: list[dict], metric: str, path: Path, baseline: dict | None = None,
                  marks: dict[str, float] | None = None, escape: float | None = None) -> Path | None:
    """One panel per grid axis: every point's mean and 95 % interval against that axis' label, one labelled series
    (legend) per combination of the other axes, the value written beside each point, the baseline's mean dashed,
    each of the study's ``marks`` (chance, a plateau) dotted and labelled, and its ``escape`` threshold dash-dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["mean"] is not None]
    if not columns or not done:
        return None
    names = dict(zip(columns, short_names(columns)))
    fig, axes = plt.subplots(1, len(columns), figsize=(5.5 * len(columns), 4.2), squeeze=False)
    base = baseline_row(done, columns, baseline)
    for ax, col in zip(axes[0], columns):
        labels = axis_labels(rows, col)
        others = [k for k in columns if k != col]
        series: dict[str, list] = {}
        for r in done:
            series.setdefault(" ".join(f"{names[k]}={r[k]}" for k in others) or metric, []).append(r)
        width = 0.6 / max(1, len(series))
        for i, (name, rs) in enumerate(series.items()):
            xs = [labels.index(str(r[col])) + (i - (len(series) - 1) / 2) * width for r in rs]
            ys = [r["mean"] for r in rs]
            err = [[r["mean"] - r["low"] if r["low"] is not None else 0 for r in rs],
                   [r["high"] - r["mean"] if r["high"] is not None else 0 for r in rs]]
            ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=name)
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if base is not None:
            ax.axhline(base["mean"], color="grey", linestyle="--", linewidth=1, label="baseline")
        for (label, value), color in zip((marks or {}).items(), ("tab:red", "tab:purple", "tab:brown", "black")):
            ax.axhline(value, color=color, linestyle=":", linewidth=1, label=f"{label} ({value:.4g})")
        if escape is not None:
            ax.axhline(escape, color="tab:green", linestyle="-.", linewidth=1, label=f"escape ({escape:.4g})")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_xlabel(names[col])
        ax.set_ylabel(f"{metric} (mean, 95% CI)")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def point_name(labels: dict, columns: list[str]) -> str:
    """A point as an MLflow metric-name part: its labels joined by spaces, other characters as '_'."""
    return re.sub(r"[^\w.\- :]", "_", " ".join(str(labels[k]) for k in columns))[:200]


def log_summary(client, parent: str, study: optuna.Study, columns: list[str], rows: list[dict], diffs: list[dict],
                tuned: list[dict] = ()) -> None:
    """The parent run's summary, shown in the runs table: params (metric, direction, sampler, the grid axes and
    their labels, repeats), metrics (the best mean; per point its mean, n, paired difference to the baseline and
    its Holm-adjusted p),
    the baseline as a tag. Metrics take the count of complete repeats as their step, so the latest is the newest;
    their values are rounded to the ``DIGITS`` the tables show (a mean of 3 seeds is 0.8533, not 0.85333335)."""
    from mlflow.entities import Metric, Param, RunTag

    attrs = study.user_attrs
    metric = attrs.get("metric", "value")
    done = [r for r in rows if r["mean"] is not None]
    step = sum(r["n"] for r in rows)
    params = {"study.metric": metric, "study.direction": attrs.get("direction", ""),
              "study.sampler": attrs.get("sampler", "")}
    params |= {f"grid.{k}": ", ".join(str(label) for label in labels)
               for k, labels in (attrs.get("grid_labels") or {}).items()}
    existing = client.get_run(parent).data.params
    params = {k: v[:6000] for k, v in params.items() if k not in existing}
    now = int(time.time() * 1000)
    metrics = []
    if done:
        metrics.append(Metric(f"best/{metric}", round(done[0]["mean"], DIGITS), now, step))
    if attrs.get("sampler", "grid") == "grid":
        for r in done:
            metrics.append(Metric(f"mean/{point_name(r, columns)}", round(r["mean"], DIGITS), now, step))
        for d in diffs:
            if d["diff"] is not None:
                metrics.append(Metric(f"diff/{point_name(d, columns)}", round(d["diff"], DIGITS), now, step))
            if d["p_holm"] is not None:
                metrics.append(Metric(f"holm_p/{point_name(d, columns)}", round(d["p_holm"], DIGITS), now, step))
    for t in tuned:
        for key, value in (t["chosen"] or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.append(Metric(f"tuned/{point_name(t, columns)}/{key}", value, now, step))
    tags = [RunTag("atlas_lab.summary", f"{len(done)} point(s) with results, {step} complete repeat(s)")]
    tags += [RunTag(f"atlas_lab.tuned.{point_name(t, columns)}"[:250], _setting(t["chosen"])) for t in tuned]
    if attrs.get("baseline"):
        tags.append(RunTag("atlas_lab.baseline", point_name(attrs["baseline"], columns)))
    for i in range(0, max(len(metrics), 1), 500):
        client.log_batch(parent, metrics=metrics[i:i + 500], params=[Param(k, v) for k, v in params.items()] if i == 0
                         else [], tags=tags if i == 0 else [])


def sweep_wording(study: optuna.Study, path: str | Path) -> dict:
    """The report-only keys (escape, margin, setting, paper_setting, claims, marks) of the sweep file ``path`` for a
    study that does not record them (run before they were declared): the file must name the study and define its trials
    as the study recorded them (grid, fixed values, metric, summary; its tune block may differ). SweepError
    otherwise."""
    from .spec import SweepError, load_sweep
    from .study import definition

    spec = load_sweep(path)
    if spec.study != study.study_name:
        raise SweepError(f"--sweep {path}: defines study {spec.study!r}, not {study.study_name!r}")
    recorded, given = study.user_attrs.get("definition") or {}, definition(spec)
    differ = [k for k in ("metric", "direction", "sampler", "grid", "fixed", "summary")
              if k in recorded and recorded.get(k) != given.get(k)]
    if differ:
        raise SweepError(f"--sweep {path}: its {', '.join(differ)} differ from what study {study.study_name!r} ran; "
                         "expected the file the study ran")
    return {"escape": spec.escape, "margin": spec.margin, "setting": spec.setting, "paper_setting": spec.paper_setting,
            "claims": spec.claims, "marks": spec.marks}


def summarize(study: optuna.Study, client=None, parent: str | None = None, console: Console | None = None,
              out_dir: str | Path | None = None, tracking_uri: str | None = None, power: float | None = None,
              sweep: str | Path | None = None, cost: bool = False) -> Path:
    """Print the tables, write results.{csv,md} (and differences.csv), ablation.png (and importances.csv), and
    attach them and the summary metrics to the parent run; the last line says where its runs are seen (on
    ``tracking_uri``, default the project's store). ``power``: add each seed's value, and per comparison its power
    and the seeds that resolve a difference of that size at its Holm level, and its escapes. ``sweep``: the sweep
    file whose escape threshold, setting, claims and marks word the report (``sweep_wording``). ``cost``: the
    study's trial-hours and wall time and the designs that would resolve its open comparisons (``study_cost``; sized
    for ``power``, else the study's margin), printed and written to cost.md. Returns the folder."""
    console = console or Console()
    attrs = dict(study.user_attrs) | (sweep_wording(study, sweep) if sweep is not None else {})
    if cost and power is None:
        power = attrs.get("margin")
        if power is None:
            from .spec import SweepError

            raise SweepError(f"--cost: study {study.study_name!r} declares no margin; expected --power DELTA, the "
                             "difference its designs are sized for")
    metric = attrs.get("metric", "value")
    baseline = attrs.get("baseline")
    maximize = attrs.get("direction", "maximize") == "maximize"
    columns, rows = result_rows(study)
    diffs = differences(study, columns, rows, power, attrs)
    tuned = tuned_rows(study, columns, rows)
    out = Path(out_dir or Path("runs") / "sweeps" / study.study_name)
    out.mkdir(parents=True, exist_ok=True)
    marks = attrs.get("marks") or {}
    files = write_tables(columns, rows, diffs, metric, baseline, out, power, tuned, marks, attrs)
    plot = ablation_plot(columns, rows, metric, out / "ablation.png", baseline, marks, attrs.get("escape")) \
        if attrs.get("sampler", "grid") == "grid" else None
    files += [plot] if plot else []
    if attrs.get("sampler") in ("tpe", "random"):
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
            importances = optuna.importance.get_param_importances(study)
            path = out / "importances.csv"
            path.write_text("parameter,importance\n" + "".join(f"{k},{v:.6f}\n" for k, v in importances.items()))
            files.append(path)
    keys = short_names(columns)
    print_table(console, f"study {study.study_name}: {metric} ({attrs.get('direction', '')}), best first"
                + "".join(f"; {label}: {value:.4g}" for label, value in marks.items()),
                keys + SHOWN_POINT_HEADER, [[str(r[c]) for c in columns] + _shown_point_cells(r) for r in rows],
                keys=len(columns), styles=["red" if r["failed"] else "yellow" if r["pruned"] or r["unfinished"]
                                           else None for r in rows])
    from .costs import quality_cost  # each point's tokens/s and s/step, the plot, the estimate checked

    files += quality_cost(study, columns, rows, metric, maximize, out, console, client, parent, tracking_uri)
    if diffs:
        steps_to = "p_rank" in diffs[0]
        where = " ".join(f"{n}={baseline.get(k)}" for k, n in zip(columns, keys))
        print_table(console, f"{metric}: point − baseline ({where}), paired by seed; * resolved: Holm-adjusted "
                             f"{_test_words(diffs)} < {stats_.ALPHA:g} over {diffs[0]['holm_m']} comparisons, on "
                             f"≥ {stats_.MIN_PAIRS} pairs; least p (flip): 2/2ⁿ; bootstrap {_boot_words(diffs)}"
                             f"{_equiv_words(diffs)}",
                    _diff_header(steps_to, diffs[0]["margin"]), [_diff_cells(d) for d in diffs],
                    styles=["green" if d["resolved"] and d["better"] else "red" if d["resolved"] else None
                            for d in diffs])
        console.print(Text(f"verdicts ({metric}):"))
        for d in diffs:
            console.print(Text(f"  {d['changes']}: {verdict(d, attrs)}"))
    escape = attrs.get("escape")
    if power and rows:
        repeats, header = _seed_header(rows, escape)
        print_table(console, f"{metric} per seed" + (f"; escaped: beyond {escape:g}" if escape is not None else ""),
                    keys + header, [[str(r[c]) for c in columns] + _seed_cells(r, repeats, escape, maximize)
                                    for r in rows], keys=len(columns))
    if power and diffs:
        print_table(console, _power_words(power, escape, "p_rank" in diffs[0], metric, diffs[0]["margin"]),
                    _power_header(power, diffs[0]["margin"]), [_power_cells(d) for d in diffs])
    if tuned:
        print_table(console, "tuned settings: the best median over the pilot seeds (never a reported seed; a "
                             "candidate that diverged is not chosen), each candidate's median [range] of its seeds",
                    keys + TUNED_HEADER, [[str(t[c]) for c in columns] + [_chosen(t), t["candidates"]]
                                          for t in tuned], keys=len(columns))
    for r in rows:
        if r["reason"]:
            console.print(Text(f"trials {r['trials']}: {r['reason']}", style="red"))
    if cost:
        lines = cost_lines(study_cost(study, columns, rows, diffs), columns, power, attrs.get("margin"))
        files.append(out / "cost.md")
        files[-1].write_text("\n".join(lines) + "\n")
        console.print(Text("cost:\n" + "\n".join(lines)))
    if client is not None and parent is not None:
        for f in files:
            client.log_artifact(parent, str(f), "summary")
        log_summary(client, parent, study, columns, rows, diffs, tuned)
    console.print(Text(f"files: {', '.join(str(f) for f in files)}"))
    console.print(Text(f"browse its runs: {browse_hint(study.study_name, tracking_uri)}"))
    return out

