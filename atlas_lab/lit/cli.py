"""LightningCLI for ``atlas-lab fit|validate|test``: one run from YAML configs and dotted overrides.

Bad input never half-runs: the config files are read, the arguments parsed, and the data module and model built
(and, for a run, the data set up) before the MLflow store, a run or a checkpoint is created. A problem found on the
way is a ``ConfigError``: one line that names the key, what was expected and what was given.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import sys
import traceback
from pathlib import Path

import jsonargparse
import lightning as L
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback, instantiate_class
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..configfiles import ConfigError, add_renamed, check_classes, check_config_files, check_values
from ..memory.config import COMPONENTS, with_option
from ..store import artifact_root, init_store, resolve_uri
from .module import CheckpointOnSigterm, RunCost, SequenceModel, ValidateAtEnd

EVALUATIONS = ("validate", "test")  # the subcommands that score a trained model
JSONARGPARSE = Path(jsonargparse.__file__).parent  # its code: an exception raised there wraps the one below it


RUN_RANGES = {  # run options that Lightning takes unchecked and fails on mid-run: (holds, what is expected)
    "seed_everything": (lambda x: isinstance(x, bool) or 0 <= x < 2**32, "true, false or an int in [0, 2^32)"),
    "trainer.accumulate_grad_batches": (lambda x: x >= 1, "an int >= 1"),
    "trainer.check_val_every_n_epoch": (lambda x: x is None or x >= 1, "null or an int >= 1"),
    "trainer.log_every_n_steps": (lambda x: x is None or x >= 1, "null or an int >= 1 (Lightning's 0 logs no step)"),
}


# --model.memory.<component>.<option>=<value>: one option of a memory component (MemoryConfig.replace's dotted form)
# (``--model.memory.<component>.init_args.<option>``: LightningCLI's form, for a class given by class_path)
COMPONENT_OPTION = re.compile(r"--model\.memory\.(\w+\.(?:init_args\.)?\w+)(?:=(.*))?$")


def component_options(args: list[str]) -> tuple[list[str], dict]:
    """The command line without its ``--model.memory.<component>.<option>`` arguments, and those as
    {"<component>.<option>": value} (YAML values), to be applied after the config files and the other arguments:
    a component given as a short-hand (``optimizer: muon``) keeps its name and gains the option.

    The one place that reads the command line before the parser: jsonargparse 4.53 sets ``--a.b.c=v`` into a
    mapping ``a`` by replacing a ``b`` that is not itself a mapping (``b: muon`` becomes ``b: {c: v}``, its
    name lost), and no public type of it turns a short-hand into a mapping with the value it had before."""
    rest, options, i = [], {}, 0
    while i < len(args):
        match = COMPONENT_OPTION.match(args[i])
        if match is None:
            rest.append(args[i])
        else:
            value = match.group(2)
            if value is None:
                i += 1
                value = args[i] if i < len(args) else ""
            options[match.group(1)] = yaml.safe_load(value)
        i += 1
    return rest, options


def with_options(memory: dict, options: dict) -> dict:
    """The memory changes with the components' options (``component_options``) set: a component the changes give
    (a short-hand or a mapping) gains the option, another is given as a mapping of options of the preset's
    (``{ns_steps: 3}``: MemoryConfig.replace); a key that names no component stays as given, for the parser to
    refuse."""
    memory = dict(memory)
    for key, value in options.items():
        field, option = key.split(".", 1)
        if field in COMPONENTS:
            memory[field] = with_option(memory.get(field, {}), option, value, f"model.memory.{field}")
        else:
            memory[key] = value
    return memory


def raised_by(e: BaseException) -> BaseException:
    """The exception a bad value raised, below the ones jsonargparse raises around it as it builds a class: the
    first in ``e``'s chain (``__cause__``, else ``__context__``) raised outside jsonargparse's own code."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        frames = traceback.extract_tb(e.__traceback__)
        inner = e.__cause__ or e.__context__
        if inner is None or not frames or not Path(frames[-1].filename).is_relative_to(JSONARGPARSE):
            return e
        e = inner
    return e


def _reason(e: Exception) -> str:
    """A bad value's exception as the line to print. The project's ValueErrors start with their argument's name:
    the model's as ``model.<key>``, a data module's as ``<key>``, shown here as ``data.init_args.<key>``."""
    e = raised_by(e)
    if type(e) is not ValueError:
        return f"{type(e).__name__}: {e}"
    text = flat(str(e))
    return text if text.startswith("model.") or not re.match(r"\w+: ", text) else f"data.init_args.{text}"


def flat(message: str) -> str:
    """A message of several lines as one: its lines stripped, joined by a space."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


@contextlib.contextmanager
def config_errors():
    """A bad value met while building or setting up (ValueError, TypeError, a missing file, Lightning's
    MisconfigurationException) re-raised as its one-line ConfigError."""
    try:
        yield
    except ConfigError:
        raise
    except (ValueError, TypeError, FileNotFoundError, MisconfigurationException) as e:
        raise ConfigError(_reason(e)) from None


class RunLogger(MLFlowLogger):
    """Lightning's MLFlowLogger, which first creates and migrates a fresh database store once, under its lock
    (several commands may start at once on one store), and leaves the run's params to ``SaveConfigToTracking`` (the
    flattened resolved config, once) instead of logging the module's hyper-parameters a second time under other
    names. The CLI builds it only once data and model are known to be good, so a bad value writes nothing; it puts
    it in place of ``lightning.pytorch.loggers.MLFlowLogger``."""

    def __init__(self, *args, tracking_uri: str | None = None, **kwargs):
        if tracking_uri:
            tracking_uri = resolve_uri(tracking_uri)
            init_store(tracking_uri)
        super().__init__(*args, tracking_uri=tracking_uri, **kwargs)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """Called once as the fit starts: a run that is continued (a resumed fit) is RUNNING again, and the last step
        of each of its metrics is read (``log_metrics``)."""
        self.logged_until = {}
        run = self.experiment.get_run(self.run_id)
        if run.info.status != "RUNNING":
            self.experiment.update_run(self.run_id, status="RUNNING")
        for key in run.data.metrics:
            self.logged_until[key] = max(m.step for m in self.experiment.get_metric_history(self.run_id, key))

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        """Lightning's, without the values of a step the run already holds: a fit resumed from a checkpoint older
        than its last logged step (a process killed after the checkpoint) trains those steps again, to the same
        values, and each step stays logged once."""
        until = getattr(self, "logged_until", {})
        metrics = {k: v for k, v in metrics.items() if (step or 0) > until.get(k, -1)}
        if metrics:
            super().log_metrics(metrics, step)

    def finalize(self, status: str = "success") -> None:
        """A fit ended by a signal (SIGTERM, Ctrl-C) ends its run KILLED, not FAILED."""
        if status == "failed" and isinstance(sys.exc_info()[1], (SIGTERMException, KeyboardInterrupt)):
            status = "KILLED"
        super().finalize(status)


def flatten(config, prefix: str = "") -> dict[str, str]:
    """A resolved config (nested dicts/Namespaces) as {dotted.key: str(value)}: the run's MLflow params."""
    items = config.items() if isinstance(config, dict) else vars(config).items()
    out = {}
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, dict) or hasattr(value, "__dict__") and type(value).__name__ == "Namespace":
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


class SaveConfigToTracking(SaveConfigCallback):
    """Saves the resolved config: in MLflow as the run's params (``flatten``: ``model.lr``, ``data.init_args.seed``,
    each once) and ``config.yaml`` (the file-based saver cannot write next to a database tracking URI), or as a file
    in the log directory without MLflow."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """MLflow is imported only when a logger writes to it: a fit with ``--trainer.logger=false`` never imports
        it."""
        text = self.parser.dump(self.config, skip_none=False)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                from mlflow.entities import Param

                client, run_id = logger.experiment, logger.run_id
                logged = client.get_run(run_id).data.params  # a resumed run keeps its params
                params = [Param(k, v) for k, v in flatten(self.config).items() if k not in logged]
                for i in range(0, len(params), 100):
                    client.log_batch(run_id, params=params[i:i + 100])
                client.log_text(run_id, text, "config.yaml")
                return
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "config.yaml").write_text(text)

    def setup(self, trainer, pl_module, stage):
        if getattr(self, "already_saved", False):
            return
        # trainer.log_dir is a collective under DDP (rank 0 broadcasts it): every rank asks, rank 0 writes
        self.directory = Path(trainer.log_dir or trainer.default_root_dir)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True


def epoch_batches(trainer, batches: int) -> int:
    """The training batches of an epoch: the data's ``batches``, cut by ``trainer.limit_train_batches``."""
    limit = trainer.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    if isinstance(limit, float):
        return int(batches * limit)
    return batches


def _data_value(name: str, default, data):
    return getattr(data, name, default)


def _data_attribute(name, default=None):
    """A link's compute_fn reading one attribute of the data module; a partial of a module-level function, so
    that ``ddp_spawn`` can pickle the trainer's callbacks (the config saver holds the parser and its links)."""
    return functools.partial(_data_value, name, default)


def _is_class(value, suffix: str) -> bool:
    """Whether a config value is a class given by class_path (a Namespace or a dict) whose name ends in suffix."""
    return not isinstance(value, (bool, str, list)) and value is not None and \
        str(value.get("class_path", "")).endswith(suffix)


def task_name(config) -> str:
    """The task of a config, from its data class: ``atlas_lab.data.MQARDataModule`` -> ``mqar``."""
    return str(config["data"].get("class_path", "data")).rsplit(".", 1)[-1].removesuffix("DataModule").lower()


RULE_FIELDS = ("architecture", "feature_map", "attentional_bias", "optimizer", "learning_rule")  # a memory's components


def component_text(spec) -> str:
    """A component as a run records it: a short-hand (``muon``), a short-hand with options (``muon(ns_steps=3)``),
    a class path with its options (``myrules.ValueNormDelta(p=1.0)``), or an object's repr."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and "class_path" in spec:
        name, options = spec["class_path"], dict(spec.get("init_args") or {})
    elif isinstance(spec, dict) and "name" in spec:
        name, options = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    else:
        return repr(spec)
    return name + (f"({', '.join(f'{k}={v}' for k, v in options.items())})" if options else "")


def short_class(text: str) -> str:
    """A component's text with its class path cut to the class: ``myrules.ValueNormDelta(p=1.0)`` ->
    ``ValueNormDelta(p=1.0)``."""
    name, paren, options = text.partition("(")
    return name.rsplit(".", 1)[-1] + paren + options


def changed_components(model) -> dict[str, str]:
    """{field: component_text} of the memory components a run's model config (``model``: the parsed model section)
    sets other than its preset does; {} where they are the preset's, or the config does not build (the build then
    says why)."""
    from ..models import resolve_preset

    memory = model.get("memory")
    if not memory:
        return {}
    memory = memory if isinstance(memory, dict) else dict(memory)
    try:
        own, preset = resolve_preset(model["preset"], memory)[1], resolve_preset(model["preset"])[1]
    except (ValueError, TypeError, KeyError):
        return {}
    if own is None or preset is None:
        return {}
    out = {}
    for field in RULE_FIELDS:
        text = component_text(getattr(own, field))
        if text != component_text(getattr(preset, field)):
            out[field] = text
    return out


def readable_checkpoint(path: str) -> None:
    """ConfigError unless ``path`` loads as LightningCLI loads a checkpoint's hyper-parameters (``torch.load``, weights
    only); memory-mapped, so the tensors are not read."""
    import torch

    try:
        torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:
        try:  # the reason torch gives without mmap (mmap first refuses any file that is not a zip archive)
            torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ConfigError(f"--ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: {e})") from None


def resumed_run(ckpt_path: str | None, tracking_uri: str | None) -> str | None:
    """The MLflow run a fit resumed from ``ckpt_path`` continues: the run its checkpoint records
    (``SequenceModel.on_save_checkpoint``) where that run is in the store ``tracking_uri``; else None (a new run)."""
    if ckpt_path is None or tracking_uri is None or not Path(ckpt_path).is_file():
        return None
    import torch
    from mlflow.tracking import MlflowClient

    from ..store import run_exists, store_file

    recorded = torch.load(ckpt_path, map_location="cpu", mmap=True, weights_only=False).get("mlflow_run")
    if not recorded or recorded["tracking_uri"] != tracking_uri:
        return None
    store = store_file(tracking_uri)
    if store is not None and not store.is_file():
        return None
    return recorded["run_id"] if run_exists(MlflowClient(tracking_uri), recorded["run_id"]) else None


class AtlasCLI(LightningCLI):
    """The model is always ``SequenceModel``; the data module is chosen by ``data.class_path``.

    Linked from the instantiated data module into the model (and so saved in checkpoints):
    vocab_size, slice_names, bytes_per_token, target.

    A ModelCheckpoint without ``dirpath`` writes to ``<trainer.default_root_dir>/checkpoints`` (default ``runs``).
    The MLflow store keeps every run's artifacts in ``<artifact_root>/<run id>/artifacts``, beside the store
    whatever the run's root (``store.artifact_root``: runs/artifacts for runs/mlflow.db; MLflow fixes an experiment's
    artifact folder when the experiment is created, so a folder per root could not hold). Each MLflow run is named
    after its configuration, ``<subcommand>-<task>-<preset>``, followed by each memory component that differs from
    the preset's (``fit-mqar-deltanet learning_rule=ValueNormDelta(p=1.0)``), which the tag ``atlas_lab.components``
    records by class path and options (the params hold them as ``model.memory.<field>...``). A fit resumed from a
    checkpoint (``--ckpt_path``) continues the run the checkpoint records, where the store holds it (``resumed_run``).
    Every fit records its cost (``RunCost``).
    """

    def __init__(self, *args, **kwargs):
        strict = {"exit_on_error": False}  # a parse error raises, and becomes one ConfigError line
        kwargs.setdefault("parser_kwargs", {**strict, **{c: strict for c in ("fit", "validate", "test", "predict")}})
        # the model configures its own AdamW and schedule (SequenceModel.configure_optimizers): no --optimizer or
        # --lr_scheduler options to override it
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        """LightningCLI's parse of the command line without its memory components' options (``component_options``),
        its values checked first by their types (``check_values``, ``check_classes``: a bad one is its one line),
        those options added, and the run checked (``check_run``) before
        LightningCLI reads the hyper-parameters of a ``--ckpt_path`` checkpoint. With those options
        ``--print_config`` prints the config once they are added: the memory the run uses."""
        options, printing = {}, []
        if isinstance(args, list) or args is None:
            args, options = component_options(sys.argv[1:] if args is None else args)
            trees = check_config_files(args)
            check_values(args, trees)
            check_classes(args, trees, SequenceModel)
            printing = [a for a in args if a.partition("=")[0] == "--print_config"] if options else []
        try:
            super().parse_arguments(parser, [a for a in args if a not in printing] if printing else args)
            config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
            if options:
                with config_errors():
                    config["model"]["memory"] = with_options(config["model"].get("memory") or {}, options)
            if printing:  # parsed again with the memory the run uses, the last value of model.memory: printed
                super().parse_arguments(parser, [*args, f"--model.memory={json.dumps(config['model']['memory'])}"])
        except ArgumentError as e:  # what the checks above do not cover (an unknown key: one line already)
            raise ConfigError(flat(str(e))) from None
        self.check_run(config)

    def check_run(self, config) -> None:
        """The run options Lightning takes unchecked (``RUN_RANGES``) and the checkpoint to score or resume."""
        for key, (holds, expected) in RUN_RANGES.items():
            if not holds(config.get(key)):
                raise ConfigError(f"{key}: expected {expected}, got {config.get(key)!r}")
        self.check_checkpoint(config)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config["trainer"]
        root = Path(trainer.get("default_root_dir") or "runs")
        for callback in trainer.get("callbacks") or []:
            if _is_class(callback, "ModelCheckpoint") and callback["init_args"].get("dirpath") is None:
                callback["init_args"]["dirpath"] = str(root / "checkpoints")
        logger = trainer.get("logger")
        if _is_class(logger, "MLFlowLogger"):
            init = logger["init_args"]
            if init.get("tracking_uri"):
                init["tracking_uri"] = resolve_uri(init["tracking_uri"], create=False)
            if init.get("artifact_location") is None and not str(init.get("tracking_uri") or "").startswith("http"):
                init["artifact_location"] = str(artifact_root(init.get("tracking_uri")))
            changed = changed_components(config["model"])
            if changed:
                init["tags"] = {**(init.get("tags") or {}), "atlas_lab.components": "; ".join(
                    f"{field}={text}" for field, text in changed.items())}
            if init.get("run_name") is None:  # else MLflow draws a name from the seeded RNG: the same every run
                own = "".join(f" {field}={short_class(text)}" for field, text in changed.items())
                init["run_name"] = f"{self.subcommand or 'run'}-{task_name(config)}-{config['model']['preset']}{own}"
            if logger["class_path"] == "lightning.pytorch.loggers.MLFlowLogger":
                logger["class_path"] = f"{__name__}.{RunLogger.__name__}"

    def check_checkpoint(self, config) -> None:
        """validate/test score a checkpoint (``--ckpt_path``), or a freshly built model given ``--untrained=true``."""
        ckpt, untrained = config.get("ckpt_path"), config.get("untrained", False)
        subcommand = self.config.get("subcommand")
        if subcommand in EVALUATIONS:
            if ckpt is None and not untrained:
                raise ConfigError(f"{subcommand}: --ckpt_path is required: a checkpoint of a fit, e.g. "
                                  "runs/checkpoints/last.ckpt (or --untrained=true to score a freshly built model)")
            if ckpt is not None and untrained:
                raise ConfigError(f"{subcommand}: --ckpt_path and --untrained=true exclude each other")
        elif untrained:
            raise ConfigError(f"{subcommand}: --untrained applies to validate and test only")
        if ckpt is not None and ckpt not in ("best", "last", "hpc") and "://" not in ckpt and not Path(ckpt).is_file():
            raise ConfigError(f"--ckpt_path: no such checkpoint file: {ckpt}")
        if ckpt is not None and Path(ckpt).is_file():
            readable_checkpoint(ckpt)

    def build(self, stage: str | None) -> None:
        """Build data and model, with the logger held back (it creates the MLflow store); with a stage, set the
        data up and check the trainer against it. Raises ConfigError for a bad value; writes nothing."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        logger = config["trainer"].get("logger")
        held_back = _is_class(logger, "Logger")
        if held_back:
            config["trainer"]["logger"] = False
        try:
            with config_errors():
                self.config_init = self.parser.instantiate(self.config)
                built = self.config_init[self.subcommand] if self.subcommand else self.config_init
                self.datamodule, self.model = built["data"], built["model"]
        finally:
            config["trainer"]["logger"] = logger
        init = config["data"].get("init_args")
        for key, value in self.datamodule.hparams.items():  # as the data module records them: paths absolute
            if init is not None and key in init and isinstance(value, str):
                init[key] = value
        self.held_back_logger = logger if held_back else None
        if stage is not None:
            self.set_up(stage)

    def set_up(self, stage: str) -> None:
        """Set the built data up for ``stage`` (and, for fit, check the trainer's validation interval against it)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        with config_errors():
            self.datamodule.prepare_data()
            self.datamodule.setup(stage)
            if stage == "fit":
                self.check_val_interval(config["trainer"])

    def check_val_interval(self, trainer) -> None:
        """An int ``val_check_interval`` must fit in the epoch's training batches (Lightning checks it only after
        the run has started)."""
        every = trainer.get("val_check_interval")
        if not isinstance(every, int) or isinstance(every, bool) or trainer.get("check_val_every_n_epoch") is None:
            return
        batches = epoch_batches(trainer, len(self.datamodule.train_dataloader()))
        if every > batches:
            raise ConfigError(f"trainer.val_check_interval: {every} is more than the {batches} training batches of an "
                              f"epoch; expected at most {batches}, a fraction of the epoch (e.g. 0.5), or "
                              "--trainer.check_val_every_n_epoch=1 --trainer.val_check_interval=null")

    def instantiate_classes(self) -> None:
        """Build and check data and model (``build``), then the trainer, and only then the logger, which creates
        the MLflow store (a trainer that refuses its arguments writes nothing either)."""
        self.build({"fit": "fit", "validate": "validate", "test": "test"}.get(self.subcommand))
        with config_errors():
            self.trainer = self.instantiate_trainer()
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config["validate_at_end"]:  # first: its validation comes before the other callbacks end the fit
            self.trainer.callbacks.insert(0, ValidateAtEnd())
        if self.subcommand == "fit":
            self.trainer.callbacks.append(CheckpointOnSigterm())
        if self.subcommand in ("fit", None) and not any(isinstance(c, RunCost) for c in self.trainer.callbacks):
            self.trainer.callbacks.append(RunCost())  # None: a sweep trial's CLI, which fits
        logger = self.held_back_logger
        if logger is not None:
            init = logger.get("init_args") or {}
            init = dict(init) if isinstance(init, dict) else init.as_dict()
            if self.subcommand == "fit" and logger["class_path"] == f"{__name__}.{RunLogger.__name__}" \
                    and init.get("run_id") is None:
                init["run_id"] = resumed_run(config.get("ckpt_path"), init.get("tracking_uri"))
            self.trainer.loggers = [instantiate_class((), {"class_path": logger["class_path"], "init_args": init})]

    def add_arguments_to_parser(self, parser):
        parser.add_argument("--untrained", type=bool, default=False,
                            help="validate/test: score the freshly built model instead of a --ckpt_path checkpoint")
        parser.add_argument("--validate_at_end", type=bool, default=True,
                            help="fit: validate once more when the fit ends after steps no validation has seen (or "
                                 "before any validation), so the validation metrics are those of the trained model")
        add_renamed(parser)
        parser.link_arguments("data", "model.vocab_size", compute_fn=_data_attribute("vocab_size"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.slice_names", compute_fn=_data_attribute("slice_names"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.bytes_per_token", compute_fn=_data_attribute("bytes_per_token"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.target", compute_fn=_data_attribute("target", "next_token"),
                              apply_on="instantiate")


@contextlib.contextmanager
def command_line(args: list[str]):
    """``sys.argv[1:]`` set to ``args`` for the duration: LightningCLI parses the command line it is meant to (given no
    ``args``, so it does not warn that both were given), and Lightning's DDP launcher starts the other ranks with it."""
    saved = sys.argv[:]
    sys.argv[1:] = list(args)
    try:
        yield
    finally:
        sys.argv[:] = saved


def run_cli(args: list[str]) -> AtlasCLI:
    """``atlas-lab fit|validate|test ...``: LightningCLI with the project's defaults; returns the CLI (its
    trainer, model and data). Raises ConfigError, before anything is written, for a bad configuration; a fit stopped
    by SIGTERM prints one line (where it stopped, how to resume) and exits 143."""
    with command_line(args):
        try:
            return AtlasCLI(SequenceModel, L.LightningDataModule, subclass_mode_data=True,
                            save_config_callback=SaveConfigToTracking, save_config_kwargs={"overwrite": True})
        except SIGTERMException as e:  # CheckpointOnSigterm saved the fit
            print(getattr(e, "stopped", "stopped by SIGTERM"), file=sys.stderr)
            raise SystemExit(143) from None


class _Checked(AtlasCLI):
    """Parses and builds data and model, builds no trainer (``check_config``; ``set_up`` sets the data up)."""

    def instantiate_classes(self) -> None:
        self.build(None)


class ConfigChecker:
    """``check_config`` for many argument lists through one parser (building LightningCLI's parser costs a third of a
    check). Each call returns the same CLI object, holding the last check's ``config``, ``model`` and ``datamodule``."""

    def __init__(self):
        self.cli: _Checked | None = None

    def __call__(self, args: list[str]) -> AtlasCLI:
        if self.cli is None:
            self.cli = check_config(args)
            return self.cli
        with contextlib.redirect_stderr(io.StringIO()), command_line(args):
            self.cli.parse_arguments(self.cli.parser, None)
            self.cli.before_instantiate_classes()
            self.cli.build(None)
        return self.cli


def check_config(args: list[str]) -> AtlasCLI:
    """Parse LightningCLI arguments (config files and --dotted.key=value) and build the data module and the model
    without setting the data up or creating anything; returns the CLI (``.config``, ``.model``, ``.datamodule``;
    ``.set_up(stage)`` sets the data up).

    Raises ConfigError: one line naming the key, what was expected and what was given.
    """
    with contextlib.redirect_stderr(io.StringIO()), command_line(args):
        return _Checked(SequenceModel, L.LightningDataModule, subclass_mode_data=True, run=False,
                        save_config_callback=None)
