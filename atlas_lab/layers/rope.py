"""Rotary position embedding (RoPE) on q, k."""
from __future__ import annotations

import torch


def rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by angle p·base^(−2i/d). x: [B, T, H, d]; positions: [T]."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float32) * 2 / d)
    angle = positions.to(torch.float32)[:, None] * inv  # [T, d/2]
    cos, sin = angle.cos()[None, :, None, :].to(x.dtype), angle.sin()[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
