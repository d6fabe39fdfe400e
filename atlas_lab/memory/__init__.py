"""The memory engine: components, the reference loop, the chunked path and the ``memorize`` op."""
from .check import check_against_reference
from .components import Component
from .feature_maps import FEATURE_MAPS, FeatureMap, Identity, Polynomial, Taylor, build_feature_map, polynomial, \
    taylor_coefficients
from .memories import (ACTIVATIONS, MEMORIES, GatedMLPMemory, LinearMemory, Memory, MLPMemory, ModuleMemory,
                       build_memory)
from .attentional_biases import ATTENTIONAL_BIASES, L2, Dot, Huber, Lp, AttentionalBias, build_attentional_bias
from .config import COMPONENTS, Gate, MemoryConfig
from .learning_rules import (KDA, GDN2, LEARNING_RULES, ChunkCommit, DeltaProduct, GateSpec, LearningRule, Longhorn,
                             Online, Steps, Token, build_learning_rule)
from .op import memorize
from .ops.newton_schulz.reference import NS_COEFFICIENTS, newton_schulz
from .optimizers import (GD, OPTIMIZERS, Adam, KLRetention, LinearOptimizer, LqRetention, MemoryOptimizer, Momentum,
                         Muon, TransformedAccumulator, TransformedMomentum, build_optimizer)
from .state import MemoryState

__all__ = [
    "memorize", "check_against_reference", "MemoryState", "newton_schulz", "polynomial", "taylor_coefficients",
    "MemoryConfig", "Gate", "COMPONENTS",
    "LearningRule", "GateSpec", "Steps", "Token", "Online", "KDA", "GDN2", "DeltaProduct", "ChunkCommit", "Longhorn",
    "build_learning_rule",
    "Component", "Memory", "LinearMemory", "MLPMemory", "GatedMLPMemory", "ModuleMemory", "build_memory",
    "FeatureMap", "Identity", "Polynomial", "Taylor", "build_feature_map",
    "AttentionalBias", "L2", "Dot", "Huber", "Lp", "build_attentional_bias",
    "MemoryOptimizer", "LinearOptimizer", "TransformedMomentum", "TransformedAccumulator", "GD", "Momentum", "Muon",
    "Adam",
    "LqRetention", "KLRetention", "build_optimizer",
    "FEATURE_MAPS", "MEMORIES", "LEARNING_RULES", "ATTENTIONAL_BIASES", "OPTIMIZERS", "NS_COEFFICIENTS", "ACTIVATIONS",
]
