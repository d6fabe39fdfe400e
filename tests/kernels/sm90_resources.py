"""Compile every launch of the chunk kernel and the Newton–Schulz kernel for sm_90 (H100 / H200) without a GPU
and print what each program needs.

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


def compile_for_sm90(fn, types: dict, constexprs: dict, num_warps: int, num_stages: int) -> tuple[int, int, int]:
    """(shared memory bytes, registers per thread, spill stack bytes) of JIT function ``fn`` compiled for sm_90, its
    arguments typed by ``types`` (default *fp32) and its constexprs set."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    signature = {p.name: "constexpr" if p.is_constexpr else types.get(p.name, "*fp32") for p in fn.params}
    compiled = triton.compile(ASTSource(fn, signature, {n: constexprs[n] for n, t in signature.items()
                                                        if t == "constexpr"}),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                             num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True)
    line = next(x for x in usage.stdout.splitlines() if "REG:" in x)
    return (compiled.metadata.shared, int(re.search(r"REG:(\d+)", line).group(1)),
            int(re.search(r"STACK:(\d+)", line).group(1)))


def pointer(dtype: str) -> str:
    return {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16"}[dtype]


def resources(D, DV, chunk, bias, dtype, prec, momentum=True) -> dict[str, tuple[int, int, int]]:
    """{kernel: (shared memory bytes, registers per thread, spill stack bytes)} of one call's launches."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_linear_memory.triton")
    types = {**{n: "i32" for n in INTS}, **{n: pointer(dtype) for n in INPUTS}}
    return {name: compile_for_sm90(getattr(kernels, name), types, opts, opts["num_warps"], opts["num_stages"])
            for name, opts in kernels.launch_options(D, DV, chunk, bias, momentum, getattr(torch, dtype),
                                                     prec).items()}


NS_CASES = [  # rows, cols (after the transpose), dtype: an MLP memory's W1 at d 16, the largest the kernel takes
    (64, 153, "float32"), (128, 512, "float32"), (128, 512, "bfloat16"), (16, 64, "float32"),
]


def ns_resources(R, C, dtype, prec) -> dict[str, tuple[int, int, int]]:
    """{kernel: (shared memory, registers, spill stack)} of the Newton–Schulz forward and backward launches
    (5 quintic steps) for matrices of R × C with ``prec`` dots, with the operator's launch options
    (``launch_config``)."""
    os.environ.pop("TRITON_INTERPRET", None)
    ns = importlib.import_module("atlas_lab.memory.ops.newton_schulz.triton")
    config = ns.launch_config(R, C)
    types = {"G": pointer(dtype), **{n: "i32" for n in ("stride_gb", "stride_gr", "stride_gc", "R", "C", "M")},
             **{n: "fp32" for n in "abc"}, "eps": "fp32"}
    constexprs = dict(STEPS=5, QUINTIC=True, ONE_BLOCK=C <= config["BC"], BR=config["BR"], BC=config["BC"], PREC=prec)
    return {name: compile_for_sm90(getattr(ns, name), types, constexprs, config["num_warps"], config["num_stages"])
            for name in ("newton_schulz_fwd_kernel", "newton_schulz_bwd_kernel")}


MLP_CASES = [  # D, hidden, d_v, chunk, window, optimiser, bias, dtype: titans, omeganet and atlas at the study's sizes
    # (head dim 16; polynomial φ: D 153; atlas's in float32 and 16-bit operands), and the largest blocks
    # limits.MLP_ENTRIES admits
    (16, 64, 16, 16, 1, "momentum", "l2", "float32"), (153, 64, 16, 16, 8, "gd", "l2", "float32"),
    (153, 64, 16, 16, 8, "muon", "l2", "float32"), (153, 64, 16, 16, 8, "muon", "l2", "bfloat16"),
    (256, 64, 32, 16, 17, "gd", "l2", "float32"), (128, 64, 32, 16, 17, "momentum", "l2", "float32"),
    (256, 64, 32, 16, 17, "muon", "l2", "float32"), (256, 128, 32, 16, 17, "gd", "l2", "bfloat16"),
    (256, 64, 32, 16, 17, "momentum", "l2", "bfloat16"), (512, 64, 32, 16, 17, "muon", "l2", "bfloat16"),
    (256, 128, 32, 16, 17, "muon", "l2", "bfloat16"),
    # a gated first layer (Atlas++'s memory): its pair held as one block of twice the rows
    (128, 64, 16, 16, 8, "gated gd", "l2", "float32"), (64, 64, 16, 16, 8, "gated momentum", "l2", "float32"),
    (256, 64, 16, 16, 8, "gated gd", "l2", "bfloat16"),
    (153, 64, 16, 16, 8, "gated muon", "l2", "bfloat16"),  # atlas_pp at the study's sizes
]
MLP_INTS = {"T", "L", "m0", "offset", "b", "c", "NC"}
MLP_INPUTS = {"Q", "K", "V", "GAMMA", "A", "M", "S", "CW", "CS", "W10", "W20", "S10", "S20", "WE10", "WE20", "Y",
              "W1T", "W2T", "S1T", "S2T", "WE1T", "WE2T", "DY"}


def mlp_resources(D, HD, DV, chunk, window, optimizer, bias, dtype, prec) -> dict[str, tuple[int, int, int]]:
    """{kernel: (shared memory, registers, spill stack)} of an MLP kernel's two launches (gd and momentum:
    chunk_mlp_memory; muon: chunk_mlp_muon, 5 quintic steps; "gated …" with a gated first layer) with the options its
    autograd function takes."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    gated, muon = optimizer.startswith("gated"), optimizer.endswith("muon")
    kernels = importlib.import_module(f"atlas_lab.memory.ops.chunk_mlp_memory.{'muon' if muon else 'triton'}")
    if muon:
        opts = kernels.launch_options(D, HD, DV, chunk, window, bias, "gelu", getattr(torch, dtype), False, 5,
                                      "quintic", prec, gated=gated)
        names = ("chunk_mlp_muon_fwd_kernel", "chunk_mlp_muon_bwd_kernel")
    else:
        opts = kernels.launch_options(D, HD, DV, chunk, window, bias, optimizer.endswith("momentum"), "gelu",
                                      getattr(torch, dtype), False, prec, gated=gated)
        names = ("chunk_mlp_memory_fwd_kernel", "chunk_mlp_memory_bwd_kernel")
    types = {**{n: "i32" for n in MLP_INTS}, **{n: pointer(dtype) for n in MLP_INPUTS}}
    return {k: compile_for_sm90(getattr(kernels, k), types, opts, opts["num_warps"], opts["num_stages"]) for k in names}


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
    print("\n| rows | cols | dtype | dots | kernel | shared memory (bytes) | registers | spill stack (bytes) |")
    print("|---|---|---|---|---|---|---|---|")
    for R, C, dtype in NS_CASES:
        for name, (shared, regs, stack) in ns_resources(R, C, dtype, "tf32").items():
            over += shared > SHARED_LIMIT
            print(f"| {R} | {C} | {dtype} | tf32 | {name} | {shared:,} | {regs} | {stack:,} |", flush=True)
    print("\n| D | hidden | d_v | chunk | window | optimiser | bias | dtype | dots | kernel | shared memory (bytes) | "
          "registers | spill stack (bytes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in MLP_CASES:
        prec = "tf32" if case[-1] == "float32" else "ieee"
        for name, (shared, regs, stack) in mlp_resources(*case, prec).items():
            over += shared > SHARED_LIMIT
            print("| " + " | ".join(map(str, case)) + f" | {prec} | {name} | {shared:,} | {regs} | {stack:,} |",
                  flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
