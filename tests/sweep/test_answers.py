"""Answers worded as the data allow: verdicts that name their setting, escapes beyond a declared threshold above the
task's plateau, no verdict from too few or identical pairs, and tuning on several pilot seeds that refines a
candidate that diverged."""
import json

import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from atlas_lab.cli import main
from atlas_lab.sweep import statistics as st
from atlas_lab.sweep.report import differences, result_rows, summarize, verdict
from atlas_lab.sweep.spec import SweepError, load_sweep, task_plateau
from atlas_lab.sweep.study import claim_waiting_trial, enqueue_refinements, refinements, tuned_setting
from sweep_helpers import write_sweep
from test_report import synthetic_study

BASE = {"model.preset": "atlas", "model.memory": "atlas"}
SETTING = "MQAR V 64, N 2, L 16; one layer of width 16"


def worded(study, **attrs):
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


# --- no verdict from too little ---

def test_two_identical_differences_are_too_few_seeds_not_a_verdict(tmp_path):
    """Issue 43's case: a point 0.0035 below the baseline on both of 2 seeds. The t test is undefined (no spread),
    the sign-flip p is 0.5 at best, and the report says "too few seeds", never "* worse"."""
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6], ("atlas", "linear"): [0.4965, 0.5965]}, baseline=BASE)
    columns, rows = result_rows(study)
    (d,) = differences(study, columns, rows, power=0.1)
    assert d["p"] is None and d["p_flip"] == 0.5 and d["p_flip_min"] == 0.5 and d["no_spread"]
    assert d["too_few"] and not d["resolved"] and d["p_holm"] is None and d["seeds"] is None
    assert verdict(d, {}).startswith("too few seeds: 2 pair(s), a verdict needs 3")
    console = Console(width=200, record=True)
    md = (summarize(study, console=console, out_dir=tmp_path) / "results.md").read_text()
    assert "* worse" not in md and "too few seeds" in md and "* worse" not in console.export_text()


def test_identical_differences_on_enough_seeds_are_not_resolved():
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7, 0.8], ("atlas", "gd"): [0.4, 0.5, 0.6, 0.7],
                             ("atlas", "linear"): [0.6, 0.72, 0.78, 0.9]}, baseline=BASE)
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows)}
    gd, linear = diffs["memory=gd"], diffs["memory=linear"]
    assert gd["p"] is None and gd["p_holm"] is None and not gd["resolved"] and gd["p_flip_min"] == 0.125
    assert verdict(gd, {}).startswith("no value: the differences are one value up to the metric's storage precision")
    assert linear["p_holm"] == linear["p"] and linear["holm_m"] == 1  # the identical one is left out of Holm


# --- verdicts name their setting ---

@pytest.mark.parametrize("paper_setting,side,expected", [
    (False, "worse", f"opposite ordering (better) at {SETTING}; does not test Table 6: linear is worse"),
    (False, "better", f"same ordering (better) at {SETTING}; does not test Table 6: linear is worse"),
    (True, "worse", f"disagrees with the paper (better) at {SETTING}: Table 6: linear is worse"),
    (True, "better", f"agrees with the paper (better) at {SETTING}: Table 6: linear is worse")])
def test_a_verdict_agrees_with_the_paper_only_in_the_papers_setting(paper_setting, side, expected, tmp_path):
    """linear is ahead of the baseline in every seed (resolved): read against a claim that it is worse (or, to see
    the other word, that it is better)."""
    study = worded(synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78]},
                                   baseline=BASE),
                   setting=SETTING, paper_setting=paper_setting,
                   claims={"linear": {"claim": "Table 6: linear is worse", "paper": side}})
    columns, rows = result_rows(study)
    (d,) = differences(study, columns, rows)
    words = verdict(d, study.user_attrs)
    assert words == expected
    md = (summarize(study, console=Console(width=200, record=True), out_dir=tmp_path) / "results.md").read_text()
    assert f"| memory=linear | val/acc | {words} |" in md  # every verdict row carries the metric and setting


def test_a_verdict_without_a_claim_still_names_the_setting():
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78],
                             ("atlas", "gd"): [0.6, 0.8, 0.7]}, baseline=BASE)
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows)}
    assert verdict(diffs["memory=linear"], {"setting": SETTING}) == f"better at {SETTING}"
    assert verdict(diffs["memory=gd"], {}) == "not resolved at this study's setting (none declared)"


# --- verdicts that resolve either way: a margin ---

def test_a_margin_turns_a_well_powered_null_into_equivalence(tmp_path):
    """margin 0.05: gd is within ±0.01 of the baseline in every seed (its 90 % interval inside ±0.05: equivalent),
    linear is 0.1 ahead (better), mag differs by ±0.2 from seed to seed (neither); the TOST p's are Holm-adjusted
    among themselves, and --power sizes both designs."""
    base = [0.5, 0.6, 0.7, 0.55, 0.65]
    study = worded(synthetic_study({("atlas", "atlas"): base,
                                    ("atlas", "gd"): [b + e for b, e in zip(base, [0.01, -0.005, 0.0, 0.008, -0.01])],
                                    ("atlas", "linear"): [b + 0.1 + e for b, e in zip(base, [0, .01, -.01, .02, 0])],
                                    ("atlas_mag", "atlas"): [b + e for b, e in zip(base, [.2, -.2, .15, -.1, .05])]},
                                   baseline=BASE), setting=SETTING, margin=0.05)
    columns, rows = result_rows(study)
    diffs = {d["changes"]: d for d in differences(study, columns, rows, power=0.1)}
    gd, linear, mag = diffs["memory=gd"], diffs["memory=linear"], diffs["preset=atlas_mag"]
    assert gd["equivalent"] and not gd["resolved"]
    assert verdict(gd, study.user_attrs) == f"equivalent within ±0.05 at {SETTING}"
    assert linear["resolved"] and not linear["equivalent"] and verdict(linear, study.user_attrs).startswith("better")
    assert not mag["resolved"] and not mag["equivalent"]
    assert verdict(mag, study.user_attrs) == f"not resolved at {SETTING}"
    ranks = {d["changes"]: d["equiv_rank"] for d in diffs.values()}
    p_eq = {d["changes"]: d["p_equiv"] for d in diffs.values()}
    assert gd["p_equiv_holm"] == pytest.approx(3 * p_eq["memory=gd"]) and ranks["memory=gd"] == 1
    assert gd["p_equiv"] == pytest.approx(st.equivalence_p([g - b for g, b in zip(rows_of(rows, "gd"), base)], 0.05))
    assert gd["power_equiv"] == pytest.approx(st.equivalence_power(5, 0.05, gd["std"], 0.05 / 3))
    assert gd["seeds_equiv"] == st.seeds_for_equivalence(0.05, gd["std"], 0.05 / 3)
    md = (summarize(study, console=Console(width=300, record=True), out_dir=tmp_path, power=0.1)
          / "results.md").read_text()
    assert "* equivalent ±0.05" in md and "power (equal points)" in md and "seeds for equivalence ±0.05" in md
    assert f"| memory=gd | val/acc | equivalent within ±0.05 at {SETTING} |" in md


def rows_of(rows, memory):
    return [v for _, v in sorted(next(r for r in rows if r["model.memory"] == memory and
                                      r["model.preset"] == "atlas")["values"].items())]


def test_a_margin_is_read_from_the_sweep_file_and_changes_no_trial(sweep_dir):
    path = write_sweep("m.yaml", grid={"model.lr": [1e-3, 2e-3]}, baseline={"model.lr": 0.001}, margin=0.05)
    assert load_sweep(path).margin == 0.05
    assert load_sweep(path, ["margin=0.02"]).margin == 0.02  # a report-only key: --set needs no study name


# --- escapes, Fisher's test, power at the Holm level ---

def test_escapes_beyond_the_declared_threshold_with_fishers_test(tmp_path):
    """escape 0.3: the baseline's seeds 0.1, 0.2, 0.4, 0.5, 0.35 → 3 of 5 escaped; linear's all 5: Fisher's p for
    8 of 10 escaped, P(x of linear's 5) = C(8, x) C(2, 5 − x) / 252 = 56, 140, 56 (/252) for x = 3, 4, 5: the tables
    no likelier than x = 5 are x = 3 and 5, 112/252."""
    study = worded(synthetic_study({("atlas", "atlas"): [0.1, 0.2, 0.4, 0.5, 0.35],
                                    ("atlas", "linear"): [0.9, 0.8, 0.85, 0.95, 0.9]}, baseline=BASE), escape=0.3)
    columns, rows = result_rows(study)
    (d,) = differences(study, columns, rows, power=0.1)
    assert d["escaped"] == "5/5 vs 3/5" and d["p_fisher"] == pytest.approx(112 / 252)
    assert d["holm_level"] == 0.05 and d["power"] == pytest.approx(st.paired_power(5, 0.1, d["std"]))
    console = Console(width=200, record=True)
    out = summarize(study, console=console, out_dir=tmp_path, power=0.1)
    text, md = console.export_text(), (out / "results.md").read_text()
    for seen in (text, md):  # the per-seed values, the escapes and Fisher's p, the level
        assert "seed 4" in seen and "5/5 vs 3/5" in seen and "0.4444" in seen and "0.05 (1 of 1)" in seen
    assert "| atlas | linear | 0.9000 | 0.8000 | 0.8500 | 0.9500 | 0.9000 | 5/5 |" in md


def test_the_escape_threshold_lies_above_the_tasks_plateau(sweep_dir):
    """The tiny MQAR task has N = 2 pairs: its plateau is 1/2. An escape threshold at or below it is one line."""
    ok = load_sweep(write_sweep("ok.yaml", grid={"model.lr": [1e-3]}, escape=0.6))
    assert ok.escape == 0.6 and task_plateau(ok)[0] == 0.5
    with pytest.raises(SweepError) as e:
        load_sweep(write_sweep("low.yaml", grid={"model.lr": [1e-3]}, escape=0.3))
    assert str(e.value).startswith("low.yaml: escape: 0.3 is not above the task's plateau 0.5 (MQAR val accuracy")
    assert "\n" not in str(e.value)
    # two slices: the plateau of the pooled accuracy is Σ count / Σ count·N = (32 + 32) / (32·2 + 32·8) = 0.2
    mixed = load_sweep(write_sweep("mixed.yaml", grid={"model.lr": [1e-3]}, escape=0.3,
                                   fixed={"data.init_args.test_slices": [[16, 2, 32], [32, 8, 32]]}))
    assert task_plateau(mixed)[0] == pytest.approx(0.2)
    assert main(["sweep", write_sweep("bad.yaml", grid={"model.lr": [1e-3]}, escape=0.5)]) == 2


@pytest.mark.parametrize("fields,message", [
    (dict(escape="high"), "escape: expected a number"),
    (dict(claims={"0.002": {"claim": "x", "paper": "worse"}}, baseline={"model.lr": 0.001}),
     "claims.0.002: unknown point label"),
    (dict(claims={"0.001": {"claim": "x", "paper": "lower"}}, baseline={"model.lr": 0.001}),
     "claims.0.001.paper: unknown value 'lower'; valid choices: better, worse"),
    (dict(claims={"0.001": {"claim": "x", "paper": "worse"}}), "claims: a claim is read from a comparison"),
    (dict(paper_setting=True), "paper_setting: true needs a setting"),
    (dict(margin=0, baseline={"model.lr": 0.001}), "margin: expected a positive number (a difference of val/acc)"),
    (dict(margin="small", baseline={"model.lr": 0.001}), "margin: expected a positive number"),
    (dict(margin=0.05), "margin: a margin is read from a comparison with the baseline; the file has no baseline"),
    (dict(tune={"grid": {"model.memory.eta_max": [0.1]}, "seeds": 1}), "tune.seeds: expected an int from 3 to 1000")])
def test_bad_wording_keys_are_one_line(fields, message, sweep_dir):
    with pytest.raises(SweepError) as e:
        load_sweep(write_sweep("w.yaml", grid={"model.lr": [1e-3]}, **fields))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_wording_keys_change_no_trial(sweep_dir):
    """escape, setting and claims are the report's: --set changes them without a study name of its own."""
    path = write_sweep("w.yaml", grid={"model.lr": [1e-3, 2e-3]}, baseline={"model.lr": 0.001})
    spec = load_sweep(path, ["escape=0.7", "setting=MQAR tiny", "claims.0.002={claim: x, paper: better}"])
    assert (spec.escape, spec.setting, spec.claims) == (0.7, "MQAR tiny", {"0.002": {"claim": "x", "paper": "better"}})
    import optuna

    from atlas_lab.sweep.study import record_spec

    study = optuna.create_study()
    record_spec(study, spec, "runs/optuna/s.journal")  # what a sweep records for its report
    assert (study.user_attrs["escape"], study.user_attrs["setting"], study.user_attrs["paper_setting"]) == \
        (0.7, "MQAR tiny", False) and study.user_attrs["claims"] == spec.claims


def test_report_with_a_missing_sweep_file_is_one_line(sweep_dir, capsys):
    from atlas_lab.sweep.study import open_storage

    import optuna

    optuna.create_study(study_name="s", storage=open_storage("runs/optuna/s.journal"))
    assert main(["report", "s", "--sweep", "missing.yaml"]) == 2
    assert capsys.readouterr().err.strip() == "error: missing.yaml: no such sweep file"


def test_report_takes_the_wording_of_the_sweep_file_that_ran_the_study(sweep_dir, tmp_path):
    study = synthetic_study({("atlas", "atlas"): [0.1, 0.2, 0.4], ("atlas", "linear"): [0.9, 0.8, 0.85]},
                            baseline=BASE)
    study.set_user_attr("definition", {"metric": "val/acc", "grid": {"model.lr": {"0.001": 0.001}}})
    path = write_sweep("s.yaml", study=study.study_name, grid={"model.lr": [1e-3]}, escape=0.6, setting="tiny MQAR")
    console = Console(width=200, record=True)
    summarize(study, console=console, out_dir=tmp_path / "a", power=0.1, sweep=path)
    text = console.export_text()
    assert "3/3 vs 0/3" in text and "better at tiny MQAR" in text
    other = write_sweep("o.yaml", study=study.study_name, grid={"model.lr": [2e-3]}, escape=0.6)
    with pytest.raises(SweepError, match="its grid differ from what study"):
        summarize(study, console=console, out_dir=tmp_path / "b", sweep=other)
    with pytest.raises(SweepError, match="defines study 'elsewhere'"):
        summarize(study, console=console, out_dir=tmp_path / "c", sweep=write_sweep("e.yaml", study="elsewhere",
                                                                                      grid={"model.lr": [1e-3]}))


# --- tuning that is not noise ---

DISTS = {"model.preset": CategoricalDistribution(["atlas", "atlas_mag"]),
         "model.memory": CategoricalDistribution(["atlas", "linear", "gd"])}


def pilot(study, candidate, slot, seed, value=None, state=TrialState.COMPLETE, reason=None, labels=BASE):
    """A tune trial of ``labels`` for ``candidate`` on pilot seed ``seed``: complete with ``value``, failed with
    ``reason``, or waiting."""
    attrs = {"labels": labels, "repeat": 1000 + seed, "slot": slot, "tune": candidate}
    if reason:
        attrs["fail_reason"] = reason
    study.add_trial(create_trial(state=state, value=value if state == TrialState.COMPLETE else None, params=labels,
                                 distributions=DISTS, user_attrs=attrs))


NAN = "FloatingPointError: non-finite training loss nan at step 85"


def test_the_choice_is_the_best_median_and_a_diverged_candidate_is_never_chosen(tmp_path):
    """lr 1e-3: 0.2, 0.9, 0.3 (mean 0.467, median 0.3); 3e-3: 0.4, 0.42, 0.41 (mean 0.41, median 0.41): the median
    picks 3e-3 where one lucky seed would have carried the mean. 1e-2 is best on two seeds but diverged on one."""
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7]}, baseline=BASE)
    study.set_user_attr("tune_keys", ["model.lr"])
    for slot, (lr, values) in enumerate(((1e-3, (0.2, 0.9, 0.3)), (3e-3, (0.4, 0.42, 0.41)),
                                         (1e-2, (0.95, 0.96, None)))):
        for seed, v in enumerate(values):
            pilot(study, {"model.lr": lr}, slot, seed, v, *(() if v is not None else (TrialState.FAIL, NAN)))
    chosen, rows = tuned_setting(study, BASE)
    assert chosen == {"model.lr": 3e-3}
    assert [(c["median"], c["low"], c["high"], c["diverged"]) for c in rows] == [
        (0.3, 0.2, 0.9, 0), (0.41, 0.4, 0.42, 0), (pytest.approx(0.955), 0.95, 0.96, 1)]
    md = (summarize(study, console=Console(width=250, record=True), out_dir=tmp_path) / "results.md").read_text()
    assert "lr=0.001: 0.3000 [0.2000, 0.9000] of 3 · lr=0.003: 0.4100 [0.4000, 0.4200] of 3 · lr=0.01: diverged " \
           "in 1 of 3" in md


def test_a_diverged_candidate_brings_a_finer_one_until_the_gap_is_small():
    """eta_max 0.004 stable, 0.015 diverged: a candidate at √(0.004 · 0.015) = 0.00775 is due, and the point's
    reported trials wait for it. It diverges too: then 0.00557 (0.004 to 0.00775 is 1.94×); when that is stable the
    gap to 0.00775 is 1.39× < 1.5 and the tuning is settled."""
    from atlas_lab.sweep.spec import SweepSpec

    study = synthetic_study({}, baseline=BASE)
    spec = SweepSpec(path=None, study="s", base=[], metric="val/acc", grid={"model.preset": {"atlas": "atlas"},
                                                                              "model.memory": {"atlas": "atlas"}},
                     tune={"model.memory.eta_max": [0.004, 0.015]}, tune_seeds=3)
    for seed in range(3):
        pilot(study, {"model.memory.eta_max": 0.004}, 0, seed, 0.15 + seed / 100)
        pilot(study, {"model.memory.eta_max": 0.015}, 1, seed, state=TrialState.FAIL, reason=NAN)
    study.enqueue_trial(BASE, user_attrs={"labels": BASE, "repeat": 0, "slot": 0})  # a reported trial
    assert refinements(study, BASE) == [{"model.memory.eta_max": 0.00775}]
    assert claim_waiting_trial(study) is None  # the reported trial waits for the finer candidate
    assert enqueue_refinements(study, spec) == 3 and refinements(study, BASE) == []
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING and "tune" in t.user_attrs]
    assert sorted(t.user_attrs["repeat"] for t in waiting) == [1000, 1001, 1002]
    assert {t.user_attrs["slot"] for t in waiting} == {2}
    while (t := claim_waiting_trial(study)) is not None and "tune" in t.user_attrs:  # 0.00775 diverges
        t.set_user_attr("fail_reason", NAN)
        study.tell(t, state=TrialState.FAIL)
    assert t is None and refinements(study, BASE) == [{"model.memory.eta_max": 0.00557}]
    enqueue_refinements(study, spec)
    while (t := claim_waiting_trial(study)) is not None and "tune" in t.user_attrs:  # 0.00557 is stable
        study.tell(t, 0.2)
    assert refinements(study, BASE) == [] and t is not None and "tune" not in t.user_attrs
    assert tuned_setting(study, BASE)[0] == {"model.memory.eta_max": 0.00557}


def test_more_pilot_seeds_continue_the_study_and_rerun_the_points_whose_choice_changes():
    """A study tuned on 1 pilot seed (0.004: 0.30, 0.015: 0.20; its 2 reported trials ran at 0.004), resumed with
    seeds: 3: the definition is accepted (its tune grid and everything else the same), the 2 new pilot seeds of each
    candidate are enqueued, and the reported trials wait for them. Seeds 1001 and 1002 put 0.015 ahead (median 0.40
    against 0.30): both reported trials are superseded and their work enqueued again, to run at 0.015; a point whose
    choice holds keeps its trials. Any other change of the definition is still refused."""
    from atlas_lab.sweep.spec import SweepSpec
    from atlas_lab.sweep.study import definition, enqueue_missing, record_spec, retune, stale_reported

    def spec(seeds, tune=(0.004, 0.015)):
        return SweepSpec(path="s.yaml", study="s", base=[], metric="val/acc", repeats=2,
                         grid={"model.preset": {"atlas": "atlas"}, "model.memory": {"atlas": "atlas"}},
                         tune={"model.memory.eta_max": list(tune)}, tune_seeds=seeds)

    study = synthetic_study({}, baseline=BASE)
    study.set_user_attr("definition", definition(spec(1)))
    pilot(study, {"model.memory.eta_max": 0.004}, 0, 0, 0.30)
    pilot(study, {"model.memory.eta_max": 0.015}, 1, 0, 0.20)
    for repeat in range(2):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.3, params=BASE, distributions=DISTS,
                                     user_attrs={"labels": BASE, "repeat": repeat, "slot": 0,
                                                 "tuned": {"model.memory.eta_max": 0.004}}))
    with pytest.raises(SweepError, match=r"another definition \(tune differ\)"):
        record_spec(study, spec(3, tune=(0.004, 0.01)), "runs/optuna/s.journal")
    record_spec(study, spec(3), "runs/optuna/s.journal")
    assert study.user_attrs["definition"] == definition(spec(3))
    assert enqueue_missing(study, spec(3)) == 4 and stale_reported(study, spec(3)) == []  # the point is tuning
    while (t := claim_waiting_trial(study)) is not None:
        study.tell(t, 0.40 if t.user_attrs["tune"]["model.memory.eta_max"] == 0.015 else 0.25)
    assert tuned_setting(study, BASE)[0] == {"model.memory.eta_max": 0.015}
    assert [t.user_attrs["repeat"] for t in stale_reported(study, spec(3))] == [0, 1]
    assert retune(study, spec(3)) == 2 and retune(study, spec(3)) == 0
    again = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["repeat"] for t in again) == [0, 1] and all("tune" not in t.user_attrs for t in again)
    assert enqueue_missing(study, spec(3)) == 0  # the superseded trials' work is queued once


def test_a_failure_other_than_divergence_brings_no_finer_candidate():
    study = synthetic_study({}, baseline=BASE)
    for seed in range(3):
        pilot(study, {"model.lr": 1e-3}, 0, seed, 0.5)
        pilot(study, {"model.lr": 1e-2}, 1, seed, state=TrialState.FAIL, reason="RuntimeError: out of memory")
    assert refinements(study, BASE) == []
    assert json.dumps(tuned_setting(study, BASE)[0]) == '{"model.lr": 0.001}'


@pytest.mark.slow
def test_a_tiny_tuned_sweep_refines_a_diverged_rate_on_three_pilot_seeds(sweep_dir):
    """One point, lr candidates 10 and 100 on 3 pilot seeds each (100 is NaN within 10 steps): the sweep adds finer
    candidates between a diverged one and its stable neighbour until they are within 1.5×, the reported repeat runs
    at the best median of the candidates none of whose pilots diverged, and the report shows each candidate's median,
    range and seeds or its divergences. About 15 trials: 1-2 minutes on 2 cores."""
    import subprocess
    import sys

    from sweep_helpers import load

    sweep = write_sweep("tuned.yaml", repeats=1, grid={"model.preset": ["gla"]},
                        tune={"grid": {"model.lr": [10.0, 100.0]}, "seeds": 3},
                        fixed={"model.warmup_steps": 0, "data.init_args.train_slices": [[16, 2, 512]],
                               "trainer.val_check_interval": 0.5})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep, "--workers", "2"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load()
    labels = {"model.preset": "gla"}
    chosen, candidates = tuned_setting(study, labels)
    rates = sorted(c["tune"]["model.lr"] for c in candidates)
    assert len(rates) > 2 and all(c["pilots"] == 3 for c in candidates)
    stable = [c["tune"]["model.lr"] for c in candidates if not c["diverged"]]
    unstable = [c["tune"]["model.lr"] for c in candidates if c["diverged"]]
    assert 100.0 in unstable and stable and max(stable) < min(unstable)
    assert min(unstable) / max(stable) < 1.5  # refined until the gap is small
    best = max((c for c in candidates if not c["diverged"]), key=lambda c: c["median"])
    assert chosen == best["tune"] and refinements(study, labels) == []
    (reported,) = [t for t in study.get_trials() if "tune" not in t.user_attrs]
    assert reported.user_attrs["tuned"] == chosen and reported.state == TrialState.COMPLETE
    assert "diverged in" in done.stdout and "finer candidates" in done.stdout
