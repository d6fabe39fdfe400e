"""The MLP chunk kernel (``atlas_lab.memory.ops.chunk_mlp_memory``, docs/memory.md §5.3) against its PyTorch twin, and
``memorize(impl="triton")`` with a 2-layer MLP memory against ``reference`` and ``chunked`` (outputs, final state and
every gradient; odd lengths, windows inside and across chunks, a state continued mid-chunk, every activation).

Without a GPU the kernel runs under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1). Float32 results are
held to the error model of tests/helpers.py (``compare_float32``): against a float64 oracle, within SPREAD × the
spread of the float32 twin over one-ulp nudges of the inputs.
"""
import importlib

import pytest
import torch

from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.memory.dispatch import INTERPRETED
from atlas_lab.memory.ops.chunk_mlp_memory import chunk_mlp_memory, chunk_mlp_memory_naive
from atlas_lab.memory.ops.chunk_mlp_memory.muon import chunk_mlp_muon
from atlas_lab.memory.ops.chunk_mlp_memory.naive import chunk_mlp_muon_naive
from atlas_lab.memory.ops.chunk_mlp_memory.triton import launches
from atlas_lab.memory.plan import Shapes, plan
from helpers import SPREAD, U32, compare_float32, dot_counter, float32_spread, make_problem, rel_err, run, \
    traffic_counter

if not (INTERPRETED or torch.cuda.is_available()):
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)",
                allow_module_level=True)

DEVICE = "cpu" if INTERPRETED else "cuda"
STATE = ("W1", "W2", "S1", "S2")


def inputs(N, T, m0, D, HD, DV, b, momentum, seed=0, gated=False):
    """Random kernel inputs in float32 on DEVICE, drawn on the CPU (every device sees the same numbers); gated: a
    first layer of 2·HD rows (the gate's, then the value's)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0, lo=None):
        x = torch.rand(*s, generator=g) * (1 - lo) + lo if lo is not None else torch.randn(*s, generator=g) * scale
        return x.to(DEVICE).requires_grad_()

    x = dict(q=r(N, T, D), k=r(N, m0 + T, D, scale=D ** -0.5), v=r(N, m0 + T, DV, scale=0.5),
             gamma=r(N, m0 + T, lo=0.2), a=r(N, T, lo=0.8), Cw=r(N, T, b, scale=0.3),
             W1=r(N, HD1 := HD * (1 + gated), D, scale=D ** -0.5), W2=r(N, DV, HD, scale=HD ** -0.5),
             We1=r(N, HD1, D, scale=D ** -0.5), We2=r(N, DV, HD, scale=HD ** -0.5))
    if momentum:
        x.update(m=r(N, T, lo=0.0), s=r(N, T, lo=0.0), Cs=r(N, T, b, scale=0.3), S1=r(N, HD1, D, scale=0.1),
                 S2=r(N, DV, HD, scale=0.1))
    return x


def results(f, options):
    """x -> {out.<name>: each output; grad.<input>: its gradient} of ``f`` (kernel or twin) on fresh leaves of x,
    through a loss that weighs every output at random."""
    def go(x):
        x = {n: t.detach().requires_grad_() for n, t in x.items()}
        if options["offset"] == 0:  # W̃ of the first chunk is W_p itself (the signature's contract)
            x.pop("We1"), x.pop("We2")
            x["We1"], x["We2"] = x["W1"], x["W2"]
        outs = f(*(x[n] for n in ("q", "k", "v", "gamma", "a", "Cw", "W1", "W2", "We1", "We2")),
                 **{n: x[n] for n in ("m", "s", "Cs", "S1", "S2") if n in x}, **options)
        names = ("y", *STATE, "We1", "We2")
        outs = {n: o for n, o in zip(names, outs) if o is not None}
        g = torch.Generator().manual_seed(5)
        total = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o)).sum() for o in outs.values())
        leaves = {n: t for n, t in x.items() if not (options["offset"] == 0 and n in ("We1", "We2"))}
        grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
        return {**{f"out.{n}": o for n, o in outs.items()},
                **{f"grad.{n}": gr for n, gr in zip(leaves, grads) if gr is not None}}
    return go


CASES = {  # (momentum, bias, window, offset, activation, shape)
    "online": (False, "l2", 1, 0, "gelu", dict(N=2, T=9, m0=0, D=5, HD=12, DV=6, b=3)),
    "window-in-chunk": (True, "l2", 3, 1, "gelu", dict(N=2, T=11, m0=2, D=5, HD=12, DV=6, b=4)),
    "window-over-chunks": (False, "l2", 6, 2, "silu", dict(N=2, T=13, m0=5, D=7, HD=20, DV=3, b=4)),
    "dot": (True, "dot", 2, 2, "tanh", dict(N=2, T=10, m0=1, D=7, HD=20, DV=3, b=4)),
    "relu-long-walk": (True, "l2", 9, 3, "relu", dict(N=2, T=23, m0=8, D=6, HD=24, DV=5, b=4)),
    "one-partial-chunk": (False, "l2", 2, 1, "gelu", dict(N=2, T=2, m0=1, D=5, HD=12, DV=6, b=4)),
    "blocks-of-32": (True, "l2", 8, 0, "silu", dict(N=1, T=40, m0=0, D=20, HD=40, DV=17, b=16)),
}


@pytest.mark.parametrize("momentum,bias,window,offset,activation,shape", CASES.values(), ids=CASES)
def test_mlp_kernel_matches_its_pytorch_twin(momentum, bias, window, offset, activation, shape):
    """The kernel in float32 (IEEE dots) against its twin in float64 (the oracle): every output, final state and input
    gradient within SPREAD × the spread of the float32 twin over one-ulp nudges of the inputs."""
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation)
    x = inputs(**shape, momentum=momentum)
    oracle = results(chunk_mlp_memory_naive, options)({n: t.detach().double().cpu() for n, t in x.items()})
    compare_float32(results(chunk_mlp_memory, options), results(chunk_mlp_memory_naive, options), x, oracle,
                    str(options))


GATED_CASES = {  # (momentum, bias, window, offset, activation, shape): a gated first layer (Atlas++'s memory)
    "online": (False, "l2", 1, 0, "gelu", dict(N=2, T=9, m0=0, D=5, HD=12, DV=6, b=3)),
    "window-mid-chunk": (True, "l2", 3, 1, "silu", dict(N=2, T=11, m0=2, D=20, HD=12, DV=6, b=4)),
    "dot": (True, "dot", 2, 2, "tanh", dict(N=1, T=10, m0=1, D=7, HD=16, DV=3, b=4)),
}


@pytest.mark.parametrize("momentum,bias,window,offset,activation,shape", GATED_CASES.values(), ids=GATED_CASES)
def test_gated_mlp_kernel_matches_its_pytorch_twin(momentum, bias, window, offset, activation, shape):
    """h = σ(W_a u) ⊙ W_b u: the kernel against its twin within the error model, as ungated."""
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation,
                   gated=True)
    x = inputs(**shape, momentum=momentum, gated=True)
    oracle = results(chunk_mlp_memory_naive, options)({n: t.detach().double().cpu() for n, t in x.items()})
    compare_float32(results(chunk_mlp_memory, options), results(chunk_mlp_memory_naive, options), x, oracle,
                    str(options))


@pytest.mark.parametrize("momentum", [False, True])
def test_mlp_kernel_at_the_studys_sizes(momentum):
    """omeganet's memory at sweeps/mqar_gpu.yaml's sizes (polynomial φ of head dim 16: D 153, hidden 64, d_v 16,
    chunks of 16, a window of 8; blocks of 256 features and 32 keys), two sequences of 80 tokens, against the twin."""
    options = dict(offset=0, chunk_size=16, window=8, bias="l2", activation="gelu")
    x = inputs(N=2, T=80, m0=0, D=153, HD=64, DV=16, b=16, momentum=momentum)
    oracle = results(chunk_mlp_memory_naive, options)({n: t.detach().double().cpu() for n, t in x.items()})
    compare_float32(results(chunk_mlp_memory, options), results(chunk_mlp_memory_naive, options), x, oracle,
                    str(options))


def test_muon_kernel_at_the_studys_sizes():
    """atlas's memory at the study's sizes (W1 64 × 153, W2 16 × 64, chunks of 16, a window of 8), one sequence of
    40 tokens, 3 cubic Newton–Schulz steps, against the twin."""
    options = dict(offset=0, chunk_size=16, window=8, bias="l2", activation="gelu", ns_steps=3,
                   ns_coefficients="cubic")
    muon_against_twin(options, N=1, T=40, m0=0, D=153, HD=64, DV=16, b=16)


COUNT_CASES = {  # (window, bias, momentum, gated, shape, offset)
    # blocks filled exactly: chunks of 16, D = H = d_v = 16, 17 keys with the first chunk's 16 before them, and the
    # online case with a gated first layer (32 rows)
    "filled": (17, "l2", True, False, dict(N=2, T=64, m0=16, D=16, HD=16, DV=16, b=16), 0),
    "filled-gated": (1, "dot", False, True, dict(N=2, T=64, m0=0, D=16, HD=16, DV=16, b=16), 0),
    # every block padded: chunks of 6 in 16 rows with a partial first and last one, D 36 in 64, H 12, d_v 6 in 16
    "padded": (4, "l2", True, False, dict(N=2, T=17, m0=3, D=36, HD=12, DV=6, b=6), 2),
    "padded-gated": (3, "dot", False, True, dict(N=1, T=17, m0=2, D=36, HD=12, DV=6, b=6), 2),
}


@pytest.mark.skipif(not INTERPRETED, reason="counts the dots through Triton's interpreter")
@pytest.mark.parametrize("window,bias,momentum,gated,shape,offset", COUNT_CASES.values(), ids=COUNT_CASES)
def test_launches_counts_the_dots_the_kernel_runs(window, bias, momentum, gated, shape, offset, monkeypatch):
    """launches()' FLOPs per launch = 2·m·n·k of every tl.dot each launch runs, at its blocks' sizes: blocks filled
    exactly, and every block padded (a chunk's rows, the window's keys, features, hidden units and values)."""
    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_mlp_memory.triton")
    N, T, D, HD, DV, b = (shape[n] for n in ("N", "T", "D", "HD", "DV", "b"))
    expected = launches(N, T, D, HD, DV, chunk_size=b, window=window, bias=bias, momentum=momentum, offset=offset,
                        gated=gated)
    counted = dot_counter(monkeypatch, kernels, expected)
    x = inputs(**shape, momentum=momentum, gated=gated)
    results(chunk_mlp_memory, dict(offset=offset, chunk_size=b, window=window, bias=bias, activation="gelu",
                                   gated=gated))(x)
    assert counted == {name: flops for name, (_, _, flops) in expected.items()}


# ---------------------------------------------------------------- muon on the MLP memory (ops/chunk_mlp_memory/muon.py)

MUON_NAMES = ("q", "k", "v", "gamma", "a", "s", "Cw", "Cs", "W1", "W2", "S1", "S2", "We1", "We2")


def muon_inputs(N, T, m0, D, HD, DV, b, seed=0, gated=False):
    x = inputs(N, T, m0, D, HD, DV, b, momentum=True, seed=seed, gated=gated)
    x.pop("m")
    return x


def muon_against_twin(options, **shape):
    """The muon kernel in float32 against its twin in float64 (the oracle), within the error model."""
    x = muon_inputs(**shape)
    oracle = muon_results(chunk_mlp_muon_naive, options)({n: t.detach().double().cpu() for n, t in x.items()})
    compare_float32(muon_results(chunk_mlp_muon, options), muon_results(chunk_mlp_muon_naive, options), x, oracle,
                    str(options))


def muon_results(f, options):
    """As ``results``, for the muon kernel's signature."""
    def go(x):
        x = {n: t.detach().requires_grad_() for n, t in x.items()}
        if options["offset"] == 0:
            x.pop("We1"), x.pop("We2")
            x["We1"], x["We2"] = x["W1"], x["W2"]
        outs = dict(zip(("y", *STATE, "We1", "We2"), f(*(x[n] for n in MUON_NAMES), **options)))
        g = torch.Generator().manual_seed(5)
        total = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o)).sum() for o in outs.values())
        leaves = {n: t for n, t in x.items() if not (options["offset"] == 0 and n in ("We1", "We2"))}
        grads = torch.autograd.grad(total, list(leaves.values()))
        return {**{f"out.{n}": o for n, o in outs.items()}, **{f"grad.{n}": gr for n, gr in zip(leaves, grads)}}
    return go


MUON_CASES = {  # (bias, window, offset, activation, shape): weights of rows ≤ columns (no transpose)
    "online": ("l2", 1, 0, "gelu", dict(N=2, T=9, m0=0, D=20, HD=12, DV=6, b=3)),
    "window-mid-chunk": ("l2", 3, 1, "silu", dict(N=2, T=11, m0=2, D=20, HD=12, DV=6, b=4)),
    "dot": ("dot", 2, 2, "tanh", dict(N=1, T=10, m0=1, D=17, HD=16, DV=3, b=4)),
}


@pytest.mark.parametrize("bias,window,offset,activation,shape", MUON_CASES.values(), ids=MUON_CASES)
def test_muon_kernel_matches_its_pytorch_twin(bias, window, offset, activation, shape):
    """Cubic Newton–Schulz, 3 steps (quintic amplifies float32 rounding ~480×: test_memory_equivalence), in float32
    against the twin in float64, within the error model."""
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation,
                   ns_steps=3, ns_coefficients="cubic")
    muon_against_twin(options, **shape)


GATED_MUON_CASES = {  # (bias, window, offset, activation, shape): Atlas++'s gated first layer, W_a and W_b each
    # their own Newton–Schulz (both 12 × 20 and 16 × 17: rows ≤ columns)
    "window-mid-chunk": ("l2", 3, 1, "silu", dict(N=2, T=11, m0=2, D=20, HD=12, DV=6, b=4)),
    "dot": ("dot", 2, 2, "tanh", dict(N=1, T=10, m0=1, D=17, HD=16, DV=3, b=4)),
}


@pytest.mark.parametrize("bias,window,offset,activation,shape", GATED_MUON_CASES.values(), ids=GATED_MUON_CASES)
def test_gated_muon_kernel_matches_its_pytorch_twin(bias, window, offset, activation, shape):
    """Muon on the gated MLP (atlas_pp's memory): the kernel against its twin within the error model, as ungated."""
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation,
                   ns_steps=3, ns_coefficients="cubic", gated=True)
    muon_against_twin(options, **shape, gated=True)


@pytest.mark.parametrize("gated", [False, True])
def test_muon_kernel_in_column_tiles_matches_its_pytorch_twin(gated, monkeypatch):
    """The backward's Newton–Schulz steps in column tiles of the first layer (``muon.TILE_BYTES``, as float32 takes
    them at the study's W1 64 × 153: tiles of 128 of its 256 columns), here tiles of 16 of its 32 padded columns
    (D 20, H 12; gated: a pair of 12 × 20), against the twin."""
    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_mlp_memory.muon")
    monkeypatch.setattr(kernels, "TILE_BYTES", 16 * 16 * 4 * (1 + gated))
    opts = kernels.launch_options(20, 12, 6, 4, 3, "l2", "silu", torch.float32, True, 3, "cubic", gated=gated)
    assert (opts["BD"], opts["BDT"]) == (32, 16)
    bias, window, offset, activation, shape = MUON_CASES["window-mid-chunk"]
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation,
                   ns_steps=3, ns_coefficients="cubic", gated=gated)
    muon_against_twin(options, **shape, gated=gated)


MUON_COUNT_CASES = {  # (tile_bytes, gated, shape, window, offset, dtype)
    # blocks filled exactly: chunks of 16, D 32 in two tiles of 16 (TILE_BYTES lowered), H = d_v = 16, 17 keys with
    # the first chunk's 16 before them
    "filled-tiles": (16 * 16 * 4, False, dict(N=1, T=32, m0=16, D=32, HD=16, DV=16, b=16), 17, 0, torch.float32),
    # every block padded: chunks of 6 in 16 rows, a partial first and last chunk, D 36 in 64 columns whose steps
    # back take 3 tiles of 16 (48 columns), H 12 in 16, d_v 6 in 16; float16: the iterates, A and B in 16 bits
    "padded": (None, False, dict(N=2, T=17, m0=3, D=36, HD=12, DV=6, b=6), 4, 2, torch.float32),
    "padded-gated": (None, True, dict(N=1, T=17, m0=3, D=36, HD=12, DV=6, b=6), 4, 2, torch.float32),
    "padded-float16": (None, False, dict(N=1, T=17, m0=3, D=36, HD=12, DV=6, b=6), 4, 2, torch.float16),
}


@pytest.mark.skipif(not INTERPRETED, reason="counts the dots and the bytes through Triton's interpreter")
@pytest.mark.parametrize("tile_bytes,gated,shape,window,offset,dtype", MUON_COUNT_CASES.values(),
                         ids=MUON_COUNT_CASES)
def test_muon_launches_counts_the_dots_and_the_scratch_the_kernel_runs(tile_bytes, gated, shape, window, offset, dtype,
                                                                       monkeypatch):
    """muon.launches()' FLOPs per launch = 2·m·n·k of every tl.dot as issued (at its blocks), and
    muon.scratch_bytes() = the bytes the backward loads from and stores to its scratch: blocks filled exactly with
    W1's columns in two tiles of TILE_BYTES, and every block padded (the steps back on the tiles that hold W1's
    columns only), plain, gated (its pair's products on the stacked block) and in float16; two quintic steps."""
    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_mlp_memory.muon")
    if tile_bytes:
        monkeypatch.setattr(kernels, "TILE_BYTES", tile_bytes)
    N, T, D, HD, DV, b = (shape[n] for n in ("N", "T", "D", "HD", "DV", "b"))
    sizes = dict(chunk_size=b, steps=2, gated=gated, dtype=dtype)
    expected = kernels.launches(N, T, D, HD, DV, window=window, bias="l2", offset=offset, **sizes)
    moved = traffic_counter(monkeypatch, kernels, "chunk_mlp_muon_bwd_kernel",
                            ("SCR1", "SCR2", "SCG1", "SCG2", "SCQ1", "SCQ2"))
    counted = dot_counter(monkeypatch, kernels, expected)
    options = dict(offset=offset, chunk_size=b, window=window, bias="l2", activation="gelu", ns_steps=2,
                   ns_coefficients="quintic", gated=gated)
    x = {n: t.to(dtype) for n, t in muon_inputs(**shape, gated=gated).items()}
    muon_results(kernels.chunk_mlp_muon, options)(x)
    assert counted == {name: flops for name, (_, _, flops) in expected.items()}
    assert moved[0] == kernels.scratch_bytes(N, T, D, HD, DV, **sizes)


# ---------------------------------------------------------------- both MLP kernels in fewer bits

UNIT = {"float16": 2.0 ** -11, "tf32": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff: 11 and 8 significant bits
CAP = {"float16": 0.1, "tf32": 0.1, "bfloat16": 0.5}  # a larger bound could not tell a wrong path (off by O(1))


@pytest.mark.parametrize("kernel", ["momentum", "muon", "muon-gated"])
@pytest.mark.parametrize("precision", ["float16", "tf32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    INTERPRETED, reason="Triton's interpreter computes bfloat16 wrongly"))])
def test_mlp_kernels_in_fewer_bits(kernel, precision):
    """float16 and bfloat16 inputs multiplied as they are passed, and float32 inputs on tf32 dots: every product's
    operands rounded to 11 (bfloat16: 8) bits, fp32 accumulation, states and scratch (test_kernels.py's
    test_chunk_kernel_in_fewer_bits: its error model, the float32 twin's spread × u/u₃₂, against the float64 oracle
    on the same rounded inputs; under TRITON_INTERPRET=1 tf32 dots are IEEE, so there tf32 checks the path only).
    Muon with 3 cubic steps, W1 12 × 20 in 32 columns (gated: a pair), chunks of 4, a window over chunks."""
    bias, window, offset, activation, shape = MUON_CASES["window-mid-chunk"]
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias, activation=activation)
    if kernel == "momentum":
        x, fast, twin = inputs(**shape, momentum=True), results(chunk_mlp_memory, options), \
            results(chunk_mlp_memory_naive, options)
    else:
        options.update(ns_steps=3, ns_coefficients="cubic", gated=kernel == "muon-gated")
        x, fast, twin = muon_inputs(**shape, gated=options["gated"]), muon_results(chunk_mlp_muon, options), \
            muon_results(chunk_mlp_muon_naive, options)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision, torch.float32)
    x = {n: t.detach().to(dtype).float() for n, t in x.items()}  # values of the dtype, exactly
    oracle = twin({n: t.double().cpu() for n, t in x.items()})
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        got = fast({n: t.to(dtype) for n, t in x.items()})
    finally:
        torch.set_float32_matmul_precision(before)
    assert got["out.y"].dtype == got["grad.q"].dtype == dtype
    spread = float32_spread(twin, x, oracle, kernel)
    bound = {n: SPREAD * max(spread[n], U32) * UNIT[precision] / U32 for n in oracle}
    assert max(bound.values()) < CAP[precision], f"{kernel}: {precision} cannot be checked here: {bound}"
    bad = {n: (rel_err(got[n], y), bound[n]) for n, y in oracle.items() if not rel_err(got[n], y) <= bound[n]}
    assert not bad, f"{kernel} {precision}: (error, bound) exceeded: {bad}"


# ---------------------------------------------------------------- memorize(impl="triton") against reference

def problem(**kw):
    p = make_problem(dtype=torch.float32, device=DEVICE, **kw)
    return p


def triton_vs(impl, T=11, chunk_size=4, feature_map="identity", d_k=4, **options):
    """memorize(impl="triton") with a 2-layer MLP memory in float32 against ``impl`` in float64 (the oracle)."""
    architecture = options.pop("architecture", "mlp")
    kw = dict(architecture=architecture, feature_map=feature_map, T=T, d_k=d_k)
    options = dict(architecture=architecture, feature_map=feature_map, chunk_size=chunk_size, **options)
    compare_float32(lambda p: run(p, "triton", **options), lambda p: run(p, impl, **options), problem(**kw),
                    run(make_problem(device="cpu", **kw), impl, **options), f"triton vs {impl} {options}")


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("bias,window,optimizer,feature_map", [
    ("l2", 1, "momentum", "identity"), ("l2", 3, "gd", "polynomial"), ("dot", 2, "momentum", "identity"),
    ("l2", 6, "momentum", "taylor")])
def test_mlp_memory_matches_reference(bias, window, optimizer, feature_map, impl):
    """T = 11 with chunks of 4 (an odd tail); windows online, inside a chunk and across chunks; the residual r(k) = k
    (d_k = d_v), learnt φ coefficients; against the token loop and the chunked path."""
    triton_vs(impl, attentional_bias=bias, window=window, optimizer=optimizer, feature_map=feature_map)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("bias,window,optimizer", [("l2", 3, "momentum"), ("dot", 2, "gd")])
def test_gated_mlp_memory_matches_reference(bias, window, optimizer, impl):
    """Atlas++'s memory (r(k) + W1 (σ(W2 φ(k)) ⊙ W3 φ(k))) with gd or momentum on the MLP kernel: its W2, W3 one
    stacked first layer there, against the token loop and the chunked path."""
    options = dict(attentional_bias=bias, window=window, optimizer=optimizer, feature_map="polynomial")
    assert plan(MemoryConfig(architecture="gated_mlp", **options), Shapes(2, 11, 2, 4, 4), torch.float32, "cuda"
                ).path == "triton"
    triton_vs(impl, architecture="gated_mlp", **options)


CUBIC = {"name": "muon", "ns_coefficients": "cubic", "ns_steps": 3}


@pytest.mark.parametrize("bias,window,impl", [
    ("l2", 3, "reference"), ("dot", 6, "chunked"),
    *[pytest.param(*case, marks=pytest.mark.slow)
      for case in (("l2", 1, "reference"), ("l2", 1, "chunked"), ("l2", 3, "chunked"), ("dot", 6, "reference"))]])
def test_muon_on_the_fused_kernel_matches_reference(bias, window, impl):
    """Atlas's rule (muon, an Omega window, polynomial φ: W1 16 × 36, W2 4 × 16) on the fused kernel against the token
    loop and the chunked path; cubic coefficients (quintic amplifies float32 rounding ~480×)."""
    options = dict(attentional_bias=bias, window=window, optimizer=CUBIC, feature_map="polynomial", d_k=7)
    assert plan(MemoryConfig(architecture="mlp", **{n: v for n, v in options.items() if n != "d_k"}),
                Shapes(2, 11, 2, 7, 4), torch.float32, DEVICE, "triton").ns == "fused"
    triton_vs(impl, **options)


@pytest.mark.parametrize("impl", ["reference", pytest.param("chunked", marks=pytest.mark.slow)])
def test_muon_on_the_gated_mlp_matches_reference(impl):
    """Atlas++'s rule (muon on r(k) + W1 (σ(W2 φ(k)) ⊙ W3 φ(k)), an Omega window, polynomial φ: W2, W3 16 × 36 each
    their own Newton–Schulz, W1 4 × 16) on the fused kernel against the token loop and the chunked path."""
    options = dict(attentional_bias="l2", window=3, optimizer=CUBIC, feature_map="polynomial", d_k=7)
    assert plan(MemoryConfig(architecture="gated_mlp", **{n: v for n, v in options.items() if n != "d_k"}),
                Shapes(2, 11, 2, 7, 4), torch.float32, DEVICE, "triton").ns == "fused"
    triton_vs(impl, architecture="gated_mlp", **options)


def test_a_state_continued_mid_chunk_is_one_call():
    """4 + 1 + 6 tokens with chunks of 3 (splits inside chunks: W̃ carried and differentiated) = one chunked call on
    11, float32 against float64."""
    options = dict(architecture={"name": "mlp", "activation": "silu"}, attentional_bias="l2", window=2,
                   optimizer="momentum", chunk_size=3)

    def go(impl, pieces):
        def results_(p):
            gates = {g: p[g] for g in ("alpha", "eta", "theta", "gamma")}
            state, outs = p["initial_state"], []
            for lo, hi in pieces:
                o, state = memorize(p["q"][:, lo:hi], p["k"][:, lo:hi], p["v"][:, lo:hi], initial_state=state,
                                    impl=impl, gates={g: x[:, lo:hi] for g, x in gates.items()}, **options)
                outs.append(o)
            o = torch.cat(outs, 1)
            leaves = [p["q"], p["k"], p["v"], *gates.values(), *p["initial_state"].values()]
            loss = o.square().sum() + sum(w.square().sum() for w in state.weights.values())
            grads = torch.autograd.grad(loss, leaves)
            out = {"output": o, **{f"state.{n}": w for n, w in state.weights.items()}}
            return {**out, **{f"grad{i}": g for i, g in enumerate(grads)}}
        return results_

    kw = dict(architecture=options["architecture"], T=11)
    compare_float32(go("triton", [(0, 4), (4, 5), (5, 11)]), go("chunked", [(0, 11)]), problem(**kw),
                    go("chunked", [(0, 11)])(make_problem(device="cpu", **kw)), str(options))


@pytest.mark.parametrize("options,gap", [
    (dict(window=None), "window=None"), (dict(window=40, chunk_size=32), "keys"),
    (dict(architecture={"name": "mlp", "depth": 3}), "memory mlp(L=3"),
    (dict(architecture={"name": "mlp", "output_norm": True}), "memory mlp(L=2,E=4,LN)")])
def test_what_the_mlp_kernel_does_not_cover_goes_elsewhere(options, gap):
    """On CUDA (asked as there), a 2-layer MLP with gd runs on the Triton path; what the kernel cannot hold runs on the
    chunked path, and the plan says why."""
    base = dict(architecture="mlp", attentional_bias="l2", optimizer="gd", window=4, chunk_size=16)
    shapes = Shapes(2, 64, 4, 16, 16)
    assert plan(MemoryConfig(**base), shapes, torch.float32, "cuda").path == "triton"
    how = plan(MemoryConfig(**{**base, **options}), shapes, torch.float32, "cuda")
    assert how.path == "chunked" and gap in how.reason, how.reason
