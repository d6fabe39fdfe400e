"""Forward+backward time of chunked DeltaNet: atlas-lab's ``memorize`` against flash-linear-attention's pure-PyTorch
``delta_rule_chunkwise`` (fla.ops.delta_rule.naive, package fla-core).

    python benchmarks/deltanet.py [--B 2] [--H 4] [--T 1024] [--d 64] [--chunk 16 64] [--repeats 3]
                                  [--threads N] [--tiny]

atlas-lab: the `deltanet` preset's memory, called through ``memorize`` directly (impl="chunked"): linear memory,
identity φ, l2 bias, window 1, gd, α = 1 (the preset's constant), η = β a per-token [B, T, H] tensor in (0, 1);
q, k, v [B, T, H, d] with L2-normalised k. fla: ``delta_rule_chunkwise(q, k, v, beta, chunk_size)`` with q, k, v
[B, H, T, d], beta [B, H, T] (each library gets its own layout; nothing is transposed inside the timed call).
Both at the same chunk size (--chunk; 16 is the preset's), float32, loss ``o.square().mean()``, every input
requiring gradients. Ratio = atlas-lab / fla (< 1: atlas-lab is faster).

Conventions (fla-core's naive.py): fla's state S [d_k, d_v] is atlas-lab's Wᵀ; fla multiplies q by d_k^-1/2
inside; fla does not normalise k (we pass the same L2-normalised k to both); fla's beta is atlas-lab's η.
Correctness first, for each chunk c at T = 2·c with B=1, H=2: atlas-lab at chunk_size=1 (the exact online delta
rule) with q·d^-1/2 against fla at chunk c (outputs, final state, gradients of q, k, v, β) in float64 (tolerance
1e-10) and float32 (1e-4). atlas-lab's chunk b > 1 is part of its model (gradients inside a chunk are taken at the
weights before it) while fla's chunkwise form is the exact delta rule at any chunk size: at b > 1 the two compute the
same cost class but not the same function; the table shows how far apart (column "atlas-lab chunk b vs exact",
float64 outputs at T = 2·b).
Writes runs/bench/deltanet.json.
"""
from __future__ import annotations

import argparse
import warnings

import torch
from common import (add_common_args, apply_tiny, console, median_time, meta, out_path, peer, print_table, rel_err,
                    set_threads, write_json)

from atlas_lab.memory import memorize
from atlas_lab.models import resolve_preset

TINY = dict(B=1, H=2, T=64, d=16, chunk=[16], repeats=1)
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def preset_options(chunk_size):
    """memorize's options of the `deltanet` preset's memory (presets.py), with η left to the caller."""
    _, c = resolve_preset("deltanet", {"chunk_size": chunk_size})
    assert c.eta == "learned" and isinstance(c.alpha, float) and c.optimizer == "gd", c
    return dict(architecture=c.architecture, feature_map=c.feature_map, attentional_bias=c.attentional_bias,
                window=c.window,
                optimizer=c.optimizer, alpha=c.alpha, chunk_size=c.chunk_size)


def inputs(B, T, H, d, dtype, seed=0):
    """atlas-lab layout: q, k, v [B, T, H, d] (k L2-normalised), beta [B, T, H] in (0, 1); all require grad."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    x = dict(q=r(B, T, H, d), k=torch.nn.functional.normalize(r(B, T, H, d), dim=-1), v=r(B, T, H, d),
             beta=torch.sigmoid(r(B, T, H)))
    return {n: t.requires_grad_() for n, t in x.items()}


def to_fla(x):
    """[B, T, H, d] -> [B, H, T, d] and [B, T, H] -> [B, H, T], contiguous leaves requiring grad."""
    return {n: t.detach().transpose(1, 2).contiguous().requires_grad_() for n, t in x.items()}


def atlas_fwd_bwd(x, options, q_scale=1.0):
    for t in x.values():
        t.grad = None
    o, state = memorize(x["q"] * q_scale if q_scale != 1.0 else x["q"], x["k"], x["v"], impl="chunked",
                        **options, gates={"eta": x["beta"]})
    o.square().mean().backward()
    return o, state


def fla_fwd_bwd(naive, x, chunk_size):
    for t in x.values():
        t.grad = None
    # fla/ops/delta_rule/naive.py (fla-core 0.6.0): delta_rule_chunkwise(q, k, v, beta, chunk_size=32)
    #   -> (o [B, H, T, d_v], S [B, H, d_k, d_v]); asserts T % chunk_size == 0
    o, S = naive.delta_rule_chunkwise(x["q"], x["k"], x["v"], x["beta"], chunk_size=chunk_size)
    o.square().mean().backward()
    return o, S


def check(naive, d, chunk, dtype):
    """Largest relative error (outputs, final state, gradients of q, k, v, β): atlas-lab's exact delta rule
    (chunk_size=1, q·d^-1/2) vs fla's chunkwise form at ``chunk``, at T = 2·chunk."""
    x = inputs(1, 2 * chunk, 2, d, dtype, seed=1)
    o, state = atlas_fwd_bwd(x, preset_options(1), q_scale=d ** -0.5)
    xf = to_fla(x)
    of, S = fla_fwd_bwd(naive, xf, chunk)
    errs = [rel_err(o, of.transpose(1, 2)), rel_err(state.weights["W"], S.mT)]
    errs += [rel_err(x[n].grad, xf[n].grad.transpose(1, 2)) for n in x]
    return max(errs)


def model_gap(d, chunk):
    """How far atlas-lab's chunk-b DeltaNet is from the exact delta rule (outputs, float64): a model difference."""
    x = inputs(1, 2 * chunk, 2, d, torch.float64, seed=1)
    with torch.no_grad():
        o_b, _ = memorize(x["q"], x["k"], x["v"], **preset_options(chunk), gates={"eta": x["beta"]})
        o_1, _ = memorize(x["q"], x["k"], x["v"], **preset_options(1), gates={"eta": x["beta"]})
    return rel_err(o_b, o_1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--chunk", type=int, nargs="+", default=[16, 64],
                    help="chunk sizes (the same for both; the deltanet preset uses 16)")
    add_common_args(ap, repeats=3)
    args = ap.parse_args()
    apply_tiny(args, TINY)
    threads = set_threads(args.threads)
    bad = [c for c in args.chunk if args.T % c]
    if bad:
        raise SystemExit(f"fla's delta_rule_chunkwise needs T divisible by the chunk size; T={args.T}, chunk {bad}")
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla on a CPU
    naive = peer("fla.ops.delta_rule.naive", "fla delta_rule_chunkwise column")

    checks = {}  # chunk -> {dtype: max relative error}
    if naive is not None:
        for chunk in args.chunk:
            for dtype in (torch.float64, torch.float32):
                err = check(naive, args.d, chunk, dtype)
                checks.setdefault(chunk, {})[str(dtype).removeprefix("torch.")] = err
                if not err <= TOL[dtype]:
                    raise SystemExit(f"atlas-lab (exact, chunk 1) and fla (chunk {chunk}) disagree in {dtype}: "
                                     f"relative error {err:.2e} > {TOL[dtype]:.0e}; not timing")

    # the same function as fla's at any chunk size: atlas-lab's exact online rule (chunk 1)
    x = inputs(args.B, args.T, args.H, args.d, torch.float32)
    t_exact = median_time(lambda: atlas_fwd_bwd(x, preset_options(1)), args.repeats)
    rows, cells = [], []
    for chunk in args.chunk:
        check_txt = ", ".join(f"{k} {v:.1e}" for k, v in checks[chunk].items()) if chunk in checks else None
        options = preset_options(chunk)
        x = inputs(args.B, args.T, args.H, args.d, torch.float32)
        t_ours = median_time(lambda x=x, options=options: atlas_fwd_bwd(x, options), args.repeats)
        t_fla = None
        if naive is not None:
            xf = to_fla(x)
            t_fla = median_time(lambda xf=xf, chunk=chunk: fla_fwd_bwd(naive, xf, chunk), args.repeats)
        gap = model_gap(args.d, chunk)
        ratio = None if t_fla is None else t_ours / t_fla
        exact_ratio = None if t_fla is None else t_exact / t_fla
        rows.append(dict(B=args.B, H=args.H, T=args.T, d=args.d, chunk=chunk, options=options, atlas_s=t_ours,
                         fla_s=t_fla, ratio_atlas_over_fla=ratio, atlas_exact_chunk1_s=t_exact,
                         ratio_atlas_exact_over_fla=exact_ratio, check_rel_err=checks.get(chunk),
                         atlas_chunk_vs_exact_rel_diff=gap))
        cells.append([str(chunk), check_txt, f"{t_ours:.3f}", None if t_fla is None else f"{t_fla:.3f}",
                      None if ratio is None else f"{ratio:.2f}×", f"{gap:.1e}", f"{t_exact:.3f}",
                      None if exact_ratio is None else f"{exact_ratio:.2f}×"])
    print_table(f"DeltaNet forward+backward, float32, B={args.B} H={args.H} T={args.T} d={args.d}, {threads} threads",
                ("chunk", "check vs fla (exact rule, rel err)", "atlas-lab memorize (s)",
                 "fla delta_rule_chunkwise (s)", "atlas-lab / fla", "atlas-lab chunk b vs exact",
                 "atlas-lab exact rule, chunk 1 (s)", "exact / fla"), cells,
                caption="ratio < 1: atlas-lab is faster; 'chunk b vs exact' is a model difference, not an error; "
                        "the last two columns time the same function as fla's")
    if args.tiny:
        console().print("[dim]--tiny: shapes too small to mean anything; not a measurement[/dim]")
    payload = dict(meta(args), rows=rows)
    if naive is not None:
        from importlib.metadata import version
        payload["fla_core_version"] = version("fla-core")
    write_json(out_path("deltanet", args), payload)


if __name__ == "__main__":
    main()
