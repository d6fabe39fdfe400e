"""Token mixers and building blocks: memory mixer, attention (full / sliding window), hybrids, conv."""
from .attention import Attention
from .conv import ShortConv
from .hybrid import MAC, MAG, LaCT
from .memory_mixer import MemoryMixer
from .rope import rotary

__all__ = ["Attention", "ShortConv", "MAG", "MAC", "LaCT", "MemoryMixer", "rotary"]
