"""atlas-lab sweep FILE --estimate (atlas_lab/sweep/estimate.py): the schedule and projection arithmetic exactly,
the pilot's timing through a fake clock, the study's configurations, and one real tiny estimate end to end."""
from pathlib import Path

import pytest
import yaml
from sweep_helpers import write_sweep

from atlas_lab.cli import main
from atlas_lab.sweep import estimate
from atlas_lab.sweep.estimate import Point, Schedule, Timing, project, study_hours, trial_plan
from atlas_lab.sweep.spec import load_sweep


@pytest.mark.parametrize("args,expected", [
    # sweeps/mqar_gpu.yaml: 2,813 batches an epoch, 4 epochs, val_check_interval 0.25: every 703 batches, 4 an
    # epoch; the last batch (2,813 = 4 × 703 + 1) is not validated, so validate_at_end adds one
    (dict(epoch=2813, max_epochs=4, val_check_interval=0.25), (11252, 17)),
    (dict(epoch=2813, max_epochs=4, val_check_interval=0.25, validate_at_end=False), (11252, 16)),
    # sweeps/mqar_atlas_seeds.yaml: max_steps 1,500 of a 6,250-batch epoch, an int interval within the epoch
    (dict(epoch=6250, max_epochs=1, max_steps=1500, val_check_interval=250), (1500, 6)),
    # experiments/lm_760m.yaml: 57,221 steps of 64 batches, every 64,000 batches counted across epochs
    (dict(epoch=10**9, max_epochs=-1, max_steps=57221, accumulate=64, val_check_interval=64000,
          check_val_every_n_epoch=None), (57221 * 64, 57 + 1)),
    # every second epoch validated (epochs 2 and 4 of 5), then once at the end
    (dict(epoch=10, max_epochs=5, val_check_interval=1.0, check_val_every_n_epoch=2), (50, 3)),
    # neither max_epochs nor max_steps: Lightning's 1000 epochs
    (dict(epoch=3, val_check_interval=1.0), (3000, 1000)),
    # max_steps ends the fit inside the third epoch: 2 full epochs validated once each, none in the third's 5
    (dict(epoch=10, max_epochs=None, max_steps=25, val_check_interval=1.0), (25, 3)),
])
def test_trial_plan_follows_lightnings_schedule(args, expected):
    assert trial_plan(**args) == expected


def test_a_fit_that_never_ends_is_refused():
    with pytest.raises(ValueError, match="never ends"):
        trial_plan(10, max_epochs=-1, max_steps=-1)


def test_projection_arithmetic_is_exact():
    timing = Timing(step_s={64: 0.5, 256: 2.0}, val_batch_s={64: 0.25, 1024: 4.0}, val_overhead_s=1.0, setup_s=3.0)
    schedule = Schedule(train_batches={64: 30, 256: 10}, val_batches={64: 4, 1024: 2},
                        trainer=dict(max_epochs=2, val_check_interval=0.5))
    p = project(timing, schedule)
    # 80 batches: 60 at 0.5 s and 20 at 2 s; validations every 20 batches: 2 an epoch, the last batch validated
    assert (p["batches"], p["validations"]) == (80, 4)
    assert p["training"] == 60 * 0.5 + 20 * 2.0
    assert p["one_validation"] == 4 * 0.25 + 2 * 4.0 + 1.0
    assert p["total"] == 3.0 + 70.0 + 4 * 10.0
    rows = [dict(fits=9, projection=p), dict(fits=5, error="x")]
    assert study_hours(rows) == 9 * 113.0 / 3600
    # limit_train_batches cuts the epoch (each length in proportion); max_time caps a fit's run, not its setup
    limited = project(timing, Schedule(schedule.train_batches, schedule.val_batches,
                                       dict(schedule.trainer, limit_train_batches=20, max_time="00:00:00:50")))
    assert limited["batches"] == 40 and limited["training"] == 30 * 0.5 + 10 * 2.0
    assert limited["total"] == 3.0 + 50.0
    # a length the pilot did not time takes the nearest one timed
    assert project(timing, Schedule({128: 1}, {}, dict(max_epochs=1)))["training"] == 0.5


def test_pilot_times_each_batch_from_the_end_of_the_one_before(sweep_dir):
    """A fake clock that advances 1 s at each reading: every timed batch takes 1 s, and the record says which
    lengths the epoch holds and how many batches one validation has."""
    ticks = iter(range(10**6))
    config = yaml.safe_load((sweep_dir / "experiments" / "tiny.yaml").read_text())
    config["data"]["init_args"]["train_slices"] = [[16, 2, 64], [32, 4, 80]]
    config["data"]["init_args"]["test_slices"] = [[16, 2, 32], [48, 4, 48]]
    Path("experiments/two.yaml").write_text(yaml.safe_dump(config))
    cpu = iter(range(0, 10**6, 2))  # half a second of CPU each reading: one thread had half a core
    record = estimate.pilot([Path("lightning_config.yaml"), Path("experiments/two.yaml")],
                            {"trainer.max_epochs": 2}, steps=3, val_batches=2, clock=lambda: float(next(ticks)),
                            cpu_clock=lambda: next(cpu) / 4)
    timing, schedule = estimate.from_record(record)
    assert timing.step_s == {16: 1.0, 32: 1.0} and timing.val_batch_s == {16: 1.0, 48: 1.0}
    assert timing.val_overhead_s == 2.0  # from the validation's start to its first batch, from its last to its end
    assert schedule.train_batches == {16: 4, 32: 5} and schedule.val_batches == {16: 2, 48: 3}
    assert schedule.trainer == {"max_epochs": 2} and record["device"] == "cpu"
    assert timing.cpu_share == 0.5 / record["threads"]
    p = project(timing, schedule)
    assert (p["batches"], p["validations"], p["training"], p["one_validation"]) == (18, 2, 18.0, 2 + 3 + 2.0)
    assert not Path("runs").exists()


def test_a_pilot_with_a_time_limit_stops_its_training_once_every_length_is_timed(sweep_dir):
    ticks = iter(range(10**6))
    config = yaml.safe_load((sweep_dir / "experiments" / "tiny.yaml").read_text())
    config["data"]["init_args"]["train_slices"] = [[16, 2, 64], [32, 4, 80]]
    Path("experiments/two.yaml").write_text(yaml.safe_dump(config))
    record = estimate.pilot([Path("lightning_config.yaml"), Path("experiments/two.yaml")], {}, steps=3,
                            clock=lambda: float(next(ticks)), seconds=1)
    assert record["timed"] == {16: 1, 32: 1}  # the lengths in turn: 16, 32, 16, 32, then the limit stops it
    assert estimate.from_record(record)[0].step_s == {16: 1.0, 32: 1.0}


def test_each_distinct_configuration_is_piloted_once(sweep_dir):
    presets = ["atlas", "titans", "transformer"]
    spec = load_sweep(write_sweep("g.yaml", grid={"model.preset": presets}, repeats=5, fixed={"model.d_model": 32},
                                  tune={"grid": {"model.lr": [3.0e-4, 1.0e-3, 3.0e-3, 1.0e-2]}, "seeds": 3}))
    points = estimate.study_points(spec)  # the learning rates of the tune block cost the same: one pilot a preset
    assert [p.label for p in points] == [f"preset={p}" for p in presets]
    assert {p.fits for p in points} == {5 + 4 * 3} and sum(p.fits for p in points) == 3 * 17
    assert points[0].overrides == {"model.d_model": 32, "model.preset": "atlas", "model.lr": 3.0e-4}
    tuned = load_sweep(write_sweep("t.yaml", grid={"model.preset": ["atlas"]}, repeats=2,
                                   tune={"grid": {"model.n_layers": [1, 2]}, "seeds": 3}))
    # a tune key that changes the cost: a pilot per candidate, the reported seeds counted at the first
    assert [(p.overrides["model.n_layers"], p.fits) for p in estimate.study_points(tuned)] == [(1, 2 + 3), (2, 3)]
    search = estimate.study_points(load_sweep(write_sweep(
        "r.yaml", sampler="random", trials=24, repeats=2, search={"model.lr": {"low": 1.0e-4, "high": 1.0e-2,
                                                                              "log": True}})))
    assert len(search) == 1 and search[0].fits == 48 and search[0].overrides["model.lr"] == pytest.approx(1.0e-3)


def test_config_is_read_as_the_cli_reads_it(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"model": {"preset": "atlas", "memory": {"window": 4}},
                                                     "data": {"class_path": "x.A", "init_args": {"n": 1, "m": 2}}}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"data": {"class_path": "x.B", "init_args": {"k": 3}}}))
    config = estimate.run_config([tmp_path / "a.yaml", tmp_path / "b.yaml"],
                                 {"model.memory.optimizer.ns_steps": 3, "model.memory.eta_max": 0.1,
                                  "model": {"n_layers": 1}, "data.init_args.k": 4})
    assert config["model"] == {"preset": "atlas", "n_layers": 1,
                               "memory": {"window": 4, "optimizer.ns_steps": 3, "eta_max": 0.1}}
    assert config["data"] == {"class_path": "x.B", "init_args": {"k": 4}}  # another class: its own arguments only


def test_a_stream_is_sampled_from_its_start_and_needs_max_steps():
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Tokens(IterableDataset):
        def __iter__(self):
            for i in range(10**6):
                yield {"input_ids": torch.full((8,), i), "labels": torch.full((8,), i)}

    stream = estimate.batches_of(DataLoader(Tokens(), batch_size=2))
    assert isinstance(stream, estimate.Stream) and stream.counts(64) == {8: 64}
    assert [b["input_ids"][:, 0].tolist() for b in stream.sample(2)] == [[0, 1], [2, 3]]
    timing = Timing(step_s={8: 0.5}, val_batch_s={8: 0.1})
    schedule = Schedule(stream.counts(), stream.counts(64), dict(max_epochs=-1, max_steps=100, val_check_interval=50,
                                                                 check_val_every_n_epoch=None))
    assert project(timing, schedule)["total"] == 100 * 0.5 + 2 * 64 * 0.1
    with pytest.raises(ValueError, match="set trainer.max_steps"):
        project(timing, Schedule(stream.counts(), {}, dict(max_epochs=1)))


def test_a_failing_pilot_is_its_rows_error(sweep_dir, capsys):
    spec = load_sweep(write_sweep("d.yaml", grid={"model.memory_heads": {"head dim 16": 2, "head dim 2": 16}},
                                  repeats=5))
    timing = dict(step_s={16: 0.01}, val_batch_s={16: 0.005}, val_overhead_s=0.0, setup_s=0.5, cpu_share=0.4)
    schedule = dict(train_batches={16: 600}, val_batches={16: 16}, trainer=dict(max_epochs=1, val_check_interval=0.25))

    def run(point: Point):
        if point.label.endswith("head dim 2"):
            raise RuntimeError("out of memory")
        return dict(timing=timing, schedule=schedule, device="cpu", threads=1)

    rows = estimate.print_estimate(spec, 4, run=run)
    assert rows[1]["error"] == "RuntimeError: out of memory"
    assert rows[0]["projection"]["total"] == pytest.approx(0.5 + 600 * 0.01 + 4 * 16 * 0.005)
    out = " ".join(capsys.readouterr().out.split())  # the lines as words (the console wraps them)
    assert f"{5 * (0.5 + 6.0 + 0.32) / 3600:.2f} hours projected in all" in out and "not counted" in out
    assert "the pilots had 40%-40% of their threads' cores" in out
    assert f"at their CPU time (each configuration's steps and validations × its share) " \
           f"{5 * (0.5 + 0.4 * 6.32) / 3600:.2f} hours" in out
    # a fit capped at max_time: the share scales its run before the cap (here it stays capped), never after
    capped = dict(fits=2, cpu_share=0.5, projection=dict(setup=1.0, training=300.0, validation=100.0, cap=60.0))
    assert estimate.busy_free_hours([capped]) == 2 * (1.0 + 60.0) / 3600
    assert estimate.busy_free_hours([dict(capped, cpu_share=0.1)]) == 2 * (1.0 + 40.0) / 3600


def test_estimate_end_to_end_writes_only_its_figures(sweep_dir, capsys):
    config = yaml.safe_load((sweep_dir / "experiments" / "tiny.yaml").read_text())
    config["data"]["init_args"]["train_slices"] = [[16, 2, 64], [32, 4, 64]]
    Path("experiments/tiny.yaml").write_text(yaml.safe_dump(config))
    sweep = write_sweep("s.yaml", grid={"model.preset": ["gla", "transformer"]}, repeats=2,
                        tune={"grid": {"model.lr": [1.0e-3, 3.0e-3]}})
    before = sorted(p.name for p in Path(".").iterdir())
    assert main(["sweep", sweep, "--estimate", "3"]) == 0
    out = capsys.readouterr().out
    assert "2 configuration(s) to pilot" in out and "hours projected in all" in out
    assert "preset=gla" in out and "preset=transformer" in out and "16: " in out and "32: " in out
    # its figures only (the report compares them with the study): no store, no journal, nothing else in runs/
    assert sorted(str(p) for p in Path(".").rglob("*") if p.is_file() and p.parts[0] == "runs") == \
        ["runs/sweeps/s/estimate.json"]
    assert sorted(p.name for p in Path(".").iterdir()) == sorted(before + ["runs"])
