"""Language-model backbone and the named presets (atlas, titans, deltanet, transformer, ...)."""
from .lm import Block, LanguageModel, ModelConfig, SwiGLU, compile_blocks
from .presets import LAYER_KINDS, PRESETS, resolve_preset

__all__ = ["LanguageModel", "ModelConfig", "Block", "SwiGLU", "PRESETS", "LAYER_KINDS", "resolve_preset",
           "compile_blocks"]
