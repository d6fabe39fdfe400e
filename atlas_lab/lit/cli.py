"""LightningCLI for ``atlas-lab fit|validate|test``: one run from YAML configs and dotted overrides."""
from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from .module import SequenceModel

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"


class SaveConfigToTracking(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml``: an MLflow artifact of the run (the file-based saver
    cannot write next to a database tracking URI), or a file in the log directory without MLflow."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_text(logger.run_id, text, "config.yaml")
                return
        directory = Path(trainer.log_dir or trainer.default_root_dir)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(text)

    def setup(self, trainer, pl_module, stage):
        if trainer.is_global_zero and not getattr(self, "already_saved", False):
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True


def _data_attribute(name, default=None):
    return lambda data: getattr(data, name, default)


class AtlasCLI(LightningCLI):
    """The model is always ``SequenceModel``; the data module is chosen by ``data.class_path``.

    Linked from the instantiated data module into the model (and so saved in checkpoints):
    vocab_size, slice_names, bytes_per_token, target.
    """

    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data", "model.vocab_size", compute_fn=_data_attribute("vocab_size"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.slice_names", compute_fn=_data_attribute("slice_names"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.bytes_per_token", compute_fn=_data_attribute("bytes_per_token"),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.target", compute_fn=_data_attribute("target", "next_token"),
                              apply_on="instantiate")


def run_cli(args: list[str]) -> None:
    """``atlas-lab fit|validate|test ...``: LightningCLI with the project's defaults."""
    os.makedirs("runs", exist_ok=True)
    AtlasCLI(SequenceModel, L.LightningDataModule, subclass_mode_data=True, args=args,
             save_config_callback=SaveConfigToTracking, save_config_kwargs={"overwrite": True})


class _ParseOnly(AtlasCLI):
    def instantiate_classes(self) -> None:  # check the configuration, build nothing
        pass


def parse_config(args: list[str]):
    """Parse LightningCLI arguments (config files and --dotted.key=value) without building anything.

    Raises ValueError with the parser's message (the key, the expected type, the valid choices).
    """
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli = _ParseOnly(SequenceModel, L.LightningDataModule, subclass_mode_data=True, run=False, args=args,
                             save_config_callback=None)
    except SystemExit:
        text = err.getvalue()
        raise ValueError(text[text.find("error:") + 6:].strip() if "error:" in text else "invalid configuration") \
            from None
    return cli.config
