"""One run through the CLI: every experiment config fits, checkpoints resume exactly, bad input exits cleanly."""
import math
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from atlas_lab.lit.cli import check_config, run_cli
from atlas_lab.models import LanguageModel

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "experiments").glob("*.yaml"))}
# configs on a folder of packed token shards the user prepares (`atlas-lab data prepare`): data.init_args.data_dir
SHARD_CONFIGS = [name for name, c in CONFIGS.items() if "data_dir" in c["data"]["init_args"]]
EXPERIMENTS = [name for name in CONFIGS if name not in SHARD_CONFIGS]
# the paper-size configs' atlas at the paper's vocabulary of 32,000: its parameters, as their comments and
# docs/scaling.md state them
PAPER_SIZES = {"lm_340m": 383_647_176, "lm_760m": 824_966_088}


def quiet():
    return ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--trainer.callbacks=[]"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_config_fits_one_batch(workdir, experiment):
    """`atlas-lab fit -c lightning_config.yaml -c experiments/<x>.yaml --trainer.fast_dev_run=true`, as configured
    (model, preset and data) but for a batch of 2."""
    cli = run_cli(["fit", "-c", "lightning_config.yaml", "-c", f"experiments/{experiment}.yaml",
                   "--trainer.fast_dev_run=true", "--data.init_args.batch_size=1", *quiet()])
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and torch.isfinite(metrics["val/loss"])
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size  # linked from the data


@pytest.mark.parametrize("experiment", SHARD_CONFIGS)
def test_shard_config_keys_are_the_model_and_trainer_arguments(experiment, tmp_path):
    """A config on prepared shards, its data section swapped for experiments/lm.yaml's: every model.* and trainer.*
    key parses against SequenceModel and Lightning's Trainer, the model builds (at d_model 192, 1 layer) and so does
    the Trainer; a paper-size config reads batches of 0.5M tokens and its atlas has the parameters it states."""
    config = CONFIGS[experiment]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "data": CONFIGS["lm"]["data"]}))
    cli = check_config(["-c", str(ROOT / "lightning_config.yaml"), "-c", str(path), "--model.d_model=192",
                        "--model.n_layers=1"])
    assert {k: cli.config["model"][k] for k in config["model"]} == {**config["model"], "d_model": 192, "n_layers": 1}
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        **{k: cli.config["trainer"][k] for k in config["trainer"]})
    assert (trainer.max_steps, trainer.accumulate_grad_batches) == (config["trainer"]["max_steps"],
                                                                   config["trainer"].get("accumulate_grad_batches", 1))
    if experiment in PAPER_SIZES:
        data, steps = config["data"]["init_args"], trainer.accumulate_grad_batches * config["trainer"]["devices"]
        assert data["seq_len"] * data["batch_size"] * steps == 2 ** 19
        with torch.device("meta"):
            model = LanguageModel(32000, **{k: v for k, v in config["model"].items() if k in (
                "preset", "d_model", "n_layers", "n_heads", "memory_heads", "swa_window")})
        assert model.num_parameters() == PAPER_SIZES[experiment]


def test_the_model_keys_are_the_fields_of_model_config_and_its_checkpoint_rebuilds_them(workdir):
    """`model.<field>` for every ModelConfig field (LanguageModel's arguments, written once), beside SequenceModel's
    own; the module's hyper-parameters hold every field, so a checkpoint rebuilds the same LanguageModel."""
    import dataclasses

    from atlas_lab.lit import SequenceModel
    from atlas_lab.models import ModelConfig

    cli = check_config([*tiny_mqar(), "--model.mlp_hidden=24", "--model.persistent_tokens=2"])
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    assert set(fields) <= set(cli.config["model"].keys()) and cli.model.model.config.mlp_hidden == 24
    assert {k: cli.model.hparams[k] for k in fields} == dataclasses.asdict(cli.model.model.config)
    rebuilt = SequenceModel(**{k: v for k, v in cli.model.hparams.items() if not k.startswith("_")})
    assert rebuilt.model.config == cli.model.model.config
    assert SequenceModel(16, "gla", d_model=8, n_heads=2).model.config.preset == "gla"  # by position, as LanguageModel


def test_a_run_is_tracked_in_mlflow_with_its_resolved_config(workdir):
    cli = run_cli(["fit", *tiny_mqar(logger=True), "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
                   "--trainer.callbacks=[{class_path: atlas_lab.lit.module.LearningRates}]"])
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    run = client.get_run(cli.trainer.logger.run_id)
    assert {"train/loss", "val/loss", "val/acc", "val/acc/L16-N2"} <= set(run.data.metrics)
    # one learning-rate line per rate (mqar.yaml sets memory_lr apart from lr), named after its hyper-parameter
    assert sorted(m for m in run.data.metrics if "lr" in m) == ["train/lr", "train/memory_lr"]
    assert run.data.metrics["train/memory_lr"] != run.data.metrics["train/lr"]
    # params: the flattened resolved config, once (not the module's hyper-parameters again under other names)
    params = run.data.params
    assert params["model.preset"] == "titans" and params["data.init_args.seed"] == "0"
    assert not {"lr", "preset", "memory_lr"} & set(params) and not any("/" in k for k in params)
    config = client.download_artifacts(run.info.run_id, "config.yaml", str(workdir))
    assert "preset: titans" in Path(config).read_text()


@pytest.mark.parametrize("max_steps,validate_at_end,logged_at", [(4, "true", [1, 3]), (3, "true", [1, 2]),
                                                                 (3, "false", [1])])
def test_a_fit_is_validated_once_at_its_end(workdir, max_steps, validate_at_end, logged_at):
    """Validations every 2 steps: a fit of 4 steps ends on one and is not validated twice; a fit of 3 is validated
    once more at its end (its metrics, logged and returned, are those of the model as trained), unless
    validate_at_end is false. A validation is logged at the step of the batch before it (MLflow steps from 0)."""
    cli = run_cli(["fit", *tiny_mqar(logger=True), "--trainer.val_check_interval=2",
                   f"--trainer.max_steps={max_steps}", f"--validate_at_end={validate_at_end}"])
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    history = client.get_metric_history(cli.trainer.logger.run_id, "val/loss")
    assert [m.step for m in history] == logged_at and cli.trainer.global_step == max_steps
    assert float(cli.trainer.callback_metrics["val/loss"]) == pytest.approx(history[-1].value)


def tiny_mqar(logger=False):
    return ["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=titans", "--model.d_model=16",
            "--model.n_layers=1", "--model.n_heads=2", "--model.memory_heads=2", "--model.warmup_steps=2",
            "--data.init_args.train_slices=[[16, 2, 64]]", "--data.init_args.test_slices=[[16, 2, 16]]",
            "--data.init_args.batch_size=16", "--model.schedule_steps=12",
            *([] if logger else ["--trainer.logger=false"]), *quiet()]


def test_checkpoint_resume_continues_like_an_uninterrupted_run(workdir):
    straight = run_cli(["fit", *tiny_mqar(), "--trainer.max_epochs=3", "--trainer.enable_checkpointing=false"])
    first = run_cli(["fit", *tiny_mqar(), "--trainer.max_epochs=1", "--trainer.default_root_dir=ck"])
    ckpt = shutil.copy(next(Path("ck").rglob("*.ckpt")), "first.ckpt")  # the resumed run replaces its files
    resumed = run_cli(["fit", *tiny_mqar(), "--trainer.max_epochs=3", "--trainer.default_root_dir=ck",
                       f"--ckpt_path={ckpt}"])  # with the checkpoint callback (and folder) its checkpoint holds
    assert first.trainer.global_step * 3 == straight.trainer.global_step == resumed.trainer.global_step
    for key in ("train/loss", "val/loss", "val/acc"):
        a, b = straight.trainer.callback_metrics[key], resumed.trainer.callback_metrics[key]
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (key, a, b)
    # the checkpoint rebuilds the model on its own: the linked vocab size is among its hyper-parameters
    from atlas_lab.lit import SequenceModel
    model = SequenceModel.load_from_checkpoint(ckpt)
    assert model.hparams.vocab_size == 64 and model.hparams.preset == "titans"


def test_a_resumed_fit_continues_the_mlflow_run_of_its_checkpoint(workdir):
    """A fit stopped after an epoch (4 steps) and resumed from its last checkpoint for a second logs into one run:
    every step once; a fit given a checkpoint of another store starts a run of its own."""
    save = ["--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
            "init_args: {save_last: true}}]", "--trainer.log_every_n_steps=1"]
    first = run_cli(["fit", *tiny_mqar(logger=True), *save, "--trainer.max_epochs=1"])
    resumed = run_cli(["fit", *tiny_mqar(logger=True), *save, "--trainer.max_epochs=2",
                       "--ckpt_path=runs/checkpoints/last.ckpt"])
    assert resumed.trainer.logger.run_id == first.trainer.logger.run_id and resumed.trainer.global_step == 8
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    (run,) = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(8))
    assert run.info.status == "FINISHED"
    shutil.copy("runs/checkpoints/last.ckpt", "resumed.ckpt")
    other = run_cli(["fit", *tiny_mqar(logger=True), *save, "--trainer.max_epochs=3", "--ckpt_path=resumed.ckpt",
                     "--trainer.logger.init_args.tracking_uri=sqlite:///other/mlflow.db"])
    assert other.trainer.logger.run_id != run.info.run_id


@pytest.mark.parametrize("mixer", ["atlas", "atlas_mag", "transformer"])
def test_memory_lr_applies_to_the_memory_mixers_only(mixer):
    from atlas_lab.layers import MemoryMixer
    from atlas_lab.lit import SequenceModel

    model = SequenceModel(vocab_size=16, preset=mixer, d_model=16, n_layers=2, n_heads=2, lr=1e-3, memory_lr=5e-3)
    groups = model.parameter_groups()
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    memory = {id(p) for m in model.modules() if isinstance(m, MemoryMixer) for p in m.parameters()}
    assert bool(memory) == (mixer != "transformer")
    for g in groups:
        assert {id(p) in memory for p in g["params"]} == {g["lr"] == 5e-3}
        assert g["weight_decay"] == (0.1 if g["params"][0].dim() >= 2 else 0.0)
    embedding = model.model.embed.weight
    assert [g["lr"] for g in groups if any(p is embedding for p in g["params"])] == [1e-3]
    default = SequenceModel(vocab_size=16, preset=mixer, d_model=16, n_layers=2, n_heads=2, lr=1e-3)
    assert {g["lr"] for g in default.parameter_groups()} == {1e-3}
    frozen = SequenceModel(vocab_size=16, preset=mixer, d_model=16, n_layers=2, n_heads=2, lr=1e-3, memory_lr=0.0)
    assert {g["lr"] for g in frozen.parameter_groups()} == ({0.0, 1e-3} if memory else {1e-3})  # 0 is a rate


# Mixed precision: one preset per memory family (linear, gated linear, delta rule, MLP with momentum, Omega window,
# Muon with polynomial features, a hybrid)
FAMILIES = ["linear_attention", "gla", "deltanet", "titans", "omeganet", "atlas", "atlas_mag"]


@pytest.mark.parametrize("mixer", FAMILIES)
def test_bf16_mixed_training_is_finite_and_close_to_float32(workdir, mixer):
    """`--trainer.precision=bf16-mixed` trains like 32-true: 12 steps on the same batches reach a training loss
    within 2 % of float32's (the projections are bf16; the memory rule stays float32)."""
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        cli = run_cli(["fit", *tiny_mqar(), f"--model.preset={mixer}", "--trainer.max_steps=12",
                       "--trainer.limit_val_batches=0", f"--trainer.precision={precision}"])
        losses[precision] = float(cli.trainer.callback_metrics["train/loss"])
    assert all(map(math.isfinite, losses.values())), losses
    assert abs(losses["bf16-mixed"] - losses["32-true"]) <= 0.02 * losses["32-true"], losses


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mixer", ["deltanet", "atlas"])
def test_under_autocast_the_memory_rule_runs_in_float32(mixer, dtype, monkeypatch):
    """Autocast lowers the projections, never the memory rule: memorize gets float32 tensors with autocast off, and
    the state it returns is float32."""
    from atlas_lab.layers import MemoryMixer, memory_mixer
    from atlas_lab.lit import SequenceModel

    seen = []

    def spy(q, k, v, config, **kwargs):
        tensors = [q, k, v, *kwargs["initial_state"].values(), *(g for g in kwargs.values() if torch.is_tensor(g))]
        seen.append(({t.dtype for t in tensors}, torch.is_autocast_enabled("cpu")))
        return real(q, k, v, config, **kwargs)

    real = memory_mixer.memorize
    monkeypatch.setattr(memory_mixer, "memorize", spy)
    torch.manual_seed(0)
    model = SequenceModel(vocab_size=32, preset=mixer, d_model=32, n_layers=1, n_heads=2, memory_heads=4)
    layer = next(m for m in model.modules() if isinstance(m, MemoryMixer))
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        out, cache = layer(torch.randn(2, 24, 32))
        assert layer.q_proj(torch.randn(2, 32)).dtype == dtype  # the projections are lowered
    assert seen == [({torch.float32}, False)]
    assert all(w.dtype == torch.float32 for w in cache["state"].weights.values()) and torch.isfinite(out).all()


def test_the_model_summary_shows_the_flops_per_token_at_the_training_length(workdir, capsys):
    """lightning_config.yaml's ModelSummary: Lightning's table, then the memory's and attention's forward FLOPs per
    token at the longest training sequence (MQAR: T = 64 in experiments/mqar.yaml's largest slice)."""
    from atlas_lab.memory.cost import flops_text

    cli = run_cli(["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--trainer.fast_dev_run=true",
                   "--data.init_args.batch_size=1"])
    out = capsys.readouterr().out
    train = cli.datamodule.datasets["train"].input_ids
    T = max(len(x) for x in train)
    flops = cli.model.model.flops_per_token(T)
    assert f"forward FLOPs per token at T = {T}" in out
    assert f"memory {flops_text(flops['memory'])}, attention {flops_text(flops['attention'])}" in out
    assert flops["memory"] > 0 and "Total params" in out


@pytest.mark.parametrize("preset", ["deltanet", "atlas", "atlas_mag"])
def test_evaluation_in_streaming_pieces_equals_one_call(preset):
    """eval_piece 5: a 23-token batch evaluated in pieces of 5 with the streaming cache carried gives the logits of one
    call (float64: the same sums in another order, far below 1e-10); in training it is always one call."""
    from atlas_lab.lit.module import SequenceModel

    torch.manual_seed(0)
    module = SequenceModel(vocab_size=64, preset=preset, d_model=16, n_layers=2, n_heads=2, swa_window=4,
                           eval_piece=5).double().eval()
    x = torch.randint(0, 64, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pieces = module(x)
        module.hparams.eval_piece = 0
        whole = module(x)
    assert ((pieces - whole).norm() / whole.norm()).item() < 1e-10
    module.hparams.eval_piece = 5
    assert [h.shape[1] for h in module.model.hidden_pieces(x, 5)] == [5, 5, 5, 5, 3]


def test_model_memory_is_typed_for_the_parser_and_a_component_option_joins_a_short_hand(workdir):
    """model.memory's keys are the parser's to check (its line names the unknown key, then the valid ones), its
    values MemoryConfig's (the range and the choices, whether the config file or an argument gives them); a
    component's option on the command line joins the short-hand a config file gives, or the preset's component."""
    from atlas_lab.configfiles import ConfigError

    Path("eta.yaml").write_text("model:\n  memory:\n    eta: fast\n")
    for args, line in [(["--model.memory.windw=3"], "model.memory.windw: unknown key; valid keys: architecture"),
                       (["--model.memory.window=wide"], "model.memory.window: expected an int >= 1 or null"),
                       (["-c", "eta.yaml"], "model.memory.eta: expected")]:
        with pytest.raises(ConfigError, match=line):
            check_config([*tiny_mqar(), *args])
    Path("muon.yaml").write_text("model:\n  memory:\n    optimizer: muon\n")
    cli = check_config([*tiny_mqar(), "-c", "muon.yaml", "--model.memory.optimizer.ns_steps=3"])
    assert cli.model.model.memory_config.optimizer == {"name": "muon", "ns_steps": 3}
    cli = check_config([*tiny_mqar(), "--model.preset=atlas", "--model.memory.optimizer.ns_steps", "2"])
    assert cli.model.model.memory_config.components()[3].ns_steps == 2
