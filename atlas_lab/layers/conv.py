"""Short causal depthwise convolution (kernel 4) with a streaming cache."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ShortConv(nn.Module):
    """y_t = Σ_{j<K} w_j ⊙ x_{t−j} per channel; x: [B, T, C] -> [B, T, C].

    ``cache`` holds the last K−1 inputs [B, K−1, C] of the previous piece of a stream.
    """

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.randn(channels, 1, kernel_size) / kernel_size ** 0.5)
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None):
        if cache is None:
            cache = x.new_zeros(x.shape[0], self.kernel_size - 1, x.shape[-1])
        padded = torch.cat([cache, x], 1)
        y = F.conv1d(padded.transpose(1, 2), self.weight, self.bias, groups=x.shape[-1]).transpose(1, 2)
        return y, padded[:, -(self.kernel_size - 1):]
