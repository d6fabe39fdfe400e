"""Compile every launch of the chunk kernel for sm_90 (H100 / H200) without a GPU and print what each program needs.

    python tests/kernels/sm90_resources.py [D DV CHUNK BIAS DTYPE PRECISION] ...   (e.g. 64 64 64 l2 float32 tf32)

``triton.compile`` lowers each kernel, with the constexprs and launch options ``launch_options`` gives the autograd
function, to a cubin through the ptxas that ships with triton; cuobjdump reads its registers and spill stack. No
device is touched, so the numbers are the compiler's, not a measurement of speed. A launch whose shared memory
exceeds what one block may use (SHARED_LIMIT) would fail with OutOfResources on the GPU; ``tests/kernels/
test_kernels.py::test_every_launch_compiles_for_sm90`` (slow) checks that none does. Runs with TRITON_INTERPRET unset
(the kernels must be JIT functions, not the interpreter's).
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile

SHARED_LIMIT = 232_448  # bytes of shared memory one block may use on sm_90 (227 KB)
INPUTS = {"Q", "K", "V", "GAMMA", "A", "M", "S", "CW", "CS", "W0", "S0", "WE0", "Y", "DY"}  # the caller's dtype
INTS = {"N", "T", "L", "m0", "offset", "b", "c", "NC", "NK"}
CASES = [  # D, d_v, chunk, bias, dtype, dot precision: the table's shapes and the largest blocks
    (64, 64, 64, "l2", "float32", "tf32"), (64, 64, 64, "l2", "bfloat16", "ieee"),
    (64, 64, 16, "l2", "float32", "tf32"), (256, 64, 64, "l2", "float32", "tf32"),
    (256, 64, 64, "dot", "float32", "ieee"), (153, 16, 16, "l2", "float32", "tf32"),
]


def resources(D, DV, chunk, bias, dtype, prec, momentum=True) -> dict[str, tuple[int, int, int]]:
    """{kernel: (shared memory bytes, registers per thread, spill stack bytes)} of one call's launches."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_linear_memory.triton")
    torch_dtype = getattr(torch, dtype)
    pointer = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}[torch_dtype]
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {}
    for name, opts in kernels.launch_options(D, DV, chunk, bias, momentum, torch_dtype, prec).items():
        fn = getattr(kernels, name)
        signature, constexprs = {}, {}
        for p in fn.params:
            if p.is_constexpr:
                signature[p.name], constexprs[p.name] = "constexpr", opts[p.name]
            else:
                signature[p.name] = "i32" if p.name in INTS else (pointer if p.name in INPUTS else "*fp32")
        compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"]))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True)
        line = next(x for x in usage.stdout.splitlines() if "REG:" in x)
        out[name] = (compiled.metadata.shared, int(re.search(r"REG:(\d+)", line).group(1)),
                     int(re.search(r"STACK:(\d+)", line).group(1)))
    return out


def main(argv: list[str]) -> int:
    cases = [(int(a), int(b), int(c), d, e, f) for a, b, c, d, e, f in zip(*[iter(argv)] * 6)] or CASES
    over = 0
    print("| D | d_v | chunk | bias | dtype | dots | kernel | shared memory (bytes) | registers | spill stack "
          "(bytes) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        for name, (shared, regs, stack) in resources(*case).items():
            over += shared > SHARED_LIMIT
            print("| " + " | ".join(map(str, case)) + f" | {name} | {shared:,} | {regs} | {stack:,} |", flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
