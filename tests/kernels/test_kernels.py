"""Triton kernels (``atlas_lab.memory.ops``, docs/memory.md §5.3) against the PyTorch paths: batched Newton–Schulz
against ``newton_schulz``; the chunk kernel against its PyTorch twin; ``memorize(impl="triton")`` against
``reference`` and ``chunked`` (outputs, final state, gradients; odd lengths, several windows, state passed between
calls).

Without a GPU the kernels run under Triton's interpreter (small shapes, fp32); conftest.py sets TRITON_INTERPRET=1
before triton is first imported. Heavier sweeps are marked slow.
"""
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atlas_lab.memory import memorize
from atlas_lab.memory import newton_schulz as newton_schulz_reference
from atlas_lab.memory.dispatch import INTERPRETED
from atlas_lab.memory.ops import chunk_linear_memory, chunk_linear_memory_naive, newton_schulz
from atlas_lab.memory.ops.chunk_linear_memory.triton import launches, launches_table
from atlas_lab.memory.ops.dots import dot_precision
from atlas_lab.memory.ops.newton_schulz.triton import ns_precision
from helpers import (SPREAD, U32, compare_float32, compiles_as_eager, dot_counter, float32_spread, make_problem,
                     rel_err, run)

if not (INTERPRETED or torch.cuda.is_available()):
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)",
                allow_module_level=True)

DEVICE = "cpu" if INTERPRETED else "cuda"
# float32 kernels are held to the error model of tests/helpers.py (compare_float32): against a float64 oracle, within
# SPREAD × the spread of the float32 PyTorch path on nudged inputs.


def to_device(problem):
    """A make_problem problem moved to DEVICE, as fresh leaves."""
    def leaf(x):
        return x.detach().to(DEVICE).requires_grad_()

    out = {n: leaf(x) if isinstance(x, torch.Tensor) else x for n, x in problem.items()}
    out["initial_state"] = {n: leaf(w) for n, w in problem["initial_state"].items()}
    return out


def problem(**kw):
    return to_device(make_problem(dtype=torch.float32, **kw))


# ---------------------------------------------------------------- batched Newton–Schulz

def ns_results(f, device, coefficients="quintic"):
    """{G, w} -> NS_5(G) and ∂⟨NS_5(G), w⟩/∂G by ``f`` (a Newton–Schulz of the kernel's signature) on ``device``."""
    def go(x):
        G = x["G"].detach().to(device).requires_grad_()
        out = f(G, 5, coefficients)
        (dG,) = torch.autograd.grad((out * x["w"].to(device)).sum(), G)
        return {"output": out, "grad.G": dG}
    return go


@pytest.mark.parametrize("coefficients", ["quintic", "cubic"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 3, 20, 6), (2, 16, 153), (40, 200)],
                         ids=["small", "tall-transposed", "column-blocks", "rows-64"])
def test_newton_schulz_matches_reference(shape, coefficients):
    """Forward and (recomputation) backward of the fused kernel = the PyTorch NS: float32 against the float64 oracle."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(*shape, generator=g, dtype=torch.float64)
    w = torch.randn(*shape, generator=g, dtype=torch.float64)
    fast = ns_results(newton_schulz, DEVICE, coefficients)
    assert fast({"G": G.float(), "w": w.float()})["output"].dtype == torch.float32
    compare_float32(fast, ns_results(newton_schulz_reference, DEVICE, coefficients), {"G": G.float(), "w": w.float()},
                    ns_results(newton_schulz_reference, "cpu", coefficients)({"G": G, "w": w}),
                    f"NS {shape} {coefficients}")


def test_newton_schulz_is_one_operator_in_a_compiled_graph():
    """The kernel is a registered operator (its shape function and backward): torch.compile's tracer keeps a graph
    that calls it whole, and AOT autograd through it gives the eager values and gradient exactly."""
    G = torch.randn(3, 20, 6, generator=torch.Generator().manual_seed(0)).to(DEVICE)  # transposed to 6 × 20
    weights = torch.arange(120.0, device=DEVICE).view(1, 20, 6)
    compiles_as_eager(lambda G: (newton_schulz(G, 5, "quintic") * weights).sum(), G)


@pytest.mark.parametrize("precision", ["float16", "tf32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    INTERPRETED, reason="Triton's interpreter computes bfloat16 wrongly"))])
def test_newton_schulz_in_fewer_bits(precision):
    """float16 and bfloat16 inputs (products on tf32, iterates in fp32, the result rounded to the inputs' dtype), and
    float32 inputs on tf32 dots (torch's matmul precision "high"), against the float64 oracle on the same (rounded)
    inputs, within the error model of ``test_chunk_kernel_in_fewer_bits``: SPREAD × the float32 twin's spread per
    u₃₂, times u/u₃₂ at 11 (bfloat16: 8) bits. Under TRITON_INTERPRET=1 tf32 dots are IEEE, so there the tf32 rows
    check the path and the rounding of the inputs and result; on a GPU the rounding of the products too.

    The cubic steps: the quintic's a = 3.4445 amplifies every perturbation five times over, and its bound here
    (0.06 on the output, 0.14 on the gradient) could not tell a wrong path from rounding; the kernel is the same but
    for the c·A² product, which the float32 test above checks in both."""
    g = torch.Generator().manual_seed(1)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision, torch.float32)
    x = {n: torch.randn(4, 16, 48, generator=g).to(dtype).float() for n in ("G", "w")}  # values of the dtype, exactly
    oracle = ns_results(newton_schulz_reference, "cpu", "cubic")({n: t.double() for n, t in x.items()})
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        got = ns_results(newton_schulz, DEVICE, "cubic")({n: t.to(dtype) for n, t in x.items()})
    finally:
        torch.set_float32_matmul_precision(before)
    assert got["output"].dtype == got["grad.G"].dtype == dtype
    spread = float32_spread(ns_results(newton_schulz_reference, "cpu", "cubic"), x, oracle, precision)
    bound = {n: SPREAD * max(spread[n], U32) * UNIT[precision] / U32 for n in oracle}
    assert max(bound.values()) < CAP[precision], f"NS: {precision} cannot be checked here: {bound}"
    bad = {n: (rel_err(got[n], y), bound[n]) for n, y in oracle.items() if not rel_err(got[n], y) <= bound[n]}
    assert not bad, f"NS {precision}: (error, bound) exceeded: {bad}"


def test_newton_schulz_rejects_what_it_does_not_cover():
    with pytest.raises(NotImplementedError, match="up to 128 × 512"):
        newton_schulz(torch.zeros(130, 130, device=DEVICE))
    with pytest.raises(NotImplementedError, match="float32, float16 and bfloat16"):
        newton_schulz(torch.zeros(4, 4, dtype=torch.float64, device=DEVICE))


# ---------------------------------------------------------------- the chunk kernel against its PyTorch twin

def chunk_inputs(N, T, m0, D, DV, b, momentum, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0, lo=None):
        x = torch.rand(*s, generator=g) * (1 - lo) + lo if lo is not None else torch.randn(*s, generator=g) * scale
        return x.to(DEVICE).requires_grad_()

    x = dict(q=r(N, T, D), k=r(N, m0 + T, D, scale=D ** -0.5), v=r(N, m0 + T, DV, scale=0.5),
             gamma=r(N, m0 + T, lo=0.2),
             a=r(N, T, lo=0.8), Cw=r(N, T, b, scale=0.3), W0=r(N, DV, D, scale=0.1), We0=r(N, DV, D, scale=0.1))
    if momentum:
        x.update(m=r(N, T, lo=0.0), s=r(N, T, lo=0.0), Cs=r(N, T, b, scale=0.3), S0=r(N, DV, D, scale=0.1))
    return x


def chunk_run(f, x, **options):
    y, W, S, We = f(*(x[n] for n in ("q", "k", "v", "gamma", "a", "Cw", "W0", "We0")),
                    **{n: x[n] for n in ("m", "s", "Cs", "S0") if n in x}, **options)
    g = torch.Generator().manual_seed(5)
    outs = [y, W, We] + ([S] if S is not None else [])
    total = sum((o * torch.randn(o.shape, generator=g).to(DEVICE)).sum() for o in outs)
    return outs, torch.autograd.grad(total, list(x.values()), allow_unused=True)


CHUNK_CASES = {  # (momentum, bias, window, offset, shape); grids from chunk_linear_memory.triton.grids
    "online": (False, "l2", 1, 0, dict(N=3, T=9, m0=0, D=5, DV=6, b=3)),
    "window-in-chunk": (True, "l2", 3, 1, dict(N=3, T=11, m0=2, D=5, DV=6, b=4)),
    "dot-global": (True, "dot", None, 0, dict(N=2, T=11, m0=3, D=5, DV=6, b=4)),
    "window-over-chunks": (False, "l2", 6, 2, dict(N=2, T=13, m0=5, D=7, DV=3, b=4)),
    "key-blocks": (True, "l2", 20, 5, dict(N=2, T=40, m0=19, D=20, DV=40, b=16)),  # 2 key blocks, 3 walk d_v tiles
    "d-tiles": (True, "l2", 2, 0, dict(N=2, T=10, m0=1, D=130, DV=20, b=4)),  # 3 D tiles in the contribution kernel
    "long-walk": (True, "l2", 9, 3, dict(N=2, T=23, m0=8, D=6, DV=5, b=4)),  # 7 chunks, windows across 3 of them
    "dot-walk-tiles": (True, "dot", 3, 1, dict(N=2, T=10, m0=2, D=130, DV=40, b=4)),  # element-wise walk, 3 × 2 tiles
    "one-partial-chunk": (False, "l2", 2, 1, dict(N=2, T=2, m0=1, D=5, DV=6, b=4)),  # W̃ of the last chunk is We0
    "gd-dot-global": (False, "dot", None, 2, dict(N=2, T=9, m0=0, D=5, DV=6, b=3)),
    "wide-chunks": (True, "l2", 5, 3, dict(N=1, T=70, m0=4, D=6, DV=5, b=40)),  # 64-token blocks, keys in 16s
}


def chunk_results(f, options):
    """x -> {out<i>: y, W_T, W̃, S_T; grad.<input>: gradient} of ``f`` (kernel or twin) on fresh leaves of x."""
    def go(x):
        outs, grads = chunk_run(f, {n: t.detach().requires_grad_() for n, t in x.items()}, **options)
        return {**{f"out{i}": o for i, o in enumerate(outs)},
                **{f"grad.{n}": g for n, g in zip(x, grads) if g is not None}}
    return go


def kernel_results(options, oracle):
    """The kernel's quantities that the twin has too (the twin leaves unused inputs without a gradient)."""
    def go(x):
        return {n: y for n, y in chunk_results(chunk_linear_memory, options)(x).items() if n in oracle}
    return go


@pytest.mark.parametrize("momentum,bias,window,offset,shape", CHUNK_CASES.values(), ids=CHUNK_CASES)
def test_chunk_kernel_matches_its_pytorch_twin(momentum, bias, window, offset, shape):
    """The kernel in float32 (IEEE dots) against its twin in float64 (the oracle), within the error model of
    tests/helpers.py (compare_float32): every output, final state and input gradient lands within SPREAD × the spread
    of the float32 twin over one-ulp nudges of the inputs."""
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias)
    x = chunk_inputs(**shape, momentum=momentum)
    oracle = chunk_results(chunk_linear_memory_naive, options)({n: t.detach().double().cpu() for n, t in x.items()})
    compare_float32(kernel_results(options, oracle), chunk_results(chunk_linear_memory_naive, options), x, oracle,
                    str(options))


UNIT = {"float16": 2.0 ** -11, "tf32": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff: 11 and 8 significant bits
CAP = {"float16": 0.1, "tf32": 0.1, "bfloat16": 0.5}  # a larger bound could not tell a wrong path (off by O(1))


def test_a_compiled_graph_calls_the_chunk_kernel_as_it_is():
    """``torch.compile`` does not trace into the chunk kernel's launches (under Triton's interpreter that trace fails
    outright): the graph breaks around the call, and the compiled function gives the eager values and gradients
    exactly."""
    import torch._dynamo

    momentum, bias, window, offset, shape = CHUNK_CASES["window-in-chunk"]
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias)
    x = chunk_inputs(**shape, momentum=momentum)

    def f(**x):
        y, W, S, We = chunk_linear_memory(*(x[n] for n in ("q", "k", "v", "gamma", "a", "Cw", "W0", "We0")),
                                          **{n: x[n] for n in ("m", "s", "Cs", "S0")}, **options)
        return (y * 2).sum() + W.sum() + S.sum() + We.sum()

    torch._dynamo.reset()
    eager = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    compiled = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    y, y_c = f(**eager), torch.compile(f, backend="aot_eager")(**compiled)
    y.backward()
    y_c.backward()
    assert torch.equal(y, y_c) and all(torch.equal(eager[n].grad, compiled[n].grad) for n in x)


@pytest.mark.parametrize("case", ["window-over-chunks", "dot-walk-tiles", "long-walk"])
@pytest.mark.parametrize("precision", ["float16", "tf32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    INTERPRETED, reason="Triton's interpreter computes bfloat16 wrongly"))])
def test_chunk_kernel_in_fewer_bits(case, precision):
    """float16 and bfloat16 inputs multiplied as they are passed, and float32 inputs on tf32 dots (torch's matmul
    precision "high"): every product's operands rounded to 11 (bfloat16: 8) bits, fp32 accumulation and states.

    Error model: tests/helpers.py's, at u bits. There a float32 evaluation is the function at inputs and intermediates
    moved by O(u₃₂), and the float32 twin's spread over one-ulp nudges (float32_spread) measures how far each quantity
    moves per u₃₂. Rounding the operands of every product to the unit u instead moves them by O(u), so the kernel
    must land within SPREAD × that spread × u/u₃₂ of the float64 oracle, computed on the same (for float16 and
    bfloat16: rounded) inputs. Under TRITON_INTERPRET=1 tf32 dots are IEEE (numpy), so there the tf32 case checks the
    path, not the rounding; on a GPU (--device cuda) it checks both."""
    momentum, bias, window, offset, shape = CHUNK_CASES[case]
    options = dict(offset=offset, chunk_size=shape["b"], window=window, bias=bias)
    x = chunk_inputs(**shape, momentum=momentum)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision, torch.float32)
    x = {n: t.detach().to(dtype).float() for n, t in x.items()}  # values of the dtype, exactly
    oracle = chunk_results(chunk_linear_memory_naive, options)({n: t.double().cpu() for n, t in x.items()})
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
        got = kernel_results(options, oracle)({n: t.to(dtype) for n, t in x.items()})
    finally:
        torch.set_float32_matmul_precision(before)
    assert got["out0"].dtype == got["grad.q"].dtype == dtype
    spread = float32_spread(chunk_results(chunk_linear_memory_naive, options), x, oracle, case)
    bound = {n: SPREAD * max(spread[n], U32) * UNIT[precision] / U32 for n in oracle}
    assert max(bound.values()) < CAP[precision], f"{case}: {precision} cannot be checked here: {bound}"
    bad = {n: (rel_err(got[n], y), bound[n]) for n, y in oracle.items() if not rel_err(got[n], y) <= bound[n]}
    assert not bad, f"{case} {precision}: (error, bound) exceeded: {bad}"


def test_float32_dots_use_tf32_only_where_torch_allows_it():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # torch's default: IEEE, like torch's own fp32 matmul
        assert dot_precision(torch.float32) == "ieee"
        for allowed in ("high", "medium"):  # what allow_tf32 = True and the GPU configs set
            torch.set_float32_matmul_precision(allowed)
            assert dot_precision(torch.float32) == "tf32"
            assert dot_precision(torch.float16) == dot_precision(torch.bfloat16) == "ieee"  # half dots: exact products
            assert ns_precision(torch.float32) == "tf32"
        torch.set_float32_matmul_precision("highest")
        assert ns_precision(torch.float32) == "ieee"
        # Newton–Schulz iterates in fp32: half inputs on tf32 (their result is rounded to 11 or 8 bits)
        assert ns_precision(torch.float16) == ns_precision(torch.bfloat16) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_call_of_eight_sequences_fills_the_chip():
    """B·H = 8 (B 2, H 4, d 64, T 16K, chunks of 64: gpu_check's deltanet row): each chunk-parallel launch has at least
    ten programs per multiprocessor of a 132-SM GPU (the kernel before had 16 programs in all); only the two walks run
    per (d_v tile, sequence)."""
    each = launches(8, 16384, 64, 64, chunk_size=64, window=1, bias="l2", momentum=False)
    for name, (grid, programs, flops) in each.items():
        if "scan" in name:
            assert grid == (4, 1, 8)
        else:
            assert programs >= 10 * 132, (name, grid)
    walk = sum(f for n, (_, _, f) in each.items() if "scan" in n)
    assert walk <= 0.25 * sum(f for _, _, f in each.values())  # most of the work is chunk-parallel


@pytest.mark.skipif(not INTERPRETED, reason="counts the dots through Triton's interpreter")
@pytest.mark.parametrize("window,bias,momentum", [(17, "l2", True), (1, "dot", False)])
def test_launches_counts_the_dots_the_kernels_run(window, bias, momentum, monkeypatch):
    """launches()' FLOPs per launch = 2·m·n·k of every tl.dot each launch runs (sizes that fill their blocks exactly:
    chunks of 16 = BT, D = d_v = 16, windows of 1 and 17 keys over chunks of 16)."""
    import importlib

    kernels = importlib.import_module("atlas_lab.memory.ops.chunk_linear_memory.triton")
    expected = launches(2, 64, 16, 16, chunk_size=16, window=window, bias=bias, momentum=momentum)
    counted = dot_counter(monkeypatch, kernels, expected)
    x = chunk_inputs(N=2, T=64, m0=0, D=16, DV=16, b=16, momentum=momentum)
    chunk_run(chunk_linear_memory, x, offset=0, chunk_size=16, window=window, bias=bias)
    assert counted == {name: flops for name, (_, _, flops) in expected.items()}


@pytest.mark.slow
def test_every_launch_compiles_for_sm90():
    """Every launch of the chunk kernel at the table's shape and at the largest blocks ([64, 256], tf32), of the
    Newton–Schulz kernel up to its largest matrices (128 × 512, tf32), and of the MLP kernels at the study's presets
    and the largest weights ops/limits.py admits (MLP_CASES), compiles for sm_90 without a GPU and fits the shared
    memory of one block (tests/kernels/sm90_resources.py, in a process without TRITON_INTERPRET; 23 minutes on one
    core with the linear and Newton–Schulz kernels in triton's cache, the muon cases compiled anew)."""
    pytest.importorskip("triton.backends.nvidia")
    root = Path(__file__).resolve().parents[2]
    env = {n: v for n, v in os.environ.items() if n != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run_ = subprocess.run([sys.executable, str(Path(__file__).with_name("sm90_resources.py")),
                           "64", "64", "16", "l2", "float32", "tf32", "256", "64", "64", "l2", "float32", "tf32"],
                          capture_output=True, text=True, env=env, timeout=5400)
    assert run_.returncode == 0, run_.stdout + run_.stderr[-3000:]


def test_the_kernel_table_in_docs_is_what_plan_gives():
    """docs/performance.md's grid and FLOPs table is ``launches_table()``'s output, line for line."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    for line in launches_table().splitlines():
        assert line in doc, f"docs/performance.md lacks the line {line!r} (print launches_table() and paste it)"


# ---------------------------------------------------------------- memorize(impl="triton") against reference

def triton_vs_reference(architecture="linear", feature_map="identity", T=7, chunk_size=3, impl="reference",
                        adjust=None, **options):
    """memorize(impl="triton") in float32 against ``impl`` in float64 (the oracle), within the error model of
    tests/helpers.py; ``adjust`` edits the problem first (both precisions)."""
    kw = dict(architecture=architecture, feature_map=feature_map, T=T,
              **{n: options.pop(n) for n in ("B", "H", "d_k", "d_v") if n in options})
    p, p64 = problem(**kw), make_problem(device="cpu", **kw)
    if adjust:
        p, p64 = adjust(p), adjust(p64)
    options = dict(architecture=architecture, feature_map=feature_map, chunk_size=chunk_size, **options)
    compare_float32(lambda p: run(p, "triton", **options), lambda p: run(p, impl, **options), p,
                    run(p64, impl, **options), f"triton vs {impl} {options}")


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("bias,window,optimizer", [
    ("l2", 1, "gd"), ("dot", 1, "momentum"), ("l2", 3, "momentum"), ("dot", 3, "gd"), ("l2", None, "gd"),
    ("l2", None, "momentum"), ("l2", 5, "momentum")])
def test_linear_memory_matches_reference(bias, window, optimizer, impl):
    """T = 7 with chunks of 3 (an odd tail; three chunks); windows online, inside a chunk, across chunks and global;
    against the token loop and the chunked path, each in float64 as the oracle and in float32 as the spread."""
    triton_vs_reference(feature_map="polynomial", attentional_bias=bias, window=window, optimizer=optimizer, impl=impl)


CUBIC = {"name": "muon", "ns_coefficients": "cubic"}


@pytest.mark.parametrize("architecture,window", [("linear", 3), ("mlp", 2)])
def test_muon_uses_the_batched_newton_schulz(architecture, window):
    """Cubic coefficients: quintic NS amplifies float32 rounding ~480× (see test_memory_equivalence)."""
    triton_vs_reference(architecture=architecture, attentional_bias="l2", window=window, optimizer=CUBIC)


def test_online_rule_and_normalized_linear_attention():
    online = dict(attentional_bias="l2", window=2, optimizer="momentum", chunk_size=1, feature_map="identity")
    normalized = dict(attentional_bias="dot", window=1, optimizer="gd", chunk_size=3, normalize=True,
                      feature_map="taylor")

    def adjust(p):  # keep the normaliser z away from 0
        return {**p, "alpha": p["alpha"].detach().clamp_min(0.95).requires_grad_()}

    for options in (online, normalized):
        triton_vs_reference(T=5, adjust=adjust, **options)


def split_calls(p, impl, pieces, **options):
    gates = {g: p[g] for g in ("alpha", "eta", "theta", "gamma")}
    state, outs = p["initial_state"], []
    for lo, hi in pieces:
        o, state = memorize(p["q"][:, lo:hi], p["k"][:, lo:hi], p["v"][:, lo:hi], initial_state=state, impl=impl,
                            gates={g: x[:, lo:hi] for g, x in gates.items()}, **options)
        outs.append(o)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("optimizer,window,bias,impl", [
    ("gd", 3, "l2", "reference"), ("momentum", None, "l2", "reference"), ("momentum", 4, "l2", "chunked"),
    ("momentum", 2, "dot", "chunked"), pytest.param("muon", 3, "l2", "reference", marks=pytest.mark.slow)])
def test_state_passing_with_odd_split_points(optimizer, window, bias, impl):
    """4 + 1 + 6 tokens with chunks of 3 (splits inside chunks) = one call of ``impl`` on 11 (float32 against
    float64)."""
    options = dict(architecture="linear", attentional_bias=bias, window=window,
                   optimizer=CUBIC if optimizer == "muon" else optimizer, chunk_size=3, feature_map="taylor")
    def results(impl, pieces):
        def go(p):
            o, state = split_calls(p, impl, pieces, **options)
            assert state.offset == 11 % 3
            out = {"output": o}
            for part in ("weights", "optimizer_state", "eval_weights"):
                out.update({f"state.{part}.{n}": w for n, w in (getattr(state, part) or {}).items()})
            leaves = [p["q"], p["k"], p["v"], p["alpha"], p["eta"], p["gamma"], *p["initial_state"].values()]
            grads = torch.autograd.grad(o.square().sum() + state.weights["W"].square().sum(), leaves)
            return {**out, **{f"grad{i}": g for i, g in enumerate(grads)}}
        return go

    oracle = results(impl, [(0, 11)])(make_problem(T=11, feature_map="taylor", device="cpu"))
    compare_float32(results("triton", [(0, 4), (4, 5), (5, 11)]), results(impl, [(0, 11)]),
                    problem(T=11, feature_map="taylor"), oracle, str(options))


def test_uncovered_combinations_say_what_is_covered():
    deep = {"name": "mlp", "depth": 3}
    with pytest.raises(NotImplementedError, match=r"impl='triton' does not cover memory mlp\(L=3,E=4\) with optimizer "
                                                  r"gd.*impl='triton' covers architecture 'linear'"):
        run(problem(architecture=deep), "triton", architecture=deep, optimizer="gd")
    with pytest.raises(NotImplementedError, match=r"window=None with an MLP memory"):
        run(problem(architecture="mlp"), "triton", architecture="mlp", optimizer="gd", window=None)
    with pytest.raises(NotImplementedError, match="chunk_size=65"):
        run(problem(), "triton", architecture="linear", chunk_size=65)
    q = torch.randn(1, 4, 1, 3, dtype=torch.float64, device=DEVICE)
    with pytest.raises(NotImplementedError, match="does not cover dtype torch.float64"):
        memorize(q, q, q, impl="triton")
    with pytest.raises(NotImplementedError, match=r"memory module\(Linear\) with muon"):
        memorize(q.float(), q.float(), q.float(), impl="triton", optimizer="muon", theta=0.5,
                 architecture=torch.nn.Linear(3, 3))


def test_auto_is_chunked_off_cuda_and_triton_on_cuda():
    p = problem(T=7)
    options = dict(architecture="linear", attentional_bias="l2", window=3, optimizer="momentum", chunk_size=3)
    o_auto, _, _ = run(p, "auto", **options)
    o_expected, _, _ = run(p, "triton" if DEVICE == "cuda" else "chunked", **options)
    assert torch.equal(o_auto, o_expected)
    deep = {"name": "mlp", "depth": 3}  # not covered: chunked
    o_mlp, _, _ = run(problem(architecture=deep), "auto", architecture=deep, optimizer="gd")
    assert torch.equal(o_mlp, run(problem(architecture=deep), "chunked", architecture=deep, optimizer="gd")[0])


# ---------------------------------------------------------------- slow: the full sweep

@pytest.mark.slow
@pytest.mark.parametrize("feature_map,bias,window,optimizer",
                         list(itertools.product(["identity", "polynomial", "taylor"], ["l2", "dot"], [1, 2, 5, None],
                                                ["gd", "momentum"])))
def test_linear_memory_sweep(feature_map, bias, window, optimizer):
    triton_vs_reference(feature_map=feature_map, T=13, attentional_bias=bias, window=window, optimizer=optimizer)


@pytest.mark.slow
@pytest.mark.parametrize("architecture,bias,window", list(itertools.product(["linear", "mlp", "gated_mlp"],
                                                                                 ["l2", "dot"], [1, 3, None])))
def test_muon_sweep(architecture, bias, window):
    triton_vs_reference(architecture=architecture, attentional_bias=bias, window=window, optimizer=CUBIC)


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size,window", [(16, 1), (16, 24), (32, None)])
def test_longer_sequences(chunk_size, window):
    """T = 50 with chunks of 16/32: full key blocks, windows across chunks and key blocks, d_v = 40 in two programs."""
    triton_vs_reference(T=50, B=1, H=2, d_k=16, d_v=40, impl="chunked", attentional_bias="l2", window=window,
                        optimizer="momentum", chunk_size=chunk_size)
