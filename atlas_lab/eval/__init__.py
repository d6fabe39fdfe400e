"""Evaluating a checkpoint of ``atlas-lab fit`` (docs/evaluation.md): lm-evaluation-harness tasks through the
registered model ``atlas-lab`` (harness.py) and perplexity by position (position.py), both reading text through the
model's streaming state; ``atlas-lab eval`` (command.py) prints them and logs them to MLflow.

Nothing is downloaded: importing this package sets HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 (unless set), before
the harness loads the ``datasets`` package, so tasks read local files (``--include-path``) or the local cache only.
"""
import os

for _name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    os.environ.setdefault(_name, "1")

from .checkpoint import Checkpoint, EvalError, checkpoint_tokenizer  # noqa: E402
from .harness import AtlasLM  # noqa: E402  (registers the harness's model "atlas-lab")
from .position import PositionCurve, ppl_by_position  # noqa: E402
from .scores import token_scores  # noqa: E402

__all__ = ["AtlasLM", "Checkpoint", "EvalError", "PositionCurve", "checkpoint_tokenizer", "ppl_by_position",
           "token_scores"]
