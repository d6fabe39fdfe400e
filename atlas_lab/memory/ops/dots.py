"""The kernels' products: ``tl.dot`` on tensor cores with fp32 accumulation, in the precision torch allows.

    dot(x, y, DT, PREC) = x @ y with both operands in dtype DT, accumulated in fp32
    dot_precision(dtype): PREC for inputs of ``dtype``

float32 runs on tf32 tensor cores when torch's float32 matmul precision allows it
(``torch.get_float32_matmul_precision()`` "high" or "medium", e.g. ``torch.backends.cuda.matmul.allow_tf32 = True``;
the GPU configs set it) and in IEEE fp32 at torch's default "highest", like torch's own float32 matmul; float16 and
bfloat16 operands are multiplied as passed (their products are exact in the fp32 accumulator).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@torch.compiler.assume_constant_result  # a compiled graph takes torch's setting as it was when it compiled
def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input_precision for inputs of ``dtype``: "tf32" for float32 when torch's float32 matmul precision
    allows it (anything but "highest"), "ieee" otherwise (half types ignore it: their products are exact in fp32)."""
    return "tf32" if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest" else "ieee"


@triton.jit
def dot(x, y, DT: tl.constexpr, PREC: tl.constexpr):
    """x @ y with both operands in the dtype DT, accumulated in fp32."""
    return tl.dot(x.to(DT), y.to(DT), input_precision=PREC)
