"""``plan``: the one place that decides how a ``memorize`` call is computed (docs/memory.md §5). On CUDA (impl="auto")
it takes, of the paths that compute the call (``CANDIDATES``: each path's coverage check and cost, in one place), the
one of the lowest predicted time on the GPU model (predict.py); on the CPU, the chunked path.

    plan(config, shapes, dtype, device, impl="auto") -> Plan(path, form, block, carried, flops, reason)

path     reference (the token loop: the oracle) | chunked (PyTorch, a chunk at a time) | triton (atlas_lab.memory.ops)
         | fla (flash-linear-attention's chunk kernels, where they compute the same rule)
form     the in-chunk evaluation of the chunked path (``chunked.FORMS``), from what the components declare:
           delta_rule   chunk 1, window 1, a linear map, the l2 bias and gd: the gated delta rule in WY blocks
           linear       an optimiser linear in the gradients (``chunk_coefficients``): closed form, dual-form read
           transformed  S_t in closed form, D(S_t) on all of them at once (``direction``: muon)
           accumulated  A_t in closed form, W_t = T(A_t) at once (``weights``: ℓq / KL retention)
           stepwise     ``update`` token by token on the chunk's gradients (gates per channel, adam, a user's rule)
           chunk_start  read="chunk": every token reads the chunk's start; one optimiser step per chunk
block    tokens per block of that form (the chunk size; the delta rule's WY block)
carried  what a state continued in the middle of a chunk carries besides the weights: eval_weights (read token: the
         chunk's evaluation point), pending (read chunk: Σ g and its gates, per level), or nothing (chunk 1 and no
         level longer)
flops    forward FLOPs per token and head of the form (cost.py; None where no formula is known)
reason   why this path: on CUDA (auto) every covering path's predicted time (predict.py) and why the others do not
         cover the call
predictions  on CUDA (auto): ((path, predicted seconds of the call's forward and backward, or None: no formula), ...)
op       for path fla, fla-core's op (fla.py)
row      of a token's n_h steps (DeltaProduct), the one whose output it reads: the last (read token), the first
         (read start or chunk: the weights before the token)
ns       muon's Newton–Schulz: fused (inside the fused MLP kernel of path triton: ops/chunk_mlp_memory/muon.py), triton
         (one batched launch per chunk: ops/newton_schulz/triton.py), cpu (the compiled CPU kernel), bmm (batched
         matmuls); None for an optimizer without one

A capability is what a component declares (components.declares), never its concrete class.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from . import cost, predict
from .components import declares
from .config import Resolved
from .delta_rule import delta_rule_applies, delta_rule_block
from .ops.newton_schulz import cpu as newton_schulz_cpu
from .optimizers import period
from .predict import Problem, kernel_bias

IMPLS = ("reference", "chunked", "triton", "fla", "auto")
CARRIED = {"token": "eval_weights", "start": "eval_weights", "chunk": "pending"}  # mid-chunk, by read (§4.1)
FLA_DTYPES = (torch.bfloat16, torch.float16)  # the inputs fla's chunk kernels take (they compute in float32)
FLA_DEVICES = ("cuda",)
FLA_INSTALLED = importlib.util.find_spec("fla") is not None  # fla-core (its chunk kernels need a GPU to run)


class Shapes(NamedTuple):
    """One call's sizes: q [B, T, H, d_k], v [B, T, H, d_v]."""

    B: int
    T: int
    H: int
    d_k: int
    d_v: int


@dataclass(frozen=True)
class Plan:
    path: str
    form: str
    block: int
    carried: str
    flops: float | None
    reason: str
    row: int = 0  # of a token's n_h steps, the one whose output it reads (token: after the last; chunk: the first)
    op: str | None = None  # path fla: fla-core's op (fla.py: FLA_OPS)
    ns: str | None = None  # muon's Newton–Schulz: fused | triton | cpu | bmm
    predictions: tuple = ()  # on CUDA (auto): ((path, predicted seconds or None: no formula), ...) of every path
    #                          that computes the call (predict.py)


def form_of(config, mem, bias, optimizer, specs: dict) -> tuple[str, int]:
    """(form, block) of the chunked path (module docstring) for a config, its components and its rule's gates
    (``specs``: a gate learned per channel runs token by token — the closed forms take one gate per head — except in
    the delta rule, whose blocks are shorter for a retention per key channel)."""
    if config.read == "chunk":
        return "chunk_start", config.chunk_size
    if config.read == "token" and config.chunk_size == 1 and config.window == 1 and delta_rule_applies(mem, bias,
                                                                                                      optimizer):
        return "delta_rule", delta_rule_block(specs["alpha"].axis != "head")
    channels = any(spec.axis != "head" for spec in specs.values())
    if channels:
        return "stepwise", config.chunk_size
    for form, capability in (("transformed", "direction"), ("accumulated", "weights"),
                             ("linear", "chunk_coefficients")):
        if declares(optimizer, capability, "update"):
            return form, config.chunk_size
    return "stepwise", config.chunk_size


def triton_gap(config, mem, bias, optimizer, form: str, weights: dict, dtype, device, per_token: bool) -> str | None:
    """Why the Triton kernels (atlas_lab.memory.ops) do not compute a call (None when they do). form: the chunked
    path's (``form_of``); weights: {name: (out, in)} of the memory; per_token: a gate per channel or gradients at
    per-token points (the kernels take one gate per head and every gradient at the chunk's start)."""
    from .ops.limits import MAX_CHUNK, MAX_COLS, MAX_FEATURES, MAX_ROWS

    if config.read != "token":
        return f"read={config.read!r} (the kernels compute per-token reads)"
    if per_token:
        return "gates per channel or gradients at per-token points (gradient_at='retained', an erase gate)"
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {dtype}"
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"tensors on {torch.device(device).type} (on the CPU, set TRITON_INTERPRET=1 before triton is imported)"
    if kernel_bias(bias) is None:
        return f"bias {bias!r}"
    if declares(optimizer, "one_triple", "direction"):  # muon: the chunked path with the batched NS kernel
        if not declares(mem, "gradient_factors", "forward"):
            return f"memory {mem!r} with muon"
        big = [n for n, shape in weights.items() if min(shape) > MAX_ROWS or max(shape) > MAX_COLS]
        return f"weights {big} larger than {MAX_ROWS} × {MAX_COLS} with muon" if big else None
    if form not in ("linear", "delta_rule"):  # the kernels' closed form: a rule linear in the gradients
        return f"optimizer {optimizer!r}"
    if declares(mem, "two_layer", "forward"):  # the MLP kernel: r(k) + W2 σ(W1 φ(k))
        return mlp_gap(config, weights, "gd" if optimizer.state_shape((1, 1)) is None else "momentum", dtype,
                       mem.gated)
    if not declares(mem, "linear_map", "forward"):
        return f"memory {mem!r} with optimizer {optimizer!r}"
    if weights["W"][1] > MAX_FEATURES:
        return f"D = {weights['W'][1]} features (more than {MAX_FEATURES})"
    if config.chunk_size > MAX_CHUNK:
        return f"chunk_size={config.chunk_size} (more than {MAX_CHUNK})"
    return None


def mlp_gap(config, weights: dict, family: str, dtype, gated: bool = False) -> str | None:
    """Why an MLP chunk kernel (ops/chunk_mlp_memory; family: gd, momentum or muon) does not compute a 2-layer MLP
    memory's call in ``dtype`` (None when it does): it walks a chunk's window of b + c − 1 keys with the weights whole
    on chip, within one block's shared memory on sm_90 (``MLP_ENTRIES``; a gated pair W2, W3 held as one block of
    twice the rows)."""
    from .ops.limits import MAX_MLP_KEYS, MLP_ENTRIES, padded

    if config.window is None:
        return "window=None with an MLP memory (its kernel walks windows of chunk_size + c − 1 keys)"
    if config.chunk_size + config.window - 1 > MAX_MLP_KEYS:
        return f"chunk_size + window − 1 = {config.chunk_size + config.window - 1} keys (more than {MAX_MLP_KEYS})"
    entries = MLP_ENTRIES[family] * (2 if dtype in (torch.float16, torch.bfloat16) else 1)
    pair = ("W2", "W3") if gated else ()
    big = [f"{n} {o} × {i}" for n, (o, i) in weights.items() if padded(o) * padded(i) * (2 if n in pair else 1)
           > entries]
    return (f"weights {', '.join(big)} in {str(dtype).removeprefix('torch.')} (more than {entries} padded entries: "
            f"the {family} kernel's backward would exceed an sm_90 block's shared memory)") if big else None


def kernels_gap(p: Problem) -> str | None:
    """``triton_gap`` of the call ``p``: for muon, whether its batched Newton–Schulz kernel takes the weights."""
    return triton_gap(p.config, p.mem, p.bias, p.optimizer, p.form, p.weights, p.dtype, p.device, p.per_token)


def muon(p: Problem) -> bool:
    """Muon with one (a, b, c) for every step: its Newton–Schulz in a kernel (the fused MLP one, or the batched one)."""
    return declares(p.optimizer, "one_triple", "direction")


def muon_kernel_gap(p: Problem) -> str | None:
    """Why muon's fused MLP kernel (ops/chunk_mlp_memory/muon.py) does not compute a call the Triton path covers
    (None when it does): a 2-layer MLP, plain or gated, whose weights have no more rows than columns (its
    Newton–Schulz takes X Xᵀ of each matrix as it is), within the MLP kernel's sizes (``mlp_gap``)."""
    if not declares(p.mem, "two_layer", "forward"):
        return f"memory {p.mem!r}"
    tall = [f"{n} {o} × {i}" for n, (o, i) in p.weights.items() if o > i]
    return f"weights {', '.join(tall)} (more rows than columns)" if tall else mlp_gap(p.config, p.weights, "muon",
                                                                                        p.dtype, p.mem.gated)


FLA_COVERAGE = ("impl='fla' covers a linear memory with gd at window 1, read token, no normalisation: the l2 bias at "
                "chunk 1 with α per head (chunk_gated_delta_rule) or per key channel (chunk_kda), gradients at the "
                "retained weights (gradient_at='retained', or α ≡ 1), and the dot bias at any chunk with α per head "
                "(chunk_simple_gla); bfloat16 or float16 inputs on CUDA, fla-core installed")


def fla_op(config, mem, bias, optimizer, rule, specs: dict, acts: dict, D: int) -> tuple[str | None, str]:
    """(fla-core's op, "") for a call whose rule, gates, normalisation and read fla computes exactly (fla.py);
    (None, why not) otherwise. The dtype and device are checked by the caller."""
    for wrong, what in ((config.read != "token", f"read={config.read!r}"), (config.normalize, "normalize=True"),
                        (config.window != 1, f"window={config.window} (fla's rules are online: window 1)")):
        if wrong:
            return None, what
    if rule.steps() != 1 or rule.reset_period() is not None:
        return None, f"{rule!r}'s steps per token or resets"
    if not declares(mem, "linear_map", "forward") or not declares(optimizer, "delta_rule", "update"):
        return None, f"memory {mem!r} with optimizer {optimizer!r} (fla's rules are gd on a linear memory)"
    if any(spec.axis != "head" for g, spec in specs.items() if g != "alpha") or acts.get("erase") or acts.get("write"):
        return None, "erase or write gates (fla's gdn2 op is not wired)"
    if D > 256:
        return None, f"D = {D} features (fla's kernels take at most 256)"
    per_channel = specs["alpha"].axis != "head"
    if kernel_bias(bias) == "l2":
        if config.chunk_size != 1:
            return None, f"chunk_size={config.chunk_size} with the l2 bias (fla's delta rules are the exact rule)"
        if not rule.retained() and acts["alpha"]:
            return None, "gradients at W_{t−1} with a retention α (fla's: at α_t ⊙ W_{t−1}, gradient_at='retained')"
        return ("kda" if per_channel else "gated_delta_rule"), ""
    if kernel_bias(bias) == "dot" and not per_channel:
        return "simple_gla", ""
    return None, f"bias {bias!r}" + (" with α per channel" if per_channel else "")


def acting(specs: dict, given: dict | None = None) -> dict[str, bool]:
    """{gate: whether it acts}: a tensor, or a number other than 1 (``given``: a call's values, None where the
    config's constant holds) — α ≡ 1 keeps no retention, erase ≡ 1 and write ≡ 1 do nothing."""
    given = given or {}
    return {g: not (isinstance(value, (int, float)) and value == 1.0)
            for g, value in ((g, spec.value if given.get(g) is None else given[g]) for g, spec in specs.items())}


def check_impl(impl: str) -> None:
    """ValueError unless ``impl`` is one of IMPLS (memorize checks it first: a call with resets may plan no piece)."""
    if impl not in IMPLS:
        raise ValueError(f"memorize: unknown impl={impl!r}; valid choices: {', '.join(IMPLS)}")


def newton_schulz_variant(optimizer, dtype, device, triton: bool, fused: bool = False) -> tuple[str | None, str]:
    """(muon's Newton–Schulz variant, why) for a call in ``dtype`` on ``device``; triton: the Triton path covers it;
    fused: the fused MLP kernel computes the call. None for an optimizer without Newton–Schulz."""
    if not declares(optimizer, "with_ns", "direction"):
        return None, ""
    if fused:
        return "fused", "its Newton–Schulz inside the fused MLP kernel (ops/chunk_mlp_memory/muon.py)"
    if triton:
        return "triton", "its Newton–Schulz one batched Triton launch per chunk"
    if not declares(optimizer, "one_triple", "direction"):
        return "bmm", "its Newton–Schulz in batched matmuls (a schedule of triples: no kernel takes it)"
    if torch.device(device).type == "cpu" and dtype in newton_schulz_cpu.DTYPES and newton_schulz_cpu.available():
        return "cpu", "its Newton–Schulz in the compiled CPU kernel"
    return "bmm", f"its Newton–Schulz in batched matmuls ({dtype} on {torch.device(device).type})"


def fla_gap(p: Problem) -> tuple[str | None, str]:
    """(fla-core's op, "") where fla computes the call ``p`` in its dtype on its device, else (None, why not)."""
    op, gap = fla_op(p.config, p.mem, p.bias, p.optimizer, p.rule, p.specs, p.acts, p.D)
    if op is not None and p.dtype not in FLA_DTYPES:
        op, gap = None, f"dtype {p.dtype} (fla's chunk kernels take bfloat16 or float16 inputs: bf16-mixed)"
    if op is not None and torch.device(p.device).type not in FLA_DEVICES:
        op, gap = None, f"tensors on {torch.device(p.device).type} (fla's chunk kernels run on CUDA)"
    if op is not None and not FLA_INSTALLED:
        op, gap = None, "fla-core not installed (pip install fla-core)"
    return op, gap


class Candidate(NamedTuple):
    """A path the plan may choose on CUDA (impl="auto"): gap(problem) -> why it does not compute the call (None:
    it does); cost(problem) -> its predicted cost (predict.Cost; None: no formula for this call)."""

    gap: Callable[[Problem], str | None]
    cost: Callable[[Problem], predict.Cost | None]


# the candidates, in the order taken where a covering one has no formula (then the first that covers)
CANDIDATES = {
    "fla": Candidate(lambda p: fla_gap(p)[1] or None, lambda p: predict.fla_cost(p, fla_gap(p)[0])),
    "triton": Candidate(lambda p: kernels_gap(p) or (muon_kernel_gap(p) if muon(p) else None), predict.triton_cost),
    "chunked": Candidate(lambda p: None, predict.chunked_cost),
}


def label(path: str, form: str) -> str:
    return f"chunked ({form})" if path == "chunked" else path


def choose(problem: Problem) -> tuple[str, str, tuple]:
    """(path, why, ((path, predicted seconds or None), ...)) on CUDA: of the candidates that compute the call, the
    one of the lowest predicted time (predict.py); where one has no formula, the first that covers, in
    ``CANDIDATES``' order."""
    covering, gaps = {}, []
    for name, candidate in CANDIDATES.items():
        gap = candidate.gap(problem)
        if gap is None:
            cost = candidate.cost(problem) if problem.shapes.T else predict.Cost(0, 0, 0.0)  # T = 0: nothing runs
            covering[name] = None if cost is None else cost.seconds
        else:
            gaps.append(f"not {name}: {gap}")
    predictions = tuple(covering.items())
    shown = "; ".join(f"{label(n, problem.form)}: " + ("no formula" if t is None else f"predicted {predict.ms(t)}")
                      for n, t in sorted(predictions, key=lambda x: math.inf if x[1] is None else x[1]))
    if len(covering) == 1:
        path, why = next(iter(covering)), f"{shown} (the only path that computes it)"
    elif any(t is None for t in covering.values()):
        path, why = next(iter(covering)), f"{shown} (not every path predicted: the first that computes it)"
    else:
        path, why = min(covering, key=covering.get), shown
    return path, "; ".join([why, *gaps]), predictions


def call_problem(config, shapes: Shapes, dtype=torch.float32, device="cpu", acts: dict | None = None) -> Problem:
    """The call as the paths' coverage checks and cost formulas read it (predict.Problem), for ``plan``'s arguments."""
    resolved = config if isinstance(config, Resolved) else config.resolve()
    config, mem, fmap, bias, optimizer, rule, specs = resolved
    if acts is None:
        acts = acting(specs)
    channels = any(spec.axis != "head" for spec in specs.values())
    D = fmap.dim(shapes.d_k)
    d_v = shapes.d_v + int(config.normalize)
    weights = mem.shapes(D, shapes.d_k, d_v)
    form, block = form_of(config, mem, bias, optimizer, specs)
    steps = shapes.T * rule.steps()  # the rule runs n_h steps per token, each with its read
    flops = cost.form_flops(form, config, mem, optimizer, weights, D, shapes.d_k, d_v, steps, block,
                            config.read == "start") if declares(mem, "gradient_factors", "forward") else None
    flops = None if flops is None or shapes.T == 0 else flops / shapes.T
    return Problem(config, mem, fmap, bias, optimizer, rule, specs, shapes, dtype, device, form, block, D, weights,
                   flops, acts, channels or rule.scaled(acts), predict.grads_of(specs))


def plan(config, shapes: Shapes, dtype=torch.float32, device="cpu", impl: str = "auto", acts: dict | None = None
         ) -> Plan:
    """How ``memorize`` computes a call of ``config`` (a MemoryConfig, or its ``resolve``) at ``shapes``, in ``dtype``
    on ``device``, with ``impl`` asked (memorize's argument). acts: {gate: whether it acts} (``acting``; None: as the
    config sets them). On CUDA, impl="auto" takes the path of the lowest predicted time among those that compute
    the call (``choose``). An impl that cannot compute the call raises NotImplementedError with the reason and what
    it covers."""
    check_impl(impl)
    problem = call_problem(config, shapes, dtype, device, acts)
    config, optimizer, rule = problem.config, problem.optimizer, problem.rule
    form, block, flops = problem.form, problem.block, problem.flops
    # tokens until every weight matrix has committed (read chunk: the longest level of the rule's commits)
    longest = period(rule.commits(problem.weights, config.chunk_size)) if config.read == "chunk" \
        else config.chunk_size
    carried = CARRIED[config.read] if longest > 1 else "nothing"
    row = rule.row(config.read)

    def made(path, reason, triton=False, predictions=(), fused=False):
        ns, why = newton_schulz_variant(optimizer, dtype, device, triton, fused)
        return Plan(path, form, block, carried, flops, reason + (f"; {why}" if why else ""), row, ns=ns,
                    predictions=predictions)

    cuda = torch.device(device).type == "cuda"
    ns_kernel = muon(problem) and kernels_gap(problem) is None  # muon's Newton–Schulz in a Triton kernel
    if impl in ("reference", "chunked"):  # chunked on CUDA: muon's batched Newton–Schulz kernel where it covers
        return made(impl, "asked", triton=impl == "chunked" and cuda and ns_kernel)
    if impl == "fla":
        op, gap = fla_gap(problem)
        if op is None:
            raise NotImplementedError(f"memorize: impl='fla' does not cover {gap}. {FLA_COVERAGE}")
        return dataclasses.replace(made("fla", f"asked: fla-core's chunk_{op}"), op=op)
    if impl == "triton":
        gap = kernels_gap(problem)
        if gap is None and muon(problem):  # muon: the fused MLP kernel, else the chunked path around the batched NS
            fused = muon_kernel_gap(problem)
            if fused is None:
                return made("triton", "asked: muon on the fused MLP kernel", fused=True)
            return made("chunked", f"asked: muon on the chunked path (not the fused MLP kernel: {fused})", triton=True)
        if gap is None:
            return made("triton", "asked")
        from .ops.limits import COVERAGE
        raise NotImplementedError(f"memorize: impl='triton' does not cover {gap}. {COVERAGE}")
    if not cuda:
        return made("chunked", f"on {torch.device(device).type}: the chunked path ({form})")
    path, why, predictions = choose(problem)
    how = made(path, why, predictions=predictions, fused=ns_kernel and path == "triton",
               triton=ns_kernel and path == "chunked")
    return dataclasses.replace(how, op=fla_gap(problem)[0]) if path == "fla" else how
