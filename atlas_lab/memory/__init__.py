"""The memory engine: components, the reference loop, the chunked path and the ``memorize`` op."""
from .feature_maps import FEATURE_MAPS, apply_feature_map, feature_dim, polynomial, taylor_coefficients
from .memories import (ACTIVATIONS, MEMORIES, OBJECTIVES, GatedMLPMemory, LinearMemory, MLPMemory, ModuleMemory,
                       build_memory)
from .op import READS, memorize
from .optimizers import NS_COEFFICIENTS, OPTIMIZERS, newton_schulz
from .state import MemoryState

__all__ = [
    "memorize", "MemoryState", "newton_schulz", "polynomial", "apply_feature_map", "feature_dim",
    "taylor_coefficients", "build_memory", "LinearMemory", "MLPMemory", "GatedMLPMemory", "ModuleMemory",
    "FEATURE_MAPS", "MEMORIES", "OBJECTIVES", "OPTIMIZERS", "NS_COEFFICIENTS", "ACTIVATIONS", "READS",
]
