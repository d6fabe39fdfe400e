"""The one place where other packages' noise is filtered: warnings and log lines that tell a user of atlas-lab
nothing they can act on. The ``atlas-lab`` command applies them (``quiet``); the test suite turns ``WARNINGS``
into its own filters (tests/conftest.py). atlas-lab's own code raises no warning: fix one at its source.
"""
from __future__ import annotations

import builtins
import logging
import os
import re
import warnings

# (regex matched at the message's start, category name, why it is not ours to fix)
WARNINGS = [
    (r"\s*(``\w+(\.\w+)?``|\w+ parameter) was deprecated in v4\.\d+\.0", "DeprecationWarning",
     "LightningCLI calls jsonargparse APIs that jsonargparse deprecates"),
    (r"\s*By default only one JsonargparseDeprecationWarning", "DeprecationWarning", "the same, its footnote"),
    (r"The ``noload`` loader strategy is deprecated", "DeprecationWarning", "MLflow's SQLAlchemy store"),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", "FutureWarning", "Lightning's pytree helper, on torch's"),
    (r"Triton is not supported on current platform", "UserWarning", "triton imported on a machine without a GPU"),
    (r"LightningCLI's args parameter is intended to run from within Python", "UserWarning",
     "a sweep trial passes its config as args to LightningCLI in a worker or job whose own command line must stay as "
     "it is (Lightning's DDP launcher starts a job's other ranks from it)"),
    (r"Your `IterableDataset` has `__len__` defined", "UserWarning",
     "Lightning's caution for any iterable dataset with a length: litdata's StreamingDataset (StreamingLMDataModule) "
     "gives each worker and rank its own part, so its length is exact"),
    (r"Checkpoint directory .* exists and is not empty", "UserWarning",
     "each fit replaces last.ckpt on purpose (lightning_config.yaml: enable_version_counter: false)"),
]
# (logger, regex matched at the line's start, why): single log lines dropped
DROPPED_LINES = [("lightning.pytorch.utilities.rank_zero", r"💡 Tip: For seamless cloud (logging|uploads)",
                  "Lightning's advertisements for its litlogger and litmodels packages, on every fit and evaluation")]
# (environment variable, value, why): other packages' own switches, set unless the user has set them
ENVIRONMENT = [("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true",
                "MLflow prints '🏃 View run … at <server>' and '🧪 View experiment …' whenever a run ends through a "
                "tracking server: a sweep's server is stopped when the command ends, so the links lead nowhere; the "
                "sweep prints the command that serves its runs instead (atlas-lab ui --study NAME)")]
# loggers whose INFO lines only say what happened as planned
QUIET_LOGGERS = ("lightning.fabric.utilities.seed",  # "Seed set to 0", once per run and per checked grid point
                 "alembic.runtime.migration", "mlflow.store.db.utils")  # a fresh tracking store's schema migration


def quiet() -> None:
    """Apply ``WARNINGS`` as ignore filters, ``ENVIRONMENT`` (inherited by the processes the command starts), and
    raise ``QUIET_LOGGERS`` to WARNING."""
    for name, value, _ in ENVIRONMENT:
        os.environ.setdefault(name, value)
    for message, category, _ in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=getattr(builtins, category))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, pattern, _ in DROPPED_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.pattern == pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))


class _Drop(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return re.match(self.pattern, record.getMessage()) is None
