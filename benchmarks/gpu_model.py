"""A model of a training step on a GPU, counted on the CPU: launches, matrix-product FLOPs and bytes of one step,
fitted to the one GPU table we have.

    python benchmarks/gpu_model.py [--sweep sweeps/mqar_gpu.yaml] [--presets ...] [--lengths 64 128 256]
                                   [--no-125m] [--tf32-rate 250] [--record PATH] [--from-record PATH]

The model:  step ≈ C0 + C_launch · launches + FLOPs / R + C_walk · walk

(walk: the chunks Triton kernels' programs walk one after another, ``WALKS``). The plan chooses a memory call's path
on CUDA by the same model, per path (atlas_lab/memory/predict.py: these constants; ``count_path`` counts one path
of one call, against which tests/test_gpu_model.py checks its formulas).

Counted (``count_step``): one training step as a fit runs it on CUDA — ``SequenceModel.training_step`` (forward,
loss, its finiteness check), backward, gradient clipping at norm 1 (lightning_config.yaml) and AdamW with
``foreach`` (torch's choice on CUDA), the second step (the first also creates AdamW's state). The model's tensors are
on the ``meta`` device (shapes only, no arithmetic: about 0.5 ms of one core an operator, so the cost grows with the
launches, not the FLOPs), and the memory's plan is asked as on CUDA (``on_cuda``): each call takes the path it takes
there (``MEASURED_ROUTES``: the fit counts each measured preset on the path it was measured on). Each aten operator
on a meta tensor is one launch, except views, allocations and metadata (``NO_KERNEL``) and those that launch more
(``KERNELS``: a select's or a slice's backward, zeros and a copy); a ``_foreach_`` operator is its multi-tensor-apply
launches (``foreach_launches``: chunks of 65,536 elements, at most 320 blocks and 110/64/48/36/30 tensors a launch by
depth); each Triton kernel (``kernel[grid](...)``, ours and fla's) one launch; an ``atlas_lab::`` operator (the
Newton–Schulz kernel) one launch. Operators on CPU tensors (AdamW's step counters) launch nothing on a GPU and are
left out; ``.item()`` is a host synchronisation, counted apart. FLOPs: torch's formulas for the matrix products and
attention (``torch.utils.flop_counter``), the Newton–Schulz kernel's products (``ns_flops``), and for a call the plan
routes to the chunk kernels or fla, its forward and backward dots as the plan predicts them (predict.py: the chunk
kernel's ``launches()``; fla: three times the plan's forward FLOPs). Bytes: every launch's tensors, read or written
once. Scratch: the bytes a chunk kernel moves through a scratch buffer of its own in global memory (muon's backward
keeps each token's Newton–Schulz iterates there: ``predict.Cost.scratch``), not in the fit (the table's steps have
none): the step at tf32 with the scratch at ``HBM``'s bandwidth bounds atlas's from above, the step with it held in
the L2 cache (free) from below, and atlas's target is judged at the bound from above. ``envelope`` prints atlas's
step four ways: host issue and GPU work added (the fit's form) or overlapped in each stretch between host
synchronisations, the scratch in L2 or at HBM's bandwidth (a call's forward FLOPs in the forward, the rest in the
backward).
Left out: Lightning's logging of train/loss and the batch's copy to the GPU (a few launches, in C0).

The measurement (``MEASURED``): the only GPU table we have — one H200, the Lightning fit of
sweeps/mqar_gpu.yaml at its fixed sizes (d_model 128, 2 layers, memory heads 8, V 8192, batch 64, float32),
s/step at L 64 / 128 / 256, an earlier tree (before the compile and routing changes since); gated_deltanet then took
the Triton chunk kernel (no fla), and atlas did not finish 60 steps and a validation in 85 s (> 1 s a step).

The fit (``fit``: non-negative least squares on the ratio predicted / measured, the 12 points; counts of this tree,
each preset on the route it was measured on: gated_deltanet the Triton chunk kernels, omeganet and titans the chunked
path), as this script prints it:

    C0 = 0.46 ms, C_launch = 28.2 µs, R = 256 TFLOP/s, C_walk = 2.04 µs
    predicted / measured 0.93–1.03 on the 12 points (max ratio 1.07); each preset left out of the fit and predicted
    by the other three: transformer 0.89–0.94, gated_deltanet 0.91–1.01, omeganet 1.03–1.05, titans 0.91–0.98
    atlas: predicted 0.044 s at L 64 against a measured > 1 s; for the bound its 5.15 TFLOP would run at
    ≤ 5.3 TFLOP/s (today's count, the fused muon kernel; the bound was measured on the chunked path, and also holds
    the pilot's compiles and a validation up to L 1024)

Without the walk term (C_walk = 0) the same fit gave C0 = 0.37 ms, C_launch = 28.5 µs, R = 196 TFLOP/s, 0.92–1.04
(gated_deltanet 1.01 / 0.98 / 0.92 at L 64 / 128 / 256: its steps grew where its 799 launches did not). C_walk rests
on gated_deltanet alone (2 walks of L chunks a layer; left out, nothing else determines it) and on the table's two
significant digits (±0.0005 s a point): within about ±0.9 µs.

C_launch is the host's cost of one launch (Python, the dispatcher, autograd). R is not determined by the table: its
FLOPs are small (the transformer's 37–158 GFLOP a step move its step by < 1 ms), and 256 TFLOP/s is more than an
H200 computes in IEEE fp32 (67); take the FLOP term as unmeasured. ``--tf32-rate`` (default 250 TFLOP/s, about half
of an H200's dense tf32 peak) is the rate stated for tensor cores, which atlas's target is judged at.
``make gpu-check`` prints the same table measured beside predicted, and refits the constants on its own pilot where a
GPU runs it (benchmarks/gpu_check.py, part e).
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # atlas_lab from this checkout, installed or not
    sys.path.insert(1, str(ROOT))

import common  # noqa: E402  (benchmarks/common.py)

# one H200, the Lightning fit of sweeps/mqar_gpu.yaml at its fixed sizes (d_model 128, 2 layers, memory heads 8,
# V 8192, batch 64, float32): s/step at each training length; gated_deltanet on the Triton chunk kernel (no fla)
MEASURED = {
    "transformer": {64: 0.0092, 128: 0.0090, 256: 0.0095},
    "gated_deltanet": {64: 0.023, 128: 0.024, 256: 0.026},
    "omeganet": {64: 0.072, 128: 0.118, 256: 0.212},
    "titans": {64: 0.103, 128: 0.176, 256: 0.344},
}
# the path each preset's memory took when it was measured (the fit counts it there, whatever the plan takes today)
MEASURED_ROUTES = {"gated_deltanet": "triton", "omeganet": "chunked", "titans": "chunked"}
MEASURED_BOUNDS = {"atlas": 1.0}  # s/step it took at least (60 steps and a validation did not finish in 85 s)
SWEEP = "sweeps/mqar_gpu.yaml"
# gpu_check's training models counted only when named (--presets): atlas with per-token reads at the 125M-class size
# is about 4.8e7 launches (hours on the meta device); gpu_check's own count reaches it only where time allows
SLOW_TO_COUNT = ("atlas",)
LENGTHS = (64, 128, 256)
GRAD_CLIP = 1.0  # lightning_config.yaml's gradient_clip_val
TF32_RATE = 250e12  # FLOP/s stated for float32 products on tensor cores (tf32): about half an H200's dense peak
HBM = 4.8e12  # bytes/s, an H200's memory bandwidth: the chunk kernels' scratch at it bounds their step from above

# leaf operators that only make a view, allocate, or do nothing: no kernel on a GPU
NO_KERNEL = {
    "as_strided", "view", "_reshape_alias", "_unsafe_view", "reshape", "alias", "detach", "detach_", "t",
    "transpose", "permute", "expand", "squeeze", "unsqueeze", "select", "slice", "unbind", "split", "chunk",
    "narrow", "diagonal", "unfold", "view_as", "expand_as", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "resize_", "resolve_conj", "resolve_neg", "to", "lift_fresh", "is_nonzero", "item",
    "size", "stride", "numel", "dim", "contiguous", "result_type", "broadcast_tensors", "set_", "conj",
    "scalar_tensor", "split_with_sizes", "unsafe_split", "_unsafe_view", "view_as_real", "view_as_complex",
    "expand_copy", "_neg_view", "_conj", "sym_size", "sym_stride", "sym_numel", "is_same_size",
    "_has_compatible_shallow_copy_type", "prim"}
# operators whose CUDA kernel is more than one launch: the backward of a select, slice or diagonal is zeros, then a
# copy into the view (ATen's TensorShape.cpp)
KERNELS = {"select_backward": 2, "slice_backward": 2, "diagonal_backward": 2}
SYNC = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}  # a host synchronisation
# Triton kernels whose programs walk the chunks one after another (each chunk's state from the last): the chunks
# each program walks, from the launch's arguments (ours: NC, the last positional argument; fla's: ⌈T / BT⌉). The
# MLP kernels' programs compute each chunk's products (and muon's Newton–Schulz) in their walk: heavier steps than
# the scans' C_walk was fitted on
WALKS = {
    **dict.fromkeys(("chunk_state_scan_kernel", "chunk_grad_scan_kernel", "chunk_mlp_memory_fwd_kernel",
                     "chunk_mlp_memory_bwd_kernel", "chunk_mlp_muon_fwd_kernel", "chunk_mlp_muon_bwd_kernel"),
                    lambda args, kwargs: args[-1]),
    **dict.fromkeys(("chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
                     "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64", "chunk_fwd_kernel_h", "chunk_bwd_kernel_dh"),
                    lambda args, kwargs: -(-kwargs["T"] // kwargs["BT"])),
}

# multi_tensor_apply (ATen's foreach kernels): elements a chunk, and per launch at most so many blocks and, by the
# operator's number of tensor lists (its depth), so many tensors
MTA_CHUNK, MTA_BLOCKS, MTA_TENSORS = 65536, 320, {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}


def foreach_launches(numels: list[int], depth: int) -> int:
    """Kernel launches of one ``_foreach_`` operator on CUDA over tensors of ``numels`` elements with ``depth``
    tensor lists (outputs included): a launch each time a launch's blocks (chunks of MTA_CHUNK) or tensors are full,
    and one for what is left."""
    launches = blocks = tensors = 0
    limit = MTA_TENSORS[min(depth, 5)]
    for n in numels:
        if n == 0:
            continue
        tensors += 1
        chunks = math.ceil(n / MTA_CHUNK)
        for c in range(chunks):
            blocks += 1
            if blocks == MTA_BLOCKS or (tensors == limit and c == chunks - 1):
                launches += 1
                blocks = 0
                tensors = 1 if c < chunks - 1 else 0
    return launches + (blocks > 0)


def ns_flops(M: int, R: int, C: int, steps: int, quintic: bool, backward: bool) -> int:
    """Dot FLOPs of the Newton–Schulz kernel on M matrices R × C (R ≤ C; ops/newton_schulz/triton.py): forward, per
    step X Xᵀ (2R²C), A² (2R³, quintic), B X (2R²C); backward, the k − 1 iterates recomputed, then per step X Xᵀ, A²,
    dX Xᵀ, dB A and A dB (quintic), B dX and sym X."""
    step = 4 * R * R * C + (2 * R ** 3 if quintic else 0)
    if not backward:
        return M * steps * step
    back = 8 * R * R * C + (6 * R ** 3 if quintic else 0)
    return M * ((steps - 1) * step + steps * back)


@dataclass
class Count:
    """One step's launches (by operator; Triton kernels by name), FLOPs, bytes and host synchronisations, by phase
    (forward: training_step; backward; optimizer: clipping and AdamW)."""
    launches: Counter = field(default_factory=Counter)
    flops: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    ops: Counter = field(default_factory=Counter)
    walk: Counter = field(default_factory=Counter)
    scratch: Counter = field(default_factory=Counter)  # bytes the chunk kernels move through their scratch
    phase: str = "forward"

    def add(self, op: str, launches: int = 1, flops: int = 0, nbytes: int = 0) -> None:
        self.launches[self.phase] += launches
        self.flops[self.phase] += flops
        self.bytes[self.phase] += nbytes
        self.ops[op] += launches

    def total(self) -> dict:
        return dict(launches=sum(self.launches.values()), flops=sum(self.flops.values()),
                    bytes=sum(self.bytes.values()), syncs=sum(self.syncs.values()), walk=sum(self.walk.values()),
                    scratch=sum(self.scratch.values()),
                    by_phase={p: dict(launches=self.launches[p], flops=self.flops[p], bytes=self.bytes[p],
                                      walk=self.walk[p], scratch=self.scratch[p]) for p in self.launches})


def _tensors(tree):
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (id(t.untyped_storage()) if t.device.type != "meta" else id(t), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def counting_mode(count: Count, device: str = "meta"):
    """A TorchDispatchMode adding every operator on a ``device`` tensor to ``count`` (see the module's docstring)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    formulas = dict(flop_registry)
    formulas[aten._scaled_dot_product_flash_attention_for_cpu] = \
        flop_registry[aten._scaled_dot_product_flash_attention]
    formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = \
        flop_registry[aten._scaled_dot_product_flash_attention_backward]

    def from_host(name, args, kwargs) -> bool:
        """A blocking copy of a host tensor to the device (``.to(device)``, ``copy_``): on CUDA the stream is
        synchronised after it."""
        if kwargs.get("non_blocking"):
            return False
        if name == "_to_copy":
            target = kwargs.get("device")
            return args[0].device.type == "cpu" and target is not None and torch.device(target).type == device
        return name == "copy_" and args[0].device.type == device and args[1].device.type == "cpu" \
            and not (len(args) > 2 and args[2])

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = _tensors((args, kwargs))
            on = any(t.device.type == device for t in inputs)
            name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
            if from_host(name, args, kwargs):
                count.syncs["copy from the host"] += 1  # ATen's blocking copy: the copy, then the stream's sync
            if on and name in SYNC:
                count.syncs[name] += 1
                if name == "_local_scalar_dense" and device == "meta" and inputs[0].dtype == torch.bool:
                    return True  # a finiteness check: the step goes on as when it passes
                raise RuntimeError(f"gpu_model: {func} reads a tensor's value on the host (data-dependent); a step "
                                   "with it cannot be counted on the meta device")
            out = func(*args, **kwargs)
            namespace = getattr(func, "namespace", "aten")
            if not on or (namespace == "aten" and name in NO_KERNEL) or namespace == "prim":
                return out
            outputs = _tensors(out)
            if name.startswith("_foreach_"):
                lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
                depth = len(lists) + (not name.endswith("_"))
                launches = foreach_launches([t.numel() for t in lists[0]], depth) + (name == "_foreach_norm")
            else:
                launches = KERNELS.get(name, 1) if namespace == "aten" else 1
            flops = 0
            if namespace == "atlas_lab" and name.startswith("newton_schulz_triton"):
                flops = ns_call_flops(name, args)
            elif func._overloadpacket in formulas:
                flops = formulas[func._overloadpacket](*args, **kwargs, out_val=out)
            count.add(f"{namespace}::{name}", launches, flops, _nbytes(inputs + outputs))
            return out

    return Counting()


def ns_call_flops(name: str, args) -> int:
    """FLOPs of one call of the Newton–Schulz operator (forward or its backward): G [M, R, C], steps, coefficients."""
    from atlas_lab.memory import NS_COEFFICIENTS

    G, steps, coefficients = args[0], args[-4] if name.endswith("backward") else args[1], \
        args[-3] if name.endswith("backward") else args[2]
    M, R, C = G.shape
    return ns_flops(M, R, C, steps, NS_COEFFICIENTS[coefficients][2] != 0.0, name.endswith("backward"))


@contextlib.contextmanager
def triton_launches(count: Count):
    """Every Triton launch (``kernel[grid](...)``: ours and fla's, through the autotuner or not) counted as one launch
    under its kernel's name, its tensors' bytes added, and not run (its outputs stay as allocated)."""
    from triton.runtime.jit import KernelInterface

    def getitem(kernel, grid):
        fn = kernel
        while not hasattr(fn, "__name__") and hasattr(fn, "fn"):
            fn = fn.fn

        def launch(*args, **kwargs):
            name = getattr(fn, '__name__', type(kernel).__name__)
            count.add(f"triton::{name}", 1, 0, _nbytes(_tensors((args, kwargs))))
            if name in WALKS:
                count.walk[count.phase] += WALKS[name](args, kwargs)
        return launch

    original = KernelInterface.__getitem__
    KernelInterface.__getitem__ = getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


@contextlib.contextmanager
def on_cuda(count: Count, routes: dict | None = None):
    """Every memory call planned as on CUDA (``memory/plan.py``'s ``plan`` asked with device "cuda", and ``impl``
    = ``routes[preset's memory]``, a path, where given), and the FLOPs of a call routed to the chunk kernel or fla
    (which the operator count does not see) added from the plan; ``torch.autocast`` on the meta device as on the CPU,
    torch's foreach operators taken there (``clip_grad_norm_`` and AdamW choose them on CUDA), and attention
    computed by the fused kernel CUDA takes (float32 or a mask: memory-efficient; half precision: flash) rather than
    the decomposition the meta device would take.
    ``routes``: {"*": path} applies to every call."""
    import torch
    import torch.nn.functional as F
    import torch.utils._foreach_utils as foreach

    import atlas_lab.layers.memory_mixer as mixer
    import atlas_lab.memory.op as op
    from atlas_lab.memory import plan as planning

    real, autocast, devices = planning.plan, torch.autocast, foreach._get_foreach_kernels_supported_devices
    impl = (routes or {}).get("*")

    def plan(config, shapes, dtype=torch.float32, device="cpu", asked="auto", acts=None):
        how = real(config, shapes, dtype, "cuda", impl or asked, acts)
        if how.path in ("triton", "fla") and shapes.T > 0:  # muon's Triton route is the chunked path (how.ns)
            cost = planning.CANDIDATES[how.path].cost(planning.call_problem(config, shapes, dtype, "cuda", acts))
            if cost is not None:  # the call's forward where it is planned, the rest in the backward
                count.flops[count.phase] += int(cost.forward)
                count.flops["backward"] += int(cost.flops - cost.forward)
                count.scratch["backward"] += cost.scratch  # muon's backward
        return how

    class Autocast(autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        if q.device.type != "meta":
            return attention(q, k, v, attn_mask, dropout_p, is_causal, scale, **kwargs)
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16):
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
                                                                      scale=scale)[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as sdpa converts it on CUDA
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                attn_mask.logical_not(), -math.inf)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, q.requires_grad, dropout_p, is_causal, scale=scale)[0]

    attention = F.scaled_dot_product_attention
    op.plan, mixer.plan, torch.autocast, F.scaled_dot_product_attention = plan, plan, Autocast, sdpa
    foreach._get_foreach_kernels_supported_devices = lambda: devices() + ["meta"]
    try:
        yield
    finally:
        op.plan, mixer.plan, torch.autocast, F.scaled_dot_product_attention = real, real, autocast, attention
        foreach._get_foreach_kernels_supported_devices = devices


def path_rows(presets, lengths, B: int = 4) -> list[dict]:
    """For each preset and length, every path the plan finds computing the memory call on CUDA (float32; fla in
    bfloat16): its launches and walk counted alone (``count_path``) and by the plan's formula (None: no formula)."""
    import torch

    from atlas_lab.memory.plan import CANDIDATES, Shapes, acting, call_problem

    rows = []
    for preset in presets:
        for T in lengths:
            for path, candidate in CANDIDATES.items():
                dtype = torch.bfloat16 if path == "fla" else torch.float32
                q, k, v, config, options = memory_call(preset, B, T, dtype=dtype)
                d = q.shape[-1]
                problem = call_problem(config, Shapes(B, T, q.shape[2], d, v.shape[-1]), dtype, "cuda",
                                       acting(config.resolve().specs, options.get("gates")))
                if candidate.gap(problem) is not None:
                    continue
                counted = count_path(q, k, v, config, path, **options).total()
                cost = candidate.cost(problem)
                rows.append(dict(preset=preset, path=path, T=T, launches=counted["launches"], walk=counted["walk"],
                                 formula=cost and cost.launches, formula_walk=cost and cost.walk,
                                 predicted_ms=cost and cost.seconds * 1e3))
    return rows


def memory_call(preset: str, B: int, T: int, d_model: int = 128, heads: int = 8, dtype=None):
    """(q, k, v, MemoryConfig, memorize's keywords) of the first memory layer of ``preset``'s model (d_model, one
    layer, ``heads`` memory heads) on [B, T] tokens, as its mixer passes them, on the meta device; q, k, v in
    ``dtype`` (None: as the mixer gives them, float32), every tensor that takes a gradient a leaf."""
    import warnings

    import torch

    from atlas_lab.layers import MemoryMixer
    from atlas_lab.layers import memory_mixer
    from atlas_lab.lit import SequenceModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SequenceModel(vocab_size=64, preset=preset, d_model=d_model, n_layers=1, n_heads=heads,
                              memory_heads=heads)
    layer = next(m for m in model.modules() if isinstance(m, MemoryMixer)).to("meta")
    got = {}
    real = memory_mixer.memorize

    def record(q, k, v, config, **options):
        got.update(args=(q, k, v, config), options=options)
        return real(q, k, v, config, **options)

    def leaf(x, to=None):
        if isinstance(x, dict):
            return {n: leaf(w) for n, w in x.items()}
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(to or x.dtype).requires_grad_(x.is_floating_point())

    memory_mixer.memorize = record
    try:
        with torch.no_grad(), on_cuda(Count()), triton_launches(Count()):
            layer(torch.zeros(B, T, d_model, device="meta"))
    finally:
        memory_mixer.memorize = real
    q, k, v, config = got["args"]
    options = {n: leaf(x) for n, x in got["options"].items() if n != "impl"}
    return leaf(q, dtype), leaf(k, dtype), leaf(v, dtype), config, options

def count_path(q, k, v, config, path: str, **options) -> Count:
    """The launches, FLOPs and walked chunks of one ``memorize`` call's path alone (``PATHS[read][path]``, planned
    as on CUDA with ``impl=path``): its forward, and the backward of its output to its inputs — the call's tensors
    that take a gradient (q, k, v, the learned gates, the initial weights) as leaves where the path receives them.
    What memorize does before and after the path (heads first, the gates, the rule's act, the state) is left out:
    it is the same on every path. ``options``: memorize's keywords (gates, initial_state, coefficients)."""
    import torch

    from atlas_lab.memory import memorize
    from atlas_lab.memory import op as memory_op
    from atlas_lab.memory.call import Call

    count = Count()
    read = config.read
    real = memory_op.PATHS[read][path]

    def leaf(x):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return x.detach().requires_grad_(True)
        if isinstance(x, dict):
            return {n: leaf(w) for n, w in x.items()}
        return x

    def isolated(call: Call):
        inputs = type(call.inputs)(*map(leaf, call.inputs))
        state = type(call.state)(*map(leaf, call.state))
        mine = Call(inputs, state, *call[2:])
        count.phase = "forward"
        with triton_launches(count), counting_mode(count):
            y, carried = real(mine)
        grad = torch.empty_like(y)
        count.phase = "backward"
        with triton_launches(count), counting_mode(count):
            torch.autograd.backward(y, grad)
        return y.detach(), carried

    memory_op.PATHS[read][path] = isolated
    try:
        for _ in range(2):  # the second call (the first also fills the paths' caches of masks)
            count = Count()  # the kernels' FLOPs (on_cuda, from the plan) and the path's own
            with on_cuda(count, {"*": path}), triton_launches(Count()):
                memorize(q, k, v, config, impl=path, **options)
    finally:
        memory_op.PATHS[read][path] = real
    return count

def count_step(step, routes: dict | None = None, device: str = "meta") -> Count:
    """The second call of ``step(count)`` (one training step; it sets ``count.phase``): launches, FLOPs, bytes and
    syncs (the first step also creates AdamW's state)."""
    first, count = Count(), Count()
    for c in (first, count):
        with on_cuda(c, routes), triton_launches(c), counting_mode(c, device):
            step(c)
    return count


def fit_step(model, batch: dict, optimizer, clip: float | None = GRAD_CLIP):
    """A fit's training step of a SequenceModel as ``count_step`` takes it: ``training_step`` (forward, loss, its
    finiteness check), backward, gradient clipping (foreach) and the optimizer's step."""
    import torch

    def step(count: Count):
        count.phase = "forward"
        loss = model.training_step(batch, 0)
        count.phase = "backward"
        loss.backward()
        count.phase = "optimizer"
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def sequence_model(overrides: dict, base: list[str], device: str = "meta"):
    """(SequenceModel, vocab size, batch size, training lengths) of a sweep configuration (a trial's config: the
    files of ``base``, then ``overrides``; the data's vocab_size and batch_size as the CLI links them), on
    ``device``; the model's warnings (Lightning's self.log without a trainer) silenced. ``model.compile`` is left
    out: compiled blocks are counted as eager ones (what inductor fuses is not modelled)."""
    import warnings

    from atlas_lab.lit.module import SequenceModel
    from atlas_lab.sweep.estimate import run_config

    config = run_config([ROOT / b for b in base], overrides)
    data = (config.get("data") or {}).get("init_args") or {}
    model_args = dict(config.get("model") or {})
    model_args.pop("compile", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SequenceModel(data["vocab_size"], **model_args).to(device)
    lengths = sorted({s[0] for s in data.get("train_slices") or []})
    return model, data["vocab_size"], data["batch_size"], lengths


def adamw(model, foreach: bool = True):
    """The module's AdamW (``configure_optimizers``: its groups and betas), with ``foreach`` as on CUDA."""
    import torch

    return torch.optim.AdamW(model.parameter_groups(), betas=model.hparams.betas, foreach=foreach)


def count_point(overrides: dict, base: list[str], lengths=None, routes: dict | None = None) -> dict[int, dict]:
    """{L: count totals} of a sweep configuration's training step at each length (default: its training lengths)."""
    import warnings

    import torch

    model, vocab, batch, own = sequence_model(overrides, base)
    result = {}
    for L in lengths or own:
        ids = torch.zeros(batch, L, dtype=torch.long, device="meta")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log without a trainer
            result[L] = count_step(fit_step(model, {"input_ids": ids, "labels": ids}, adamw(model)),
                                   routes).total()
    return result


def count_training(label: str, size: dict, per_layer: bool = False) -> dict:
    """gpu_check's training step (its part c: ``train_model``, ``train_step``; bf16 autocast, AdamW, no clipping)
    of ``label`` at ``size``. ``per_layer`` (a stack of one layer kind): the step counted at 1 and 2 layers, less
    their optimizer steps, extended to ``size``'s layers (every layer adds the same launches, FLOPs and bytes), plus
    the optimizer step of the whole model (its foreach launches depend on every tensor at once)."""
    import torch

    import gpu_check

    def total(n_layers: int, optimizer_only: bool = False) -> dict:
        model, opt = gpu_check.train_model(label, dict(size, n_layers=n_layers), "meta")
        ids = torch.zeros(size["batch"], size["T"] + 1, dtype=torch.long, device="meta")

        def step(count):
            if not optimizer_only:
                return gpu_check.train_step(model, opt, ids, "meta")
            for p in model.parameters():  # a gradient to step on, allocated (no launch)
                p.grad = torch.empty_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return count_step(step).total()

    n = size["n_layers"]
    if per_layer and n > 2:
        model, _ = gpu_check.train_model(label, size, "meta")
        per_layer = len(set(model.layer_labels)) == 1
    if not per_layer or n <= 2:
        return total(n)
    one, two = total(1), total(2)
    steps = {k: total(k, optimizer_only=True) for k in (1, 2, n)}
    keys = ("launches", "flops", "bytes", "syncs", "walk", "scratch")
    fb = {k: {key: c[key] - steps[k][key] for key in keys} for k, c in ((1, one), (2, two))}
    return {key: fb[1][key] + (n - 1) * (fb[2][key] - fb[1][key]) + steps[n][key] for key in keys}


# ---------------------------------------------------------------- the fit

@dataclass
class Constants:
    C0: float  # s a step
    C_launch: float  # s a launch
    R: float  # FLOP/s
    C_walk: float = 0.0  # s a chunk walked in sequence (WALKS)

    def predict(self, launches: float, flops: float, rate: float | None = None, walk: float = 0.0) -> float:
        return self.C0 + self.C_launch * launches + flops / (rate or self.R) + self.C_walk * walk


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ‖A x − b‖ over x ≥ 0, for a few columns: the best of the unconstrained least-squares solutions on every
    subset of the columns that comes out non-negative (exact: the optimum is one of them)."""
    best, best_x = math.inf, np.zeros(A.shape[1])
    for k in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), k):
            sub, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
            if (sub < 0).any():
                continue
            x = np.zeros(A.shape[1])
            x[list(cols)] = sub
            r = float(np.sum((A @ x - b) ** 2))
            if r < best:
                best, best_x = r, x
    return best_x


def fit(points: list[dict]) -> Constants:
    """C0, C_launch, 1/R, C_walk ≥ 0 minimising Σ (predicted / measured − 1)² over ``points`` ({launches, flops,
    measured, walk (0 where absent)}): every point weighted by its own size, so that a short step counts as much as
    a long one. A column that is 0 on every point (no walk counted) leaves its constant at 0."""
    y = np.array([p["measured"] for p in points], dtype=float)
    A = np.array([[1.0, p["launches"], p["flops"], p.get("walk", 0)] for p in points], dtype=float) / y[:, None]
    scale = np.linalg.norm(A, axis=0)  # columns of one size: launches ~1e4 and FLOPs ~1e12 in one system
    scale[scale == 0] = 1.0
    x = nnls(A / scale, np.ones(len(points))) / scale
    return Constants(float(x[0]), float(x[1]), float(1.0 / x[2]) if x[2] > 0 else math.inf, float(x[3]))


def fit_report(points: list[dict]) -> dict:
    """The fit on every point, its ratios predicted / measured, and each group (``preset``) left out of the fit and
    predicted by the others."""
    constants = fit(points)
    ratios = [constants.predict(p["launches"], p["flops"], walk=p.get("walk", 0)) / p["measured"] for p in points]
    left_out = {}
    for preset in dict.fromkeys(p["preset"] for p in points):
        others = fit([p for p in points if p["preset"] != preset])
        left_out[preset] = [others.predict(p["launches"], p["flops"], walk=p.get("walk", 0)) / p["measured"]
                            for p in points
                            if p["preset"] == preset]
    return dict(constants=asdict(constants), ratios=ratios, left_out=left_out,
                max_ratio=max(max(r, 1 / r) for r in ratios))


def measured_points(counts: dict) -> list[dict]:
    """The fit's points: each measured (preset, L) with its count (``counts[preset][L]``)."""
    return [dict(preset=p, L=L, measured=s, launches=counts[p][L]["launches"], flops=counts[p][L]["flops"],
                 walk=counts[p][L].get("walk", 0))
            for p, by_L in MEASURED.items() for L, s in by_L.items() if p in counts and L in counts[p]]


# ---------------------------------------------------------------- the table

def predicted_rows(counts: dict, constants: Constants, tf32_rate: float = TF32_RATE, base: str = "transformer",
                   measured: dict | None = None) -> list[dict]:
    """Per (configuration, L): launches, FLOPs, bytes, the predicted step (at R and at ``tf32_rate``), their ratios to
    ``base``'s at the same L, launches at the longest L over the shortest, and ``measured`` ({name: {L: s}})."""
    rows = []
    for name, by_L in counts.items():
        Ls = sorted(by_L)
        for L in Ls:
            c = by_L[L]
            ref = counts.get(base, {}).get(L)
            walk = c.get("walk", 0)
            step = constants.predict(c["launches"], c["flops"], walk=walk)
            step_tf32 = constants.predict(c["launches"], c["flops"], tf32_rate, walk)
            scratch = c.get("scratch", 0)
            row = dict(name=name, L=L, launches=c["launches"], flops=c["flops"], bytes=c["bytes"], walk=walk,
                       syncs=c["syncs"], step_s=step, step_tf32_s=step_tf32, scratch=scratch,
                       step_hbm_s=step_tf32 + scratch / HBM,
                       launch_ratio=by_L[Ls[-1]]["launches"] / by_L[Ls[0]]["launches"],
                       measured=(measured or {}).get(name, {}).get(L))
            if ref is not None:
                row["vs_base"] = step / constants.predict(ref["launches"], ref["flops"], walk=ref.get("walk", 0))
                base_tf32 = constants.predict(ref["launches"], ref["flops"], tf32_rate, ref.get("walk", 0))
                row["vs_base_tf32"] = step_tf32 / base_tf32
                row["vs_base_hbm"] = row["step_hbm_s"] / (base_tf32 + ref.get("scratch", 0) / HBM)
                row["launches_vs_base"] = c["launches"] / ref["launches"]
            rows.append(row)
    return rows


def fmt(x, spec=".2f", suffix=""):
    return None if x is None else f"{x:{spec}}{suffix}"


def print_rows(title: str, rows: list[dict]) -> None:
    """The table of ``predicted_rows`` (× tf.: the ratios to the transformer; L max / L min: launches)."""
    common.print_table(title, ["configuration", "L", "launches", "× tf.", "L max / L min", "walk", "GFLOP", "GB",
                               "scratch GB", "predicted s", "× tf.", "× tf. at tf32", "+ scratch from HBM",
                               "measured s", "pred / meas"],
                       [[r["name"], r["L"], f"{r['launches']:,}", fmt(r.get("launches_vs_base"), ".2f", "×"),
                         fmt(r["launch_ratio"], ".2f", "×"), f"{r.get('walk', 0):,}", fmt(r["flops"] / 1e9, ",.0f"),
                         fmt(r["bytes"] / 1e9, ",.1f"), fmt(r.get("scratch", 0) / 1e9, ",.0f"),
                         fmt(r["step_s"], ".4f"), fmt(r.get("vs_base"), ".1f", "×"),
                         fmt(r.get("vs_base_tf32"), ".1f", "×"), fmt(r.get("vs_base_hbm"), ".1f", "×"),
                         fmt(r.get("measured"), ".4f"),
                         fmt(r.get("measured") and r["step_s"] / r["measured"], ".2f")] for r in rows], left=2)
    syncs = sorted({r["syncs"] for r in rows})
    common.console().print(f"host synchronisations a step: {', '.join(map(str, syncs))}", markup=False)


def targets(rows: list[dict], base: str = "transformer", slow: tuple[str, ...] = ("atlas",)) -> list[dict]:
    """Issue 52's targets per configuration, on the model: launches at the longest L ≤ 1.2× the shortest's and
    ≤ 3× ``base``'s at every L; the predicted step ≤ 3× ``base``'s (the ``slow`` ones: ≤ 6× at the tf32 rate with
    their kernels' scratch read and written at the memory's bandwidth, ``HBM``: a bound from above; ``in_l2``: the
    same step with the scratch kept in the L2 cache, free)."""
    out = []
    for name in dict.fromkeys(r["name"] for r in rows if r["name"] != base and "vs_base" in r):
        mine = [r for r in rows if r["name"] == name and "vs_base" in r]  # the lengths base was counted at
        step = max(r["vs_base_hbm"] if name in slow else r["vs_base"] for r in mine)
        limit = 6.0 if name in slow else 3.0
        launches = max(r["launches_vs_base"] for r in mine)
        out.append(dict(name=name, launch_ratio=mine[0]["launch_ratio"], launches_vs_base=launches,
                        step_vs_base=step, step_limit=limit,
                        in_l2=max(r["vs_base_tf32"] for r in mine) if name in slow else None,
                        met=mine[0]["launch_ratio"] <= 1.2 and launches <= 3.0 and step <= limit))
    return out


def envelope(counts: dict, constants: Constants, tf32_rate: float = TF32_RATE, base: str = "transformer",
             slow: tuple[str, ...] = ("atlas",)) -> list[dict]:
    """The ``slow`` configurations' step at ``tf32_rate`` four ways, each as a ratio to ``base``'s taken the same way:
    the fit's form (host issue and GPU work added up) and with the host's issue hidden behind the GPU's work in each
    stretch between host synchronisations (the forward, then the backward and optimizer step: the finiteness check
    between them), max(C_launch · launches, FLOPs / rate + C_walk · walk) each; the scratch kept in L2 or moved at
    HBM's bandwidth in each. The fit cannot tell the two forms apart (its steps are launch-bound); a FLOP-bound
    step lies between them."""
    def step(c: dict, overlap: bool, hbm: bool) -> float:
        phases = c.get("by_phase") or {"all": c}
        stretches = [[phases.get("forward", {})], [phases.get(p, {}) for p in phases if p != "forward"]] \
            if "forward" in phases else [list(phases.values())]
        total = constants.C0
        for stretch in stretches:
            host = constants.C_launch * sum(p.get("launches", 0) for p in stretch)
            gpu = sum(p.get("flops", 0) / tf32_rate + constants.C_walk * p.get("walk", 0)
                      + hbm * p.get("scratch", 0) / HBM for p in stretch)
            total += max(host, gpu) if overlap else host + gpu
        return total

    out = []
    for name in (n for n in counts if n in slow):
        for L, c in sorted(counts[name].items()):
            ref = counts.get(base, {}).get(L)
            if ref is not None:
                out.append(dict(name=name, L=L, **{f"{'overlap' if o else 'added'}_{'hbm' if h else 'l2'}":
                                                   step(c, o, h) / step(ref, o, h)
                                                   for o in (False, True) for h in (False, True)}))
    return out


def print_envelope(counts: dict, constants: Constants, tf32_rate: float) -> None:
    rows = envelope(counts, constants, tf32_rate)
    if rows:
        common.print_table(f"atlas's step at tf32 {tf32_rate / 1e12:.0f} TFLOP/s, ÷ the transformer's taken the same "
                           f"way: host issue and GPU work added (the fit's form) or overlapped between host "
                           f"synchronisations; the scratch in L2 or at {HBM / 1e12:.1f} TB/s",
                           ["configuration", "L", "added, in L2", "added, from HBM", "overlapped, in L2",
                            "overlapped, from HBM"],
                           [[r["name"], r["L"], *(fmt(r[k], ".1f", "×") for k in ("added_l2", "added_hbm",
                                                                                 "overlap_l2", "overlap_hbm"))]
                            for r in rows])


def print_targets(rows: list[dict], tf32_rate: float) -> None:
    common.print_table(f"targets on the model (launches L max ≤ 1.2× L min and ≤ 3× the transformer's; step ≤ 3× "
                       f"the transformer's, atlas ≤ 6× at tf32 {tf32_rate / 1e12:.0f} TFLOP/s, its scratch at "
                       f"{HBM / 1e12:.1f} TB/s)",
                       ["configuration", "launches L max / L min", "launches × tf. (max)", "step × tf. (max)",
                        "scratch in L2", "limit", "met"],
                       [[t["name"], fmt(t["launch_ratio"], ".2f", "×"), fmt(t["launches_vs_base"], ".1f", "×"),
                         fmt(t["step_vs_base"], ".1f", "×"), fmt(t["in_l2"], ".1f", "×"),
                         fmt(t["step_limit"], ".0f", "×"), "yes" if t["met"] else "no"] for t in targets(rows)])


def print_fit(report: dict, label: str) -> None:
    c = report["constants"]
    ratios = report["ratios"]
    common.console().print(
        f"{label}: C0 = {c['C0'] * 1e3:.2f} ms, C_launch = {c['C_launch'] * 1e6:.1f} µs, "
        f"R = {c['R'] / 1e12:.0f} TFLOP/s, C_walk = {c.get('C_walk', 0) * 1e6:.2f} µs; "
        f"predicted / measured {min(ratios):.2f}–{max(ratios):.2f} on "
        f"{len(ratios)} points; each preset left out: " + ", ".join(
            f"{p} {min(r):.2f}–{max(r):.2f}" for p, r in report["left_out"].items()), markup=False)


def bound_check(counts: dict, constants: Constants) -> list[str]:
    """For each of ``MEASURED_BOUNDS`` counted: its predicted step against the bound, and the rate its FLOPs would
    have to run at for the bound to hold at its shortest length."""
    lines = []
    for name, bound in MEASURED_BOUNDS.items():
        if name not in counts:
            continue
        L = min(counts[name])
        c = counts[name][L]
        rest = bound - constants.C0 - constants.C_launch * c["launches"] - constants.C_walk * c.get("walk", 0)
        lines.append(f"{name}: predicted {constants.predict(c['launches'], c['flops'], walk=c.get('walk', 0)):.3f} "
                     f"s at L {L} against "
                     f"a measured > {bound:g} s; for the bound its {c['flops'] / 1e12:.2f} TFLOP would run at "
                     f"≤ {c['flops'] / rest / 1e12:.1f} TFLOP/s" if rest > 0 else f"{name}: its launches alone "
                     f"exceed {bound:g} s")
    return lines


def point_name(label: str) -> str:
    """A sweep configuration's name in the tables: the preset of a grid by preset (``preset=atlas``: atlas), else
    its label."""
    return label[len("preset="):] if label.startswith("preset=") and " " not in label else label


@contextlib.contextmanager
def as_measured():
    """The model as the tree the H200 table was measured on ran it where it differs from today's on CUDA: ShortConv
    in its shifted form (K multiply-adds) on every device (today one depthwise conv1d off the CPU)."""
    from atlas_lab.layers.conv import ShortConv

    shifts = ShortConv.shifts
    ShortConv.shifts = lambda self, device: True
    try:
        yield
    finally:
        ShortConv.shifts = shifts


def sweep_counts(sweep: str, sets: tuple[str, ...] = (), presets=None, lengths=None, routes: dict | None = None,
                 measured: bool = False):
    """(name, {L: totals}) of each configuration of a sweep file (changed by ``sets`` as ``atlas-lab sweep --set``
    does; ``presets``: only those names) at ``lengths`` (default: its training lengths), one at a time;
    ``routes``: {name: path} asked instead of the plan's choice; measured: counted ``as_measured``."""
    for name, overrides, base in sweep_points(sweep, sets, presets):
        route = (routes or {}).get(name)
        with as_measured() if measured else contextlib.nullcontext():
            yield name, count_point(overrides, base, lengths, {"*": route} if route else None)


def sweep_points(sweep: str, sets: tuple[str, ...] = (), presets=None):
    """(name, overrides, base files) of each configuration of a sweep file, changed by ``sets``; ``presets``: only
    those names. A bad --set is the SweepError ``atlas-lab sweep`` gives."""
    from atlas_lab.sweep.estimate import study_points
    from atlas_lab.sweep.spec import load_sweep

    spec = load_sweep(ROOT / sweep if not Path(sweep).is_absolute() else Path(sweep), sets,
                      study="gpu-model" if sets else None)
    for point in study_points(spec):
        name = point_name(point.label)
        if not presets or name in presets:
            yield name, point.overrides, [str(b) for b in spec.base]


def check_sweep(sweep: str, sets: tuple[str, ...] = (), presets=None) -> None:
    """Every configuration to count builds (on the meta device, in milliseconds): a bad --set, or a value the model
    refuses, is a SweepError naming the file and the configuration, before anything is counted or written."""
    from atlas_lab.sweep.spec import SweepError

    for name, overrides, base in sweep_points(sweep, sets, presets):
        try:
            sequence_model(overrides, base)
        except ValueError as e:
            raise SweepError(f"{sweep}: configuration {name!r}: {e}") from None


def int_keys(by_L: dict) -> dict:
    return {int(L): c for L, c in by_L.items()}


def record(path: Path | None = None, sweep: str = SWEEP, sets: tuple[str, ...] = (), presets=None, lengths=None,
           train_size: dict | None = None, train_models=(), log=None) -> dict:
    """Everything the tables need, each part written to ``path`` as soon as it is counted (gpu_check reads what a
    stopped run left): the fit to ``MEASURED`` (``fit``, its counts ``fit_counts``), the counts of ``sweep``'s
    configurations (``counts``) and of gpu_check's training models at ``train_size`` (``train``), and the seconds
    each took."""
    rec = dict(meta=common.meta(None), sweep=sweep, sets=list(sets), train_size=train_size, fit_counts={},
               counts={}, train={}, seconds={})

    def done(kind, name, value, started):
        rec[kind][name] = value
        rec["seconds"][f"{kind}: {name}"] = round(time.perf_counter() - started, 1)
        if log:
            log(f"counted {name} ({kind}): {rec['seconds'][f'{kind}: {name}']} s", markup=False)
        if path:
            common.write_json(path, rec, quiet=True)

    t = time.perf_counter()
    for name, by_L in sweep_counts(SWEEP, (), list(MEASURED), LENGTHS, MEASURED_ROUTES, measured=True):
        done("fit_counts", name, by_L, t)
        t = time.perf_counter()
    rec["fit"] = fit_report(measured_points(rec["fit_counts"]))
    if path:
        common.write_json(path, rec, quiet=True)
    for name, by_L in sweep_counts(sweep, sets, presets, lengths):
        done("counts", name, by_L, t)
        t = time.perf_counter()
    for label in train_models:
        done("train", label, count_training(label, train_size, per_layer=True), t)
        t = time.perf_counter()
    return rec


def main(argv=None) -> int:
    import gpu_check

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", default=SWEEP, help=f"the sweep file whose configurations are counted ({SWEEP})")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="a change to the sweep file, as atlas-lab sweep --set takes it (repeatable)")
    ap.add_argument("--presets", nargs="+", default=None,
                    help="only these configurations and training models (default: all)")
    ap.add_argument("--lengths", nargs="+", type=int, default=None,
                    help="sequence lengths (default: the sweep's training lengths)")
    ap.add_argument("--no-125m", dest="train", action="store_false",
                    help="leave out gpu_check's 125M-class training steps (T 4096: minutes for the deep memories; "
                         f"{', '.join(SLOW_TO_COUNT)} only when named in --presets: hours)")
    ap.add_argument("--train-size", default=None, help=argparse.SUPPRESS)  # JSON: gpu_check's size of part c
    ap.add_argument("--tf32-rate", type=float, default=TF32_RATE / 1e12,
                    help=f"TFLOP/s stated for float32 products on tensor cores (default {TF32_RATE / 1e12:.0f})")
    ap.add_argument("--record", default=None, help="write the counts here as they come (gpu_check reads them)")
    ap.add_argument("--from-record", default=None, help="print the tables of a record written before; count nothing")
    ap.add_argument("--json", default=None, help="the JSON (default runs/bench/gpu_model.json)")
    ap.add_argument("--paths", nargs="+", default=None, metavar="PRESET",
                    help="instead: each path that computes these presets' memory calls on CUDA, counted alone "
                         "(count_path) beside the plan's formula (memory/predict.py), at --lengths (64 100 128)")
    args = ap.parse_args(argv)
    common.set_threads(1)
    if args.paths:
        rows = path_rows(args.paths, args.lengths or (64, 100, 128))
        common.print_table("each path of one memory call alone, counted on the meta device beside the plan's "
                           "formula (B 4, 8 heads of 16; the plan's dtype: float32, fla bfloat16)",
                           ["preset", "path", "T", "launches", "formula", "walk", "formula", "predicted ms"],
                           [[r["preset"], r["path"], r["T"], r["launches"], fmt(r["formula"], "d"), r["walk"],
                             fmt(r["formula_walk"], "d"), fmt(r["predicted_ms"], ".3g")] for r in rows])
        common.write_json(args.json or common.out_path("gpu_model_paths"), dict(meta=common.meta(args), rows=rows))
        return 0
    started = time.perf_counter()
    log = common.console().print
    size = json.loads(args.train_size) if args.train_size else gpu_check.TRAIN_SIZE

    def wanted(label: str) -> bool:  # gpu_check's child (--train-size): every model, in order, while time allows
        if args.presets:
            return label in args.presets or (gpu_check.TRAIN_MODELS[label] or (label,))[0] in args.presets
        return args.train_size is not None or label not in SLOW_TO_COUNT
    models = [m for m in gpu_check.TRAIN_MODELS if wanted(m)] if args.train else []
    if args.from_record:
        rec = json.loads(Path(args.from_record).read_text())
        for part in ("fit_counts", "counts"):
            rec[part] = {name: int_keys(by_L) for name, by_L in rec[part].items()}
        size = rec["train_size"] or size
    else:
        from atlas_lab.sweep.spec import SweepError

        try:
            check_sweep(args.sweep, tuple(args.sets), args.presets)
        except SweepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rec = record(Path(args.record) if args.record else None, args.sweep, tuple(args.sets), args.presets,
                     args.lengths, size, models, log)
    rate = args.tf32_rate * 1e12
    print_fit(rec["fit"], "fit to the H200 table (gated_deltanet on the Triton route)")
    constants = Constants(**rec["fit"]["constants"])
    # a measured route the plan no longer takes: its own rows, beside today's
    moved = {n: r for n, r in MEASURED_ROUTES.items() if n in rec["fit_counts"] and rec["fit_counts"][n] !=
             {L: {k: v for k, v in c.items() if k in rec["fit_counts"][n][L]} for L, c in
              rec["counts"].get(n, {}).items()}}
    measured = {f"{n} (as measured: {moved[n]})" if n in moved else n: by_L for n, by_L in MEASURED.items()}
    rows = predicted_rows({**rec["counts"], **{f"{n} (as measured: {r})": rec["fit_counts"][n]
                                               for n, r in moved.items()}}, constants, rate, measured=measured)
    print_rows(f"one training step on a GPU, predicted: {args.sweep} at its sizes (× tf.: ÷ the transformer's; "
               f"tf32 at {args.tf32_rate:.0f} TFLOP/s; measured: the H200 table)", rows)
    for line in bound_check(rec["counts"], constants):
        log(line, markup=False)
    print_targets(rows, rate)
    print_envelope(rec["counts"], constants, rate)
    for name, route in MEASURED_ROUTES.items():
        today = {r["L"]: r["step_s"] for r in rows if r["name"] == name}
        then = {r["L"]: r["step_s"] for r in rows
                if r["name"] == (f"{name} (as measured: {route})" if name in moved else name)}
        ratios = [today[L] / then[L] for L in today if L in then]
        if ratios:
            log(f"{name}: the plan's route today ÷ the {route} route measured, on the model: "
                f"{min(ratios):.2f}–{max(ratios):.2f}× (target: ≤ 1)" + ("" if name in moved else
                                                                          " (the same route)"), markup=False)
    big = predicted_rows({label: {size["T"]: c} for label, c in rec["train"].items()}, constants, rate)
    if big:
        print_rows(f"gpu_check's training step at d_model {size['d_model']}, {size['n_layers']} layers, T "
                   f"{size['T']}, batch {size['batch']}, bf16 autocast, predicted", big)
    log(f"counted and fitted in {time.perf_counter() - started:.0f} s", markup=False)
    common.write_json(args.json or common.out_path("gpu_model"),
                      dict(rec, meta=common.meta(args), tf32_rate=rate, rows=rows, train_rows=big))
    return 0


if __name__ == "__main__":
    sys.exit(main())
