"""The memory engine: components, the reference loop, the chunked path and the ``memorize`` op."""
from .check import check_against_reference
from .components import Component
from .feature_maps import FEATURE_MAPS, FeatureMap, Identity, Polynomial, Taylor, build_feature_map, polynomial, \
    taylor_coefficients
from .memories import (ACTIVATIONS, MEMORIES, GatedMLPMemory, LinearMemory, Memory, MLPMemory, ModuleMemory,
                       build_memory)
from .objectives import OBJECTIVES, L2, Dot, Huber, Lp, Objective, build_objective
from .op import READS, build_components, memorize
from .optimizers import (GD, NS_COEFFICIENTS, OPTIMIZERS, Adam, KLRetention, LinearRule, LqRetention, MemoryOptimizer,
                         Momentum, Muon, TransformedAccumulator, TransformedMomentum, build_optimizer, newton_schulz)
from .state import MemoryState

__all__ = [
    "memorize", "check_against_reference", "MemoryState", "newton_schulz", "polynomial", "taylor_coefficients",
    "build_components",
    "Component", "Memory", "LinearMemory", "MLPMemory", "GatedMLPMemory", "ModuleMemory", "build_memory",
    "FeatureMap", "Identity", "Polynomial", "Taylor", "build_feature_map",
    "Objective", "L2", "Dot", "Huber", "Lp", "build_objective",
    "MemoryOptimizer", "LinearRule", "TransformedMomentum", "TransformedAccumulator", "GD", "Momentum", "Muon", "Adam",
    "LqRetention", "KLRetention", "build_optimizer",
    "FEATURE_MAPS", "MEMORIES", "OBJECTIVES", "OPTIMIZERS", "NS_COEFFICIENTS", "ACTIVATIONS", "READS",
]
