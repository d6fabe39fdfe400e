"""Token mixers and building blocks: memory mixer, attention (full / sliding window), hybrids, conv."""
from .attention import Attention
from .conv import ShortConv
from .hybrid import MAG
from .memory_mixer import GATES, MemoryConfig, MemoryMixer
from .rope import rotary

__all__ = ["Attention", "ShortConv", "MAG", "MemoryConfig", "MemoryMixer", "GATES", "rotary"]
