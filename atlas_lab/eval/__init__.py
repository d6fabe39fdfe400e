"""Evaluating a checkpoint of ``atlas-lab fit`` (docs/evaluation.md): lm-evaluation-harness tasks through the
registered model ``atlas-lab`` (harness.py) and perplexity by position (position.py), both reading text through the
model's streaming state; ``atlas-lab eval`` (command.py) prints them and logs them to MLflow.

Nothing is downloaded: importing this package sets HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 (unless set), before
the harness loads the ``datasets`` package, so tasks read local files (``--include-path``) or the local cache only.

Importing this package registers the harness's model ``atlas-lab`` by name (lm_eval's registry imports
``atlas_lab.eval.harness`` when the model is first asked for) and imports nothing heavy: the names below are imported
when first used, so ``atlas-lab eval`` checks its arguments before torch, Lightning or the harness load.
"""
import os

from ..exports import lazy_exports

for _name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    os.environ.setdefault(_name, "1")

try:
    from lm_eval.api.registry import model_registry
except ModuleNotFoundError:  # without the lm extra: the harness's model is not registered
    pass
else:
    if "atlas-lab" not in model_registry:
        model_registry.register("atlas-lab", target="atlas_lab.eval.harness:AtlasLM")

EXPORTS = {"AtlasLM": "harness", "Checkpoint": "checkpoint", "EvalError": "arguments",
           "checkpoint_tokenizer": "checkpoint", "PositionCurve": "position", "ppl_by_position": "position",
           "token_scores": "scores"}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
