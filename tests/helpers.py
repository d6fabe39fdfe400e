"""Shared test utilities: random memorize problems and relative-error comparisons.

DEVICE: where the memory and kernel tests put their tensors — pytest's ``--device`` option (conftest.py; default
cpu), e.g. ``pytest tests/memory --device cuda`` (benchmarks/gpu_check.py runs them that way on a GPU)."""
import torch

from atlas_lab.memory import build_feature_map, memorize

GATES = ("alpha", "eta", "theta", "gamma")
DEVICE = torch.device("cpu")


def rel_err(a, b):
    """‖a − b‖ / ‖b‖ (absolute when b is zero)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def make_problem(B=2, T=7, H=2, d_k=4, d_v=4, dtype=torch.float64, seed=0, memory="linear", feature_map="identity",
                 degree=2, device=None, **kw):
    """Random leaf tensors for memorize on ``device`` (default DEVICE): q, k, v, gates in a stable range, learnable
    W_0 and φ coefficients. Drawn on the CPU, so that every device sees the same numbers."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):  # drawn in float64 and cast, so that every dtype sees the same numbers
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    def uni(lo, hi, *shape):
        return (lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype)

    k = torch.nn.functional.normalize(rnd(B, T, H, d_k), dim=-1)
    p = dict(q=rnd(B, T, H, d_k), k=k, v=rnd(B, T, H, d_v) * 0.5,
             alpha=uni(0.8, 1.0, B, T, H), eta=uni(0.05, 0.5, B, T, H), theta=uni(0.3, 0.9, B, T, H),
             gamma=uni(0.2, 1.0, B, T, H))
    D = build_feature_map(feature_map, degree=degree).dim(d_k)
    from atlas_lab.memory import build_memory
    mem = build_memory(memory, **{o: kw[o] for o in ("depth", "expansion", "activation", "residual") if o in kw})
    W0 = mem.init_weights(H, D, d_k, d_v, generator=g, dtype=torch.float64)
    if memory == "linear":  # start from a small non-zero state
        W0 = {n: rnd(*w.shape) * 0.1 for n, w in W0.items()}
    p["initial_state"] = {n: w.to(dtype) for n, w in W0.items()}
    if feature_map == "polynomial":
        p["coefficients"] = uni(0.3, 1.0, degree + 1)
    device = DEVICE if device is None else device
    p = {n: t.to(device).requires_grad_(True) if isinstance(t, torch.Tensor) else t for n, t in p.items()}
    p["initial_state"] = {n: w.to(device).requires_grad_(True) for n, w in p["initial_state"].items()}
    return p


def run(problem, impl, **options):
    """memorize on a problem; returns (output, state, {input name: gradient})."""
    o, state = memorize(problem["q"], problem["k"], problem["v"], impl=impl,
                        **{n: problem[n] for n in GATES}, initial_state=problem["initial_state"],
                        **({"coefficients": problem["coefficients"]} if "coefficients" in problem else {}), **options)
    leaves = {n: t for n, t in problem.items() if isinstance(t, torch.Tensor)}
    leaves.update({f"W0.{n}": w for n, w in problem["initial_state"].items()})
    # a loss that touches the output and every part of the final state
    total = (o * torch.linspace(-1, 1, o.shape[-1], dtype=o.dtype, device=o.device)).sum()
    for x in (state.weights, state.momentum or {}):
        total = total + sum((w ** 2).sum() * 0.1 for w in x.values())
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    return o, state, {n: gr for n, gr in zip(leaves, grads)}


def errors(a, b, what, finite_where_b_is=False, check_finite=True):
    """Relative errors of every output, state tensor and gradient of run ``a`` against run ``b``; a gradient or state
    part missing on one side fails, and so does a non-finite gradient of ``a`` (with finite_where_b_is: one where
    ``b``'s is finite; a gradient non-finite on both sides is left out; check_finite=False: no finiteness check)."""
    (oa, sa, ga), (ob, sb, gb) = a, b
    out = {"output": rel_err(oa, ob)}
    for part in ("weights", "momentum"):
        xa, xb = getattr(sa, part), getattr(sb, part)
        assert (xa is None) == (xb is None), f"{what}: state.{part} present on one side only"
        for n in xb or {}:
            out[f"state.{part}.{n}"] = rel_err(xa[n], xb[n])
    assert sa.offset == sb.offset
    for n in gb:
        assert (ga[n] is None) == (gb[n] is None), f"{what}: gradient of {n} missing on one side"
        if gb[n] is not None:
            if finite_where_b_is and not torch.isfinite(gb[n]).all():
                assert not torch.isfinite(ga[n]).all(), f"{what}: gradient of {n} finite on one side only"
                continue
            assert not check_finite or torch.isfinite(ga[n]).all(), f"{what}: non-finite gradient of {n}"
            out[f"grad.{n}"] = rel_err(ga[n], gb[n])
    return out


def compare(a, b, tol, what):
    """Every output, state tensor and gradient of run ``a`` against run ``b`` within ``tol``."""
    bad = {k: v for k, v in errors(a, b, what).items() if not v <= tol}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad}"


def compare_float32(fast, ref, oracle, tol, what, factor=10.0):
    """float32 runs of a fast path and of ``reference`` against the float64 ``oracle``: each quantity agrees with the
    float32 reference within ``tol``, or lies within ``factor`` × the float32 reference's own distance from the oracle
    (for rules whose float32 evaluation is ill-conditioned, e.g. Adam's m / √v for small gradients, any order of the
    same operations is that far off; a wrong result is off by O(1)). A gradient that overflows float32 in the
    reference too (float64 magnitudes beyond ~1e35 on a diverging problem) must overflow in the fast path."""
    direct = errors(fast, ref, what, finite_where_b_is=True)
    own, fast_err = errors(ref, oracle, what, check_finite=False), errors(fast, oracle, what, check_finite=False)
    bad = {k: (v, fast_err[k], own[k]) for k, v in direct.items()
           if not (v <= tol or fast_err[k] <= factor * own[k])}
    assert not bad, f"{what}: (vs float32 reference, vs oracle, reference vs oracle) beyond {tol:g} / {factor}×: {bad}"
