"""Language-model backbone and the named presets (atlas, titans, deltanet, transformer, ...)."""
from .lm import Block, LanguageModel, SwiGLU
from .presets import LAYER_KINDS, PRESETS, resolve_preset

__all__ = ["LanguageModel", "Block", "SwiGLU", "PRESETS", "LAYER_KINDS", "resolve_preset"]
