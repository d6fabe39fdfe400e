"""LightningCLI for ``atlas-lab fit|validate|test``: one run from YAML configs and dotted overrides."""
from __future__ import annotations

import contextlib
import functools
import io
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from .module import SequenceModel

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"


def resolve_uri(uri: str | None, create: bool = True) -> str:
    """The tracking URI with a relative SQLite path made absolute, so that every process, whatever its folder,
    finds the same file (MLflow also caches stores by URI within a process); ``create`` makes its folder."""
    uri = uri or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        path = Path(uri[len(prefix):]).resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri

class StoreCreatingMLFlowLogger(MLFlowLogger):
    """Lightning's MLFlowLogger, which first creates and migrates a fresh database store once, under its lock
    (several commands may start at once on one store). Built after the model and data, so a bad value writes
    nothing; the CLI puts it in place of ``lightning.pytorch.loggers.MLFlowLogger``."""

    def __init__(self, *args, tracking_uri: str | None = None, **kwargs):
        if tracking_uri:
            from ..sweep.tracking import init_store  # (the sweep package imports this module)

            tracking_uri = resolve_uri(tracking_uri)
            init_store(tracking_uri)
        super().__init__(*args, tracking_uri=tracking_uri, **kwargs)


class SaveConfigToTracking(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml``: an MLflow artifact of the run (the file-based saver
    cannot write next to a database tracking URI), or a file in the log directory without MLflow."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_text(logger.run_id, text, "config.yaml")
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


def _data_value(name: str, default, data):
    return getattr(data, name, default)


def _data_attribute(name, default=None):
    """A link's compute_fn reading one attribute of the data module; a partial of a module-level function, so
    that ``ddp_spawn`` can pickle the trainer's callbacks (the config saver holds the parser and its links)."""
    return functools.partial(_data_value, name, default)


class AtlasCLI(LightningCLI):
    """The model is always ``SequenceModel``; the data module is chosen by ``data.class_path``.

    Linked from the instantiated data module into the model (and so saved in checkpoints):
    vocab_size, slice_names, bytes_per_token, target.
    """

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        logger = config["trainer"].get("logger")
        if logger and not isinstance(logger, bool) and str(logger.get("class_path", "")).endswith("MLFlowLogger"):
            uri = logger["init_args"].get("tracking_uri")
            if uri:
                logger["init_args"]["tracking_uri"] = resolve_uri(uri, create=False)
            if logger["class_path"] == "lightning.pytorch.loggers.MLFlowLogger":
                logger["class_path"] = f"{__name__}.{StoreCreatingMLFlowLogger.__name__}"

    def instantiate_classes(self) -> None:
        """Build data, model and trainer; a bad value met only now (a missing data path, an impossible size, a
        model field out of range) is one clear message and exit code 2, before any run is created."""
        try:
            super().instantiate_classes()
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        Path("runs").mkdir(exist_ok=True)  # the default tracking store and checkpoints live there

    def add_arguments_to_parser(self, parser):
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
    trainer, model and data)."""
    with command_line(args):
        return AtlasCLI(SequenceModel, L.LightningDataModule, subclass_mode_data=True,
                        save_config_callback=SaveConfigToTracking, save_config_kwargs={"overwrite": True})


class _ParseOnly(AtlasCLI):
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        logger = config["trainer"].get("logger")
        if isinstance(logger, dict) or hasattr(logger, "class_path"):
            path = logger["class_path"] if isinstance(logger, dict) else logger.class_path
            init = logger["init_args"] if isinstance(logger, dict) else logger.init_args
            uri = init.get("tracking_uri") if isinstance(init, dict) else getattr(init, "tracking_uri", None)
            if path.endswith("MLFlowLogger") and uri and uri.startswith("sqlite:///"):
                init["tracking_uri"] = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())

    def instantiate_classes(self) -> None:  # check the configuration, build nothing
        pass


def parse_config(args: list[str]):
    """Parse LightningCLI arguments (config files and --dotted.key=value) without building anything.

    Raises ValueError with the parser's message (the key, the expected type, the valid choices).
    """
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), command_line(args):
            cli = _ParseOnly(SequenceModel, L.LightningDataModule, subclass_mode_data=True, run=False,
                             save_config_callback=None)
    except SystemExit:
        text = err.getvalue()
        raise ValueError(text[text.find("error:") + 6:].strip() if "error:" in text else "invalid configuration") \
            from None
    return cli.config
