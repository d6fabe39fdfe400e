"""A fit stopped at any step and resumed from its checkpoint is the fit that never stopped: the same final weights
(torch.equal), every metric logged at the same steps, once, with the same values (read from the MLflow store), the
same epoch counter and checkpoint names. Stop points: the first step, a step that is not a validation step, a
validation step, the last step of an epoch and the one after it; ended by max_steps, by max_epochs, by SIGTERM
and by SIGKILL after a checkpoint. Data: MQAR (the in-memory tasks' loader) and the streaming shards with 0 and 2
loader workers.

What differs, by design: a fit stopped where no validation was due validates its last step (validate_at_end), so
the resumed run holds that one validation more, at the stop's step; with validate_at_end false the runs are equal.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers import prepared_corpus

from atlas_lab.lit.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
EVERY = 6  # a validation every 6 training batches of an epoch
MQAR_BATCHES = 20  # training batches of an MQAR epoch (320 sequences of 16)


def mqar():
    return ["-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments" / "mqar.yaml"),
            "--model.preset=deltanet", "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2",
            "--model.memory_heads=2", "--model.warmup_steps=2", "--model.schedule_steps=40",
            "--data.init_args.train_slices=[[16, 2, 320]]", "--data.init_args.test_slices=[[16, 2, 16]]",
            "--data.init_args.batch_size=16", "--trainer.max_epochs=2"]


def streaming(corpus: str, workers: int):
    return ["-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments" / "lm_tiny_shards.yaml"),
            f"--data.init_args.data_dir={corpus}", f"--data.init_args.num_workers={workers}",
            "--data.init_args.seq_len=15", "--data.init_args.batch_size=8", "--model.preset=deltanet",
            "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2", "--model.schedule_steps=40",
            "--trainer.max_epochs=2"]


def options(root: Path, steps: int) -> list[str]:
    return [f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{root}.db",
            f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={EVERY}", "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
            "{filename: '{epoch}-{step}', save_last: true, enable_version_counter: false}}]"]


def fit(data: list[str], root: Path, steps: int, *extra: str):
    run_cli(["fit", *data, *options(root, steps), *extra])


def fit_process(data: list[str], root: Path, steps: int, *extra: str) -> int:
    """The fit as its own ``atlas-lab fit`` process (signals reach it alone); returns its exit code."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(ROOT)]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "atlas_lab.cli", "fit", *data, *options(root, steps), *extra],
                          env=env, capture_output=True, text=True).returncode


def record(root: Path) -> dict:
    """What a fit left: its last checkpoint's weights and epoch, its checkpoint names, and every metric's history
    ([(step, value)] in logging order) from the MLflow store (``epoch``, which Lightning logs beside every metric
    as often as it logs, and the run's cost, ``cost/*``, timings that differ from fit to fit, left out)."""
    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    client = MlflowClient(f"sqlite:///{root}.db")
    (run,) = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])
    history = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                       key=lambda m: (m.step, m.timestamp))]
               for key in run.data.metrics if key != "epoch" and not key.startswith("cost/")}
    return {"weights": checkpoint["state_dict"], "epoch": checkpoint["epoch"], "step": checkpoint["global_step"],
            "files": sorted(p.name for p in (root / "checkpoints").iterdir()), "metrics": history,
            "status": run.info.status}


def assert_resumed_is_uninterrupted(resumed: dict, uninterrupted: dict, extra_validation: int | None = None):
    """Weights, epoch, step, files equal; every metric of the uninterrupted fit at the same steps with the same
    values, each step once; ``extra_validation``: the step of the stopped fit's own end-of-fit validation, the one
    point the resumed run holds besides (val/* only)."""
    assert resumed["weights"].keys() == uninterrupted["weights"].keys()
    assert all(torch.equal(resumed["weights"][k], v) for k, v in uninterrupted["weights"].items())
    assert (resumed["epoch"], resumed["step"], resumed["files"]) == \
        (uninterrupted["epoch"], uninterrupted["step"], uninterrupted["files"])
    assert resumed["metrics"].keys() == uninterrupted["metrics"].keys()
    assert resumed["status"] == uninterrupted["status"] == "FINISHED"
    for key, history in resumed["metrics"].items():
        steps = [s for s, _ in history]
        assert len(steps) == len(set(steps)), f"{key}: a step logged twice: {steps}"
        extra = [(s, v) for s, v in history if s == extra_validation and key.startswith("val/")]
        assert [p for p in history if p not in extra] == uninterrupted["metrics"][key], key
        assert len(extra) == (extra_validation is not None and key.startswith("val/")), (key, extra)


def end_validation(stop: int, batches: int | None) -> int | None:
    """The step at which a fit stopped after ``stop`` steps logs its end-of-fit validation, None where a validation
    was due there anyway (logged at the step of the batch before it, as Lightning logs validations). ``batches``: of
    an epoch, where validations are counted in each epoch; None where they are counted over the fit
    (check_val_every_n_epoch null, as in lm_tiny_shards.yaml)."""
    counted = stop if batches is None else (stop - 1) % batches + 1
    return None if counted % EVERY == 0 else stop - 1


def stops(batches: int) -> list[int]:
    """First step, not a validation step, a validation step, the epoch's last step, the one after it."""
    return [1, EVERY - 1, EVERY, batches, batches + 1]


@pytest.fixture(scope="module")
def uninterrupted_mqar(tmp_path_factory):
    root = tmp_path_factory.mktemp("mqar") / "uninterrupted"
    fit(mqar(), root, 2 * MQAR_BATCHES)
    return record(root)


@pytest.mark.parametrize("stop", stops(MQAR_BATCHES))
def test_an_mqar_fit_resumed_at_any_step_is_the_uninterrupted_fit(tmp_path, uninterrupted_mqar, stop):
    fit(mqar(), tmp_path / "r", stop)
    fit(mqar(), tmp_path / "r", 2 * MQAR_BATCHES, f"--ckpt_path={tmp_path / 'r' / 'checkpoints' / 'last.ckpt'}")
    assert_resumed_is_uninterrupted(record(tmp_path / "r"), uninterrupted_mqar, end_validation(stop, MQAR_BATCHES))


@pytest.mark.slow  # 14 s; resuming a stopped fit: test_a_fit_stopped_by_a_signal_… [SIGKILL]
def test_a_fit_of_one_epoch_resumed_for_a_second_is_the_fit_of_two(tmp_path, uninterrupted_mqar):
    """Bounded by epochs alone (max_steps -1): one epoch, then resumed with max_epochs 2. Also: a run of one epoch
    names its checkpoint epoch=0."""
    fit(mqar(), tmp_path / "u", -1)
    fit(mqar(), tmp_path / "r", -1, "--trainer.max_epochs=1")
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == \
        [f"epoch=0-step={MQAR_BATCHES}.ckpt", "last.ckpt"]
    fit(mqar(), tmp_path / "r", -1, f"--ckpt_path={tmp_path / 'r' / 'checkpoints' / 'last.ckpt'}")
    uninterrupted = record(tmp_path / "u")
    assert uninterrupted["files"] == uninterrupted_mqar["files"]
    assert_resumed_is_uninterrupted(record(tmp_path / "r"), uninterrupted, end_validation(MQAR_BATCHES, MQAR_BATCHES))


def test_an_mqar_fit_of_one_epoch_stopped_early_trains_its_remaining_steps(tmp_path):
    """experiments/mqar.yaml is one epoch (max_epochs 1): stopped by max_steps and resumed with more, it trains on
    (before, it ended at once: "max_epochs=1 reached")."""
    one_epoch = [*mqar(), "--trainer.max_epochs=1"]
    fit(one_epoch, tmp_path / "r", 13)
    fit(one_epoch, tmp_path / "r", 17, f"--ckpt_path={tmp_path / 'r' / 'checkpoints' / 'last.ckpt'}")
    resumed = record(tmp_path / "r")
    assert resumed["step"] == 17 and [s for s, _ in resumed["metrics"]["train/loss"]] == list(range(17))


def test_without_validate_at_end_the_resumed_run_is_the_uninterrupted_run(tmp_path):
    fit(mqar(), tmp_path / "u", 30, "--validate_at_end=false")
    fit(mqar(), tmp_path / "r", 13, "--validate_at_end=false")
    fit(mqar(), tmp_path / "r", 30, "--validate_at_end=false",
        f"--ckpt_path={tmp_path / 'r' / 'checkpoints' / 'last.ckpt'}")
    assert_resumed_is_uninterrupted(record(tmp_path / "r"), record(tmp_path / "u"))


@pytest.mark.parametrize("signal_name", [pytest.param("SIGTERM", marks=pytest.mark.slow), "SIGKILL"])  # 20–25 s each
def test_a_fit_stopped_by_a_signal_resumes_as_if_never_stopped(tmp_path, uninterrupted_mqar, signal_name):
    """A real signal to the fit's process after step 15: SIGTERM lets the batch end, writes last.ckpt there, ends
    the MLflow run KILLED and exits 143; SIGKILL leaves the checkpoint of the validation at step 12, and the resumed
    fit trains steps 12-14 again without logging 12 and 13 twice. Either way, resumed to the end, it is the fit that
    never stopped."""
    killer = f"--trainer.callbacks+={{class_path: signal_at.SignalAt, init_args: {{step: 15, " \
             f"signal_name: {signal_name}}}}}"
    code = fit_process(mqar(), tmp_path / "r", 2 * MQAR_BATCHES, killer)
    checkpoint = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", weights_only=False)
    if signal_name == "SIGTERM":
        assert code == 143 and checkpoint["global_step"] == 15
        assert record(tmp_path / "r")["status"] == "KILLED"
    else:
        assert code == -9 and checkpoint["global_step"] == 12
        assert [s for s, _ in record(tmp_path / "r")["metrics"]["train/loss"]][-1] == 13  # logged past the checkpoint
    fit(mqar(), tmp_path / "r", 2 * MQAR_BATCHES, f"--ckpt_path={tmp_path / 'r' / 'checkpoints' / 'last.ckpt'}")
    assert_resumed_is_uninterrupted(record(tmp_path / "r"), uninterrupted_mqar)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """60 documents of 10-200 bytes (byte tokens), 20 % held out."""
    return prepared_corpus(tmp_path_factory.mktemp("corpus"), 60)


@pytest.mark.slow  # 63 s; the default suite resumes fits stopped by a signal (test_a_fit_stopped_by_a_signal_…)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_streaming_fit_resumed_at_any_step_is_the_uninterrupted_fit(tmp_path, corpus, workers):
    from atlas_lab.data.stream import StreamingLMDataModule

    batches = len(StreamingLMDataModule(corpus, seq_len=15, batch_size=8, num_workers=workers).train_dataloader())
    assert batches > EVERY + 1
    data = streaming(corpus, workers)
    fit(data, tmp_path / "u", 2 * batches)
    uninterrupted = record(tmp_path / "u")
    for stop in stops(batches):
        root = tmp_path / f"r{stop}"
        fit(data, root, stop)
        fit(data, root, 2 * batches, f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}")
        assert_resumed_is_uninterrupted(record(root), uninterrupted, end_validation(stop, None))
