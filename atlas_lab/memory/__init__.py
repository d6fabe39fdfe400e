"""The memory engine: components, the reference loop, the chunked path and the ``memorize`` op."""
from .check import check_against_reference
from .components import Component
from .feature_maps import FEATURE_MAPS, FeatureMap, Identity, Polynomial, Taylor, build_feature_map, polynomial, \
    taylor_coefficients
from .memories import (ACTIVATIONS, MEMORIES, GatedMLPMemory, LinearMemory, Memory, MLPMemory, ModuleMemory,
                       build_memory)
from .attentional_biases import ATTENTIONAL_BIASES, L2, Dot, Huber, Lp, AttentionalBias, build_attentional_bias
from .config import CHANNEL_GATES, COMPONENTS, GATE_INIT, GATES, STEP_GATES, Gate, MemoryConfig
from .op import memorize
from .optimizers import (GD, NS_COEFFICIENTS, OPTIMIZERS, Adam, KLRetention, LinearRule, LqRetention, MemoryOptimizer,
                         Momentum, Muon, TransformedAccumulator, TransformedMomentum, build_optimizer, newton_schulz)
from .state import MemoryState

__all__ = [
    "memorize", "check_against_reference", "MemoryState", "newton_schulz", "polynomial", "taylor_coefficients",
    "MemoryConfig", "Gate", "GATES", "CHANNEL_GATES", "STEP_GATES", "GATE_INIT", "COMPONENTS",
    "Component", "Memory", "LinearMemory", "MLPMemory", "GatedMLPMemory", "ModuleMemory", "build_memory",
    "FeatureMap", "Identity", "Polynomial", "Taylor", "build_feature_map",
    "AttentionalBias", "L2", "Dot", "Huber", "Lp", "build_attentional_bias",
    "MemoryOptimizer", "LinearRule", "TransformedMomentum", "TransformedAccumulator", "GD", "Momentum", "Muon", "Adam",
    "LqRetention", "KLRetention", "build_optimizer",
    "FEATURE_MAPS", "MEMORIES", "ATTENTIONAL_BIASES", "OPTIMIZERS", "NS_COEFFICIENTS", "ACTIVATIONS",
]
