"""A memorize call's time on a GPU, predicted before it runs: the model of benchmarks/gpu_model.py, per path, for the
plan's choice (memory/plan.py; docs/memory.md §5.1, docs/performance.md).

    seconds(path) = C_LAUNCH · launches + C_WALK · walk + FLOPs / R

launches  kernels the path launches for the call's forward and backward (each PyTorch operator one, but views and
          allocations; each Triton kernel one): the path alone — memorize's work before and after it (heads first,
          the gates, the rule's act, the state) is the same on every path and left out
walk      chunks walked one after another by a kernel's programs (each chunk's state from the last): the chunk
          kernels' two scans walk ⌈T / chunk_size⌉ chunks each; fla's chunk kernels walk ⌈n / 64⌉ three times a
          piece (the forward's state pass, its recomputation in the backward, the backward's state pass)
FLOPs     matrix-product FLOPs of forward and backward: the chunk kernels' dots (their ``launches()``); fla and the
          chunked path three times the plan's forward FLOPs (cost.py: a product's backward is two of its size)

The constants are gpu_model's fit to the one GPU table (one H200, sweeps/mqar_gpu.yaml's Lightning fit at L 64 / 128
/ 256; benchmarks/gpu_model.py's header), as ``python benchmarks/gpu_model.py`` prints them (tests/test_gpu_model.py
holds them equal to its fit of the tree's counts):

    C0 = 0.46 ms (a step's, not a call's), C_launch = 28.2 µs, R = 256 TFLOP/s, C_walk = 2.04 µs;
    predicted / measured 0.93–1.03 on the 12 points.

C_walk rests on one preset: gated_deltanet on the chunk kernels at chunk 1 (2 walks of T chunks per layer), the only
measured route with a walk; its step grew 0.023 → 0.026 s from L 64 to 256 where its launches stayed 799. The table's
two significant digits (±0.0005 s a point) leave C_walk within about ±0.9 µs. R is not determined by the table (its
FLOPs move a step by < 1 ms): the FLOP term of a call is small beside its launches here.

The launch formulas (``triton_launches``, ``chunked_launches``, ``fla_launches``: fixed + per chunk, WY block or
piece, as counted on the meta device by ``gpu_model.count_path``; ``python benchmarks/gpu_model.py --paths PRESET``
prints both, and tests/test_gpu_model.py checks them equal at three lengths for every linear-memory preset a
choice is made for) hold for an identity feature map at window 1 and for swla's (polynomial φ, window 8), with the
gates a layer learns taking gradients (``grads``); elsewhere they are the nearest of these.

Adding a path: its coverage check and its cost (``cost(problem) -> Cost | None``) in plan.py's ``CANDIDATES``; its
formula here beside the others.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

C0 = 0.455e-3  # s a training step (gpu_model's fit; not part of a call)
C_LAUNCH = 28.17e-6  # s a launch
R = 255.8e12  # FLOP/s
C_WALK = 2.037e-6  # s a chunk walked in sequence
FLA_CHUNK = 64  # tokens a chunk of fla's chunk kernels


class Problem(NamedTuple):
    """A call as a path's coverage check and cost formula read it (the plan builds it): the resolved config's parts,
    the call's shapes (memory/plan.py's Shapes), dtype and device, the chunked path's form and block, D = dim φ(k),
    the memory's weights {name: (out, in)}, the plan's forward FLOPs per token and head (None: no formula), which
    gates act (plan.acting), whether a gate is per channel or a gradient at a per-token point, and the gates that
    take a gradient (``grads_of``)."""

    config: object
    mem: object
    fmap: object
    bias: object
    optimizer: object
    rule: object
    specs: dict
    shapes: tuple
    dtype: torch.dtype
    device: object
    form: str
    block: int
    D: int
    weights: dict
    flops: float | None
    acts: dict
    per_token: bool
    grads: frozenset


class Cost(NamedTuple):
    """A path's predicted cost of one call, forward and backward (``forward``: the forward's share of ``flops``;
    ``scratch``: the bytes its kernels move through a scratch buffer in global memory, muon's backward — not in
    ``seconds``: the fit has no bytes term, gpu_model bounds it at the memory's bandwidth)."""

    launches: int
    walk: int
    flops: float
    forward: float = 0.0
    scratch: int = 0

    def seconds_at(self, rate: float) -> float:
        """The prediction with the FLOPs at ``rate`` (FLOP/s) instead of the fit's R."""
        return C_LAUNCH * self.launches + C_WALK * self.walk + self.flops / rate

    @property
    def seconds(self) -> float:
        return self.seconds_at(R)


def kernel_bias(bias) -> str | None:
    """The chunk kernels' gradient form of an attentional bias: l2 (∇ℓ = y − v) or dot (∇ℓ = −v); None: neither."""
    from .components import declares

    if declares(bias, "delta_rule", "loss"):
        return "l2"
    if declares(bias, "linear_attention", "loss"):
        return "dot"
    return None


def grads_of(specs: dict) -> frozenset:
    """The gates a layer learns (a tensor that takes a gradient): learned, or a learned decay per head."""
    return frozenset(g for g, spec in specs.items() if spec.used and spec.value in ("learned", "head_decay"))


def shaped(p: Problem) -> bool:
    """A feature map other than the identity, or a window other than one token (swla's): more operators each."""
    return repr(p.fmap) != "identity" or p.config.window != 1


def _parts(T: int, chunk: int) -> int:
    """Groups of equal chunks from a fresh state (dispatch.chunk_rows: the full chunks, then a partial one)."""
    return int(T // chunk > 0) + int(T % chunk > 0)


# Launches of each path, forward and backward, as counted (fixed + per unit). In the formulas α, η: the retention and
# the step size take gradients (``grads``); P: groups of equal chunks (``_parts``); X: ``shaped``.
def triton_launches(p: Problem) -> int:
    """The linear memory's chunk kernels (dispatch.memorize_triton): forward 2 + 14·P (3 kernels, the closed form's
    rows per group of equal chunks) + 30·X (φ); backward 10 + 14·α (l2) or 7 + α·(23 + 29·(P − 1)) + η·(2 + 7·(P − 1))
    (dot), + 84·X, + 6 for inputs below float32 (their casts)."""
    a, e, X = "alpha" in p.grads, "eta" in p.grads, shaped(p)
    P = _parts(p.shapes.T, p.config.chunk_size)
    forward = 2 + 14 * P + 30 * X
    if kernel_bias(p.bias) == "l2":
        backward = 10 + 14 * a
    else:
        backward = 7 + a * (23 + 29 * (P - 1)) + e * (2 + 7 * (P - 1))
    return forward + backward + 84 * X + 6 * (p.dtype not in (torch.float32, torch.float64))


def chunked_launches(p: Problem) -> int | None:
    """The chunked path (chunked.py) on the linear memory, and on the 2-layer MLP (``mlp_launches``, per chunk); None
    for another form or memory (no formula yet).

    delta rule, n WY blocks of T·n_h steps: α per head 4 + f + 47·n forward, (1 + 40·n, or −10 + 83·n with α) + 3·f
    backward (f: gradients at a per-token point, ``rule.scaled``); α per key channel (blocks of 16) 5 + 51·n and
    −7 + 84·n, less 2 + 5·n with an erase gate
    linear form, n chunks: 1 + 43·n + 38·X forward; (−3 − 9·α + η) + (19 + 40·α + 2·η)·n + X·(91 + 4·n) backward"""
    from .components import declares

    if declares(p.mem, "two_layer", "forward") and p.form in ("linear", "transformed"):
        return mlp_launches(p, MLP_CHUNKED, math.ceil(p.shapes.T / p.config.chunk_size))
    if not declares(p.mem, "linear_map", "forward"):
        return None
    a, e, X = "alpha" in p.grads, "eta" in p.grads, shaped(p)
    T = p.shapes.T * p.rule.steps()
    if p.form == "delta_rule":
        n = math.ceil(T / p.block)
        scale = p.rule.scaled(p.acts)
        if p.specs["alpha"].axis != "head":
            erase = "erase" in p.grads
            return 5 + 51 * n + (-7 + 84 * n) - erase * (2 + 5 * n)
        return 4 + scale + 47 * n + ((-10 + 83 * n) if a else (1 + 40 * n)) + 3 * scale
    if p.form == "linear":
        n = math.ceil(p.shapes.T / p.config.chunk_size)
        forward = 1 + 43 * n + 38 * X
        backward = (-3 - 9 * a + e) + (19 + 40 * a + 2 * e) * n + X * (91 + 4 * n)
        return forward + backward
    return None


# The MLP memory's launches (2-layer MLP, ``two_layer``), fixed + per unit by its optimiser: counted on the shipped
# presets (``gpu_model --paths ttt_mlp titans omeganet atlas atlas_pp dot``) at the study's sizes; φ adds its own
# operators (MLP_PHI). The Triton path: the MLP kernel (or muon's fused one) and the closed form's rows per group of
# equal chunks (P); the chunked path: per chunk. (optimiser family, "gated" for a gated first layer where counted: the
# ungated row elsewhere) -> {the gates that take gradients: (fixed, per unit)}
MLP_TRITON = {"gd": {frozenset({"eta"}): (1, 23), None: (1, 50)}, "momentum": {None: (-9, 123)},
              "muon": {None: (-3, 84)}, "muon gated": {None: (2, 84)}}  # gated: W2 and W3 stacked, and split back
MLP_CHUNKED = {"gd": {frozenset({"eta"}): (-13, 167), None: (1, 207)}, "momentum": {None: (-88, 355)},
               "muon": {None: (18, 255)}, "muon gated": {None: (10, 348)}}  # muon: its Newton–Schulz batched
# Triton launches a chunk
MLP_PHI = {"identity": 0, "taylor": 48, "polynomial": 108}  # φ(q), φ(k) and their gradients (counted at p = 2)


def _mlp_family(p: Problem) -> str:
    from .components import declares

    if declares(p.optimizer, "direction", "update"):
        return "muon"
    return "momentum" if p.optimizer.state_shape((1, 1)) is not None else "gd"


def mlp_launches(p: Problem, table: dict, units: int) -> int:
    """Launches of a 2-layer MLP memory's call: MLP_PHI[φ] + fixed + per unit · units (the table's row for the
    optimiser's family and the gates that take gradients; their nearest where none is counted)."""
    family = _mlp_family(p)
    rows = table.get(f"{family} gated", table[family]) if p.mem.gated else table[family]
    fixed, per = rows.get(p.grads & {"alpha", "eta", "theta", "gamma"}, rows[None])
    return MLP_PHI.get(repr(p.fmap).split("(")[0], MLP_PHI["polynomial"]) + fixed + per * units


def fla_launches(p: Problem, op: str) -> int:
    """fla-core's chunk functions (fla.py): their kernels and the mapping's operators: gated delta rule 10 + 12, kda
    12 + 16, simple GLA 9 + 10 + 3·α + 3·η per call, and 13 + 26 + 8·α + 8·η more for a second piece (a call that
    ends inside a chunk runs in two)."""
    a, e = "alpha" in p.grads, "eta" in p.grads
    if op == "gated_delta_rule":
        return 10 + 12
    if op == "kda":
        return 12 + 16
    extra = _fla_pieces(p) - 1
    return 9 + 13 * extra + 10 + 3 * a + 3 * e + extra * (26 + 8 * a + 8 * e)


def _fla_pieces(p: Problem) -> int:
    """fla.memorize_fla's calls of fla's function: two where the call ends inside a chunk after a full one."""
    T, c = p.shapes.T, p.config.chunk_size
    return 2 if T % c and T > c else 1


def _fla_walk(p: Problem) -> int:
    """fla's three state passes (forward, its recomputation, backward) over ⌈n / 64⌉ chunks of each piece."""
    T, c = p.shapes.T, p.config.chunk_size
    pieces = [T - T % c, T % c] if T % c and T > c else [T]
    return 3 * sum(math.ceil(n / FLA_CHUNK) for n in pieces)


_KERNEL_FLOPS: dict = {}  # by _kernel_flops' arguments (a plain dict: torch.compile traces it without a warning)


FORWARD_KERNELS = ("chunk_state_contrib_kernel", "chunk_state_scan_kernel", "chunk_linear_memory_fwd_kernel",
                   "chunk_mlp_memory_fwd_kernel", "chunk_mlp_muon_fwd_kernel")  # the rest run in the backward


def _by_pass(each: dict) -> tuple[int, int]:
    """(forward, backward) dot FLOPs of a ``launches()`` dict."""
    forward = sum(f for name, (_, _, f) in each.items() if name in FORWARD_KERNELS)
    return int(forward), int(sum(f for _, _, f in each.values()) - forward)


def _kernel_flops(*key) -> tuple[int, int]:
    """The chunk kernels' dot FLOPs of a call, forward and backward (their ``launches()``: a loop over the chunks)."""
    if key not in _KERNEL_FLOPS:
        from .ops.chunk_linear_memory.triton import launches

        N, T, D, DV, chunk_size, window, bias, momentum = key
        _KERNEL_FLOPS[key] = _by_pass(launches(N, T, D, DV, chunk_size=chunk_size, window=window, bias=bias,
                                               momentum=momentum))
    return _KERNEL_FLOPS[key]


def forward_flops(p: Problem) -> float:
    """The plan's forward FLOPs of the call (0 where it has no formula)."""
    B, T, H = p.shapes.B, p.shapes.T, p.shapes.H
    return (p.flops or 0.0) * B * T * H


def _mlp_kernel(p: Problem) -> tuple[int, int, int]:
    """The MLP kernels' dot FLOPs of the call, forward and backward (``launches()`` of the kernel the family takes),
    and the bytes of muon's scratch (``scratch_bytes``; 0 for gd and momentum)."""
    B, T, H, d_k, d_v = p.shapes
    gated, family = p.mem.gated, _mlp_family(p)
    hidden, D = p.weights["W2" if gated else "W1"]  # the first layer's (gated: each of its pair W2, W3)
    key = ("mlp", family, B * H, T, D, hidden, d_v, p.config.chunk_size, p.config.window, kernel_bias(p.bias),
           getattr(p.optimizer, "ns_steps", 0), gated, p.dtype)
    if key not in _KERNEL_FLOPS:
        options = dict(chunk_size=p.config.chunk_size, gated=gated)
        if family == "muon":
            from .ops.chunk_mlp_memory.muon import launches, scratch_bytes
            steps = dict(steps=p.optimizer.ns_steps, dtype=p.dtype)
            each = launches(B * H, T, D, hidden, d_v, window=p.config.window, bias=kernel_bias(p.bias), **steps,
                            **options)
            scratch = scratch_bytes(B * H, T, D, hidden, d_v, **steps, **options)
        else:
            from .ops.chunk_mlp_memory.triton import launches
            each = launches(B * H, T, D, hidden, d_v, window=p.config.window, bias=kernel_bias(p.bias),
                            momentum=family == "momentum", **options)
            scratch = 0
        _KERNEL_FLOPS[key] = (*_by_pass(each), scratch)
    return _KERNEL_FLOPS[key]


def triton_cost(p: Problem) -> Cost | None:
    """The chunk kernels: their launches, their walks (the linear memory's two scans, the MLP kernels' two programs:
    ⌈T / chunk⌉ chunks each), their dots (the kernels' ``launches()``); None for another memory."""
    from .components import declares
    B, T, H, d_k, d_v = p.shapes
    NC = math.ceil(T / p.config.chunk_size)
    if declares(p.mem, "two_layer", "forward"):
        low = 12 * (p.dtype not in (torch.float32, torch.float64))  # the casts of 16-bit inputs and their gradients
        forward, backward, scratch = _mlp_kernel(p)
        return Cost(mlp_launches(p, MLP_TRITON, _parts(T, p.config.chunk_size)) + low, 2 * NC, forward + backward,
                    forward, scratch)
    if not declares(p.mem, "linear_map", "forward"):
        return None
    momentum = p.optimizer.state_shape((1, 1)) is not None
    forward, backward = _kernel_flops(B * H, T, p.D, d_v + int(p.config.normalize), p.config.chunk_size,
                                      p.config.window, kernel_bias(p.bias), momentum)
    return Cost(triton_launches(p), 2 * NC, forward + backward, forward)


def chunked_cost(p: Problem) -> Cost | None:
    launches = chunked_launches(p)
    return None if launches is None else Cost(launches, 0, 3 * forward_flops(p), forward_flops(p))


def fla_cost(p: Problem, op: str) -> Cost:
    return Cost(fla_launches(p, op), _fla_walk(p), 3 * forward_flops(p), forward_flops(p))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
