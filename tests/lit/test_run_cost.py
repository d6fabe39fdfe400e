"""What a fit costs, read back from the MLflow store of a real fit: the rates at the logging interval and the summary
over the steady steps (``RunCost``, Lightning's ThroughputMonitor); a user's component in the run's name, tag and
params; each run's artifacts where the README says (``store.artifact_root``), whatever its root folder.

Error model of the exact checks: every rate of one logging window shares its window's elapsed seconds, so the
identities between them (tokens = samples × L; FLOPs = tokens × FLOPs per token; s/step × samples/s = B at one batch
per step) hold to the roundings of the stored values: the rates at the logging interval go through Lightning's
``self.log``, which keeps a number as float32 (relative rounding at most 2^-24 each), so an identity of two of them
holds to 2 · 2^-24 and a few float64 roundings (``F32``); the summary is logged as float64: relative 1e-9.
"""
import resource
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.flop_counter import FlopCounterMode

from atlas_lab.cli import main
from atlas_lab.lit.module import SequenceModel
from atlas_lab.store import artifact_root

B, L, STEPS, EVERY = 8, 16, 20, 5
F32 = 2 * 2**-24 + 1e-12  # two float32 roundings (see above)
RATES = ("tokens_per_s", "samples_per_s", "s_per_step", "flops_per_s")
RULE = '''from atlas_lab.memory.learning_rules import Online


class ValueNormDelta(Online):
    """The online rule with an option of its own: a user's component."""

    def __init__(self, p: float = 1.0, gradient_at: str = "state"):
        super().__init__(gradient_at)
        self.p = p
'''


def fit_args(root: str, steps: int, *extra: str, accelerator: str = "cpu") -> list[str]:
    return ["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=deltanet",
            "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2", "--model.memory_heads=2",
            f"--data.init_args.train_slices=[[{L}, 2, 256]]", f"--data.init_args.test_slices=[[{L}, 2, 16]]",
            f"--data.init_args.batch_size={B}", f"--trainer.max_steps={steps}",
            f"--trainer.log_every_n_steps={EVERY}", f"--trainer.default_root_dir={root}",
            f"--trainer.accelerator={accelerator}",
            "--trainer.enable_progress_bar=false", "--trainer.callbacks=[{class_path: "
            "lightning.pytorch.callbacks.ModelCheckpoint, init_args: {save_last: true}}]", *extra]


def training_flops_per_token(ckpt: str, device: torch.device) -> float:
    """One training step's FLOPs per token of [1, L] tokens (forward, the loss, backward), counted here."""
    model = SequenceModel.load_from_checkpoint(ckpt, map_location=device)
    ids = torch.zeros(1, L, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    return counter.get_total_flops() / L


def test_a_fit_logs_its_cost_and_a_users_component_and_its_artifacts_lie_where_the_readme_says(
        workdir, monkeypatch, capfd, device):
    """On the tests' device (``--device``): a CPU fit has no MFU and its peak memory is the process's; a CUDA fit
    (make gpu-check's device) has MFU against the device's peak and the allocator's peak memory."""
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    (workdir / "myrules.py").write_text(RULE)
    monkeypatch.syspath_prepend(str(workdir))
    rule = "--model.memory={learning_rule: {class_path: myrules.ValueNormDelta, init_args: {p: 2.0}}}"
    assert main(fit_args("runs/a", STEPS, rule, accelerator=accelerator)) == 0
    printed = capfd.readouterr().out
    assert main(fit_args("runs/b", 2, accelerator=accelerator)) == 0  # another root, the preset's own components
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    experiment = client.get_experiment_by_name("atlas-lab")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"fit-mqar-deltanet learning_rule=ValueNormDelta(p=2.0)", "fit-mqar-deltanet"}
    run = runs["fit-mqar-deltanet learning_rule=ValueNormDelta(p=2.0)"]
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics

    # the user's component: class path and options in the params and a tag; the other run has no such tag
    assert tags["atlas_lab.components"] == "learning_rule=myrules.ValueNormDelta(p=2.0)"
    assert params["model.memory.learning_rule.class_path"] == "myrules.ValueNormDelta"
    assert params["model.memory.learning_rule.init_args.p"] == "2.0"
    assert "atlas_lab.components" not in runs["fit-mqar-deltanet"].data.tags

    # the rates at the logging interval: from the first full window (EVERY batches) on, at every logging step
    history = {name: sorted(client.get_metric_history(run.info.run_id, f"cost/{name}"), key=lambda m: m.step)
               for name in RATES + ("peak_memory_mib",)}
    steps = list(range(2 * EVERY - 1, STEPS, EVERY))
    assert all([m.step for m in history[name]] == steps for name in RATES), history
    flops_per_token = metrics["cost/flops_per_token"]
    assert flops_per_token == pytest.approx(training_flops_per_token("runs/a/checkpoints/last.ckpt", device),
                                            rel=1e-9)
    for tokens, samples, step_s, flops in zip(*(history[name] for name in RATES)):
        assert tokens.value > 0 and tokens.value == pytest.approx(samples.value * L, rel=F32)
        assert flops.value == pytest.approx(tokens.value * flops_per_token, rel=F32)
        assert step_s.value * samples.value == pytest.approx(B, rel=F32)
    if device.type == "cuda":  # the allocator's peak (reset as the fit starts), MFU against the device's peak
        from lightning.fabric.utilities.throughput import get_available_flops

        peak = torch.cuda.get_device_properties(device).total_memory / 2**20
        available = get_available_flops(device, torch.float32)
        assert metrics["cost/steady/mfu"] == pytest.approx(metrics["cost/steady/flops_per_s"] / available, rel=1e-9)
        mfu = client.get_metric_history(run.info.run_id, "cost/mfu")
        assert [m.step for m in mfu] == steps and all(0 < m.value < 1 for m in mfu)
    else:  # the process's peak resident memory; no MFU without a device peak
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # this process's peak so far, MiB
        assert "cost/mfu" not in metrics and "cost/steady/mfu" not in metrics
    assert all(0 < m.value <= peak for m in history["peak_memory_mib"])

    # the summary: over the steady steps, after the first logging interval
    steady = {name: metrics[f"cost/steady/{name}"] for name in RATES}
    assert steady["tokens_per_s"] == pytest.approx(steady["samples_per_s"] * L, rel=1e-9)
    assert steady["flops_per_s"] == pytest.approx(steady["tokens_per_s"] * flops_per_token, rel=1e-9)
    assert steady["s_per_step"] * steady["samples_per_s"] == pytest.approx(B, rel=1e-9)
    assert tags["cost.steady_steps"] == f"batches {EVERY + 1}-{STEPS}"
    assert tags["cost.device"] == (torch.cuda.get_device_name(device) if device.type == "cuda" else
                                   f"cpu, {torch.get_num_threads()} thread" + "s" * (torch.get_num_threads() != 1))
    assert f"{steady['tokens_per_s']:,.0f} tokens/s" in printed and f"over batches {EVERY + 1}-{STEPS}" in printed

    # artifacts: <artifact_root>/<run id>/artifacts for every run, whatever its default_root_dir; checkpoints there
    for name, root in (("fit-mqar-deltanet learning_rule=ValueNormDelta(p=2.0)", "a"), ("fit-mqar-deltanet", "b")):
        run = runs[name]
        folder = Path("runs/artifacts").resolve() / run.info.run_id / "artifacts"
        assert artifact_root(None) == Path("runs/artifacts").resolve()
        assert Path(run.info.artifact_uri.removeprefix("file://")) == folder
        assert (folder / "config.yaml").is_file() and (Path("runs") / root / "checkpoints" / "last.ckpt").is_file()
    assert not Path("runs/a/artifacts").exists() and not Path("runs/b/artifacts").exists()
