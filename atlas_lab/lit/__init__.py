"""LightningModules, metrics and the LightningCLI of atlas-lab."""
from .metrics import ExactMatch, SliceAccuracy, TokenMetrics
from .module import SequenceModel

__all__ = ["SequenceModel", "TokenMetrics", "SliceAccuracy", "ExactMatch"]
