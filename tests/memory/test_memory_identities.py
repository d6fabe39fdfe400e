"""Known models and mathematical identities (docs/memory.md §3, §6), each against an independent computation."""
import math

import pytest
import torch

import helpers
from atlas_lab.memory import Polynomial, Taylor, memorize, newton_schulz, polynomial
from helpers import compare_float32, rel_err

IMPLS = ["chunked", "reference"]


def randn(*shape, seed=0, dtype=torch.float64):
    """N(0, 1) on the tests' device (``--device``), drawn on the CPU."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(helpers.DEVICE)


def rand(*shape, generator, dtype=torch.float64):
    """U(0, 1) on the tests' device, drawn on the CPU."""
    return torch.rand(*shape, generator=generator, dtype=dtype).to(helpers.DEVICE)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d,p", [(1, 3), (3, 2), (5, 3), (4, 4), (16, 2)])
def test_polynomial_kernel_identity(d, p, dtype):
    """φ(q)·φ(k) = Σ_i a_i (q·k)^i exactly, with D = C(d+p, p): float64 within 1e-12 (u = 1.1e-16 times the terms'
    cancellation), float32 against the float64 oracle within the error model of tests/helpers.py."""
    x = {"q": randn(50, d, seed=1, dtype=dtype), "k": randn(50, d, seed=2, dtype=dtype),
         "a": rand(p + 1, generator=torch.Generator().manual_seed(3)).to(dtype)}
    assert polynomial(x["q"], x["a"]).shape == (50, math.comb(d + p, p)) == (50, Polynomial(p).dim(d))

    def features(x):
        return {"output": (polynomial(x["q"], x["a"]) * polynomial(x["k"], x["a"])).sum(-1)}

    def kernel(x):
        dot = (x["q"] * x["k"]).sum(-1)
        return {"output": sum(x["a"][i] * dot ** i for i in range(p + 1))}

    if dtype == torch.float64:
        assert rel_err(features(x)["output"], kernel(x)["output"]) < 1e-12
    else:
        compare_float32(features, kernel, x, kernel({n: t.double() for n, t in x.items()}), f"d={d} p={p}")


def test_taylor_kernel_converges_to_exp():
    q, k = randn(100, 4, seed=1) * 0.5, randn(100, 4, seed=2) * 0.5
    exact = torch.exp((q * k).sum(-1))
    errors = []
    for p in range(1, 9):
        kernel = (Taylor(p)(q) * Taylor(p)(k)).sum(-1)
        errors.append(rel_err(kernel, exact))
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-4


def test_polynomial_default_coefficients_are_taylor():
    """Default a_i = 1/i!: φ(q)·φ(k) = Σ_{i≤3} (q·k)^i / i!, the same map as taylor."""
    q, k = randn(10, 3, seed=1), randn(10, 3, seed=2)
    fq, fk = Polynomial(3)(q), Polynomial(3)(k)
    dot = (q * k).sum(-1)
    assert rel_err((fq * fk).sum(-1), sum(dot ** i / math.factorial(i) for i in range(4))) < 1e-12
    assert torch.equal(fq, Taylor(3)(q))


def qkv(B=2, T=13, H=3, d_k=5, d_v=4, dtype=torch.float64, normalize_k=True):
    q, k, v = randn(B, T, H, d_k, seed=1, dtype=dtype), randn(B, T, H, d_k, seed=2, dtype=dtype), \
        randn(B, T, H, d_v, seed=3, dtype=dtype)
    if normalize_k:
        k = torch.nn.functional.normalize(k, dim=-1)
    return q, k, v


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_linear_attention(impl, chunk_size):
    """linear memory, identity, dot, window 1, gd, α = η = 1: y_t = Σ_{i≤t} v_i (k_i·q_t)."""
    q, k, v = qkv()
    o, _ = memorize(q, k, v, architecture="linear", attentional_bias="dot", optimizer="gd", chunk_size=chunk_size,
                    impl=impl)
    scores = torch.einsum("bthd,bshd->bhts", q, k).tril()
    direct = torch.einsum("bhts,bshd->bthd", scores, v)
    assert rel_err(o, direct) < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_gated_linear_attention(impl):
    """GLA-like scalar gate: y_t = Σ_{i≤t} (∏_{l=i+1..t} α_l) v_i (k_i·q_t)."""
    q, k, v = qkv()
    alpha = rand(2, 13, 3, generator=torch.Generator().manual_seed(4)) * 0.5 + 0.5
    o, _ = memorize(q, k, v, architecture="linear", attentional_bias="dot", optimizer="gd", chunk_size=4,
                    impl=impl, gates={"alpha": alpha})
    logc = alpha.log().cumsum(1)  # [B, T, H]
    decay = (logc.unsqueeze(2) - logc.unsqueeze(1)).exp()  # [B, t, s, H] = ∏_{s<l≤t} α_l
    causal = torch.ones(13, 13, dtype=torch.bool, device=q.device).tril()[None, :, None, :]  # [1, t, 1, s]
    scores = torch.einsum("bthd,bshd->bths", q, k) * decay.permute(0, 1, 3, 2) * causal
    direct = torch.einsum("bths,bshd->bthd", scores, v)
    assert rel_err(o, direct) < 1e-10


@pytest.mark.parametrize("impl", IMPLS)
def test_deltanet_matches_flash_linear_attention(impl):
    """DeltaNet = linear, identity, l2, window 1, gd, α = 1, η_t = β_t, against fla's pure-PyTorch recurrence.

    fla's state S [d_k, d_v] is our Wᵀ and it scales q by d_k^-1/2.
    """
    naive = pytest.importorskip("fla.ops.delta_rule.naive")
    q, k, v = qkv(dtype=torch.float32)
    beta = rand(2, 13, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float32).sigmoid()

    def ours(x):
        o, state = memorize(x["q"] * x["q"].shape[-1] ** -0.5, x["k"], x["v"], architecture="linear",
                            attentional_bias="l2",
                            optimizer="gd", chunk_size=1, impl=impl,
                            gates={"eta": x["beta"]})  # the exact online delta rule
        return {"output": o, "W": state.weights["W"]}

    def fla(x):
        o, S = naive.delta_rule_recurrence(*(x[n].transpose(1, 2) for n in ("q", "k", "v", "beta")))
        return {"output": o.transpose(1, 2), "W": S.mT}

    x = dict(q=q, k=k, v=v, beta=beta)  # float32, against fla's recurrence in float64 on the same numbers
    compare_float32(ours, fla, x, fla({n: t.double() for n, t in x.items()}), f"deltanet {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_gated_deltanet_titans_form(impl):
    """Gated DeltaNet with the gradient at W_{t−1}: W_t = α_t W_{t−1} − η_t (W_{t−1} k_t − v_t) k_tᵀ."""
    q, k, v = qkv()
    g = torch.Generator().manual_seed(6)
    alpha = rand(2, 13, 3, generator=g) * 0.2 + 0.8
    eta = rand(2, 13, 3, generator=g)
    o, _ = memorize(q, k, v, architecture="linear", attentional_bias="l2", optimizer="gd",
                    chunk_size=1,
                    impl=impl, gates={"alpha": alpha, "eta": eta})
    W = q.new_zeros(2, 3, 4, 5)
    out = []
    for t in range(13):
        kt, vt, a, e = k[:, t], v[:, t], alpha[:, t, :, None, None], eta[:, t, :, None, None]
        err = torch.einsum("bhvk,bhk->bhv", W, kt) - vt
        W = a * W - e * torch.einsum("bhv,bhk->bhvk", err, kt)
        out.append(torch.einsum("bhvk,bhk->bhv", W, q[:, t]))
    assert rel_err(o, torch.stack(out, 1)) < 1e-12


def test_titans_momentum_recurrence_by_hand():
    """Titans form with linear memory, by hand: S_t = θ S − η ∇, W_t = α W + S (gradient at W_{t−1})."""
    q, k, v = qkv()
    g = torch.Generator().manual_seed(7)
    alpha, eta, theta = (rand(2, 13, 3, generator=g) * 0.5 + 0.5 for _ in range(3))
    o, state = memorize(q, k, v, architecture="linear", optimizer="momentum",
                        chunk_size=1, gates={"alpha": alpha, "eta": eta, "theta": theta})
    W = q.new_zeros(2, 3, 4, 5)
    S = torch.zeros_like(W)
    out = []
    for t in range(13):
        grad = torch.einsum("bhv,bhk->bhvk", torch.einsum("bhvk,bhk->bhv", W, k[:, t]) - v[:, t], k[:, t])
        S = theta[:, t, :, None, None] * S - eta[:, t, :, None, None] * grad
        W = alpha[:, t, :, None, None] * W + S
        out.append(torch.einsum("bhvk,bhk->bhv", W, q[:, t]))
    assert rel_err(o, torch.stack(out, 1)) < 1e-12
    assert rel_err(state.optimizer_state["W"], S) < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_taylor_normalized_linear_memory_converges_to_softmax_attention(impl):
    """linear memory + taylor(p) + dot + normalize → causal softmax attention as p grows."""
    q, k, v = qkv(T=9, d_k=3)
    q = torch.nn.functional.normalize(q, dim=-1)
    scores = torch.einsum("bthd,bshd->bhts", q, k)
    mask = torch.ones(9, 9, dtype=torch.bool, device=q.device).tril()
    softmax = torch.einsum("bhts,bshd->bthd", scores.masked_fill(~mask, -math.inf).softmax(-1), v)
    errors = []
    for p in range(1, 8):
        o, _ = memorize(q, k, v, architecture="linear", feature_map={"name": "taylor", "degree": p},
                        attentional_bias="dot", normalize=True,
                        chunk_size=4, impl=impl)
        errors.append(rel_err(o, softmax))
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-4, errors


def test_normalized_linear_attention_state_carries_normaliser():
    """normalize=True across two calls equals one call (z is carried in the state)."""
    q, k, v = qkv(T=10)
    opts = dict(architecture="linear", feature_map={"name": "taylor", "degree": 2}, attentional_bias="dot",
                normalize=True, chunk_size=3)
    o, _ = memorize(q, k, v, **opts)
    o1, s = memorize(q[:, :4], k[:, :4], v[:, :4], **opts)
    o2, _ = memorize(q[:, 4:], k[:, 4:], v[:, 4:], initial_state=s, **opts)
    assert rel_err(torch.cat([o1, o2], 1), o) < 1e-12


def test_cubic_newton_schulz_converges_to_polar_factor():
    """NS_k with cubic coefficients → U Vᵀ of the SVD as k grows; quintic stays near but not at it."""
    g = torch.Generator().manual_seed(8)
    U = torch.linalg.qr(torch.randn(6, 8, 8, generator=g, dtype=torch.float64).to(helpers.DEVICE))[0]
    V = torch.linalg.qr(torch.randn(6, 13, 8, generator=g, dtype=torch.float64).to(helpers.DEVICE))[0]
    singular_values = torch.logspace(-2, 0, 8, dtype=torch.float64, device=U.device)  # 0.01 .. 1
    G = U @ torch.diag(singular_values) @ V.mT
    polar = U @ V.mT
    errors = [rel_err(newton_schulz(G, steps, "cubic"), polar) for steps in (5, 10, 15, 20)]
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 0.1 and errors[-1] < 1e-8, errors
    assert rel_err(newton_schulz(G.mT, 80, "cubic"), polar.mT) < 1e-8  # tall input: works on the transpose
    sv = torch.linalg.svdvals(newton_schulz(G, 50, "quintic"))
    assert sv.min() > 0.5 and sv.max() < 1.5 and (sv - 1).abs().max() > 1e-3


def test_adam_first_step_is_a_scaled_sign_and_zero_betas_are_normalised_steps():
    """From m = v = 0, one Adam step moves each weight by η (1 − β₁) g / √((1 − β₂) g² + ε²), i.e. by
    η (1 − β₁)/√(1 − β₂) · sign(g) where |g| ≫ ε; with β₁ = β₂ = 0 every token steps by η g / √(g² + ε²)."""
    from atlas_lab.memory.optimizers import Adam, start, step

    g = torch.Generator().manual_seed(4)
    W = {"W": torch.randn(6, 3, 5, generator=g, dtype=torch.float64)}
    grad = {"W": torch.randn(6, 3, 5, generator=g, dtype=torch.float64)}
    alpha, eta = torch.full((6,), 0.9, dtype=torch.float64), torch.full((6,), 0.1, dtype=torch.float64)
    adam = Adam(beta1=0.8, beta2=0.99, eps=1e-12)
    W1, S1 = step(adam, W, start(adam, W)[1], grad, alpha, eta, None)
    expected = 0.9 * W["W"] - 0.1 * (0.2 / math.sqrt(0.01)) * grad["W"].sign()
    assert rel_err(W1["W"], expected) < 1e-10
    assert rel_err(S1["W"][:, 0], 0.2 * grad["W"]) < 1e-14 and rel_err(S1["W"][:, 1], 0.01 * grad["W"] ** 2) < 1e-14
    # in a layer: chunks of 3, a window of 2 — the chunk's per-token path equals the oracle (tests/memory/
    # test_memory_equivalence.py runs every combination); here the state continues across calls
    q, k, v = qkv()
    o, state = memorize(q, k, v, architecture="mlp", optimizer=Adam(0.0, 0.0), window=2, chunk_size=3, eta=0.05)
    assert state.optimizer_state["W1"].shape[:3] == (2, 3, 2) and torch.isfinite(o).all()
    o1, s1 = memorize(q[:, :5], k[:, :5], v[:, :5], architecture="mlp", optimizer=Adam(0.0, 0.0), window=2,
                      chunk_size=3,
                      eta=0.05)
    o2, _ = memorize(q[:, 5:], k[:, 5:], v[:, 5:], architecture="mlp", optimizer=Adam(0.0, 0.0), window=2, chunk_size=3,
                     eta=0.05, initial_state=s1)
    assert rel_err(torch.cat([o1, o2], 1), o) < 1e-12


def test_miras_retention_rules_follow_their_equations():
    """ℓq retention at q = 2 is gd, and at q = 4 each step is W = A / ‖A‖₄² of A = α A − η g from A_0 with W_0 =
    A_0/‖A_0‖₄²; KL retention's step is c · softmax(α log W − η g) over each row, rows positive and summing to c."""
    from atlas_lab.memory.optimizers import GD, KLRetention, LqRetention, start, step

    g = torch.Generator().manual_seed(7)
    W = {"W1": torch.randn(6, 3, 5, generator=g, dtype=torch.float64)}
    grads = [{"W1": torch.randn(6, 3, 5, generator=g, dtype=torch.float64)} for _ in range(3)]
    alpha, eta = torch.full((6,), 0.9, dtype=torch.float64), torch.full((6,), 0.2, dtype=torch.float64)
    gd = W
    lq, (W_lq, S_lq) = LqRetention(2.0), start(LqRetention(2.0), W)
    for gr in grads:
        gd, _ = step(GD(), gd, None, gr, alpha, eta, None)
        W_lq, S_lq = step(lq, W_lq, S_lq, gr, alpha, eta, None)
    assert rel_err(W_lq["W1"], gd["W1"]) < 1e-14
    q4 = LqRetention(4.0)
    W4, A = start(q4, W)
    norm = A["W1"].flatten(1).norm(p=4, dim=1)[:, None, None]
    assert rel_err(A["W1"] / norm ** 2, W["W1"]) < 1e-12 and rel_err(W4["W1"], W["W1"]) < 1e-14
    W4, A2 = step(q4, W4, A, grads[0], alpha, eta, None)
    A_direct = 0.9 * A["W1"] - 0.2 * grads[0]["W1"]
    assert rel_err(W4["W1"], A_direct / A_direct.flatten(1).norm(p=4, dim=1)[:, None, None] ** 2) < 1e-12
    kl = KLRetention()
    W_kl, z = start(kl, W)
    c = torch.full((6, 3), 5 ** 0.5, dtype=torch.float64)
    assert (W_kl["W1"] > 0).all() and rel_err(W_kl["W1"].sum(-1), c) < 1e-14
    W_next, _ = step(kl, W_kl, z, grads[0], alpha, eta, None)
    direct = 5 ** 0.5 * torch.softmax(0.9 * W_kl["W1"].log() - 0.2 * grads[0]["W1"], -1)
    assert rel_err(W_next["W1"], direct) < 1e-12


def test_momentum_with_zero_decay_is_gd():
    q, k, v = qkv()
    eta = rand(2, 13, 3, generator=torch.Generator().manual_seed(9))
    o1, _ = memorize(q, k, v, architecture="mlp", optimizer="gd", window=3, chunk_size=4, gates={"eta": eta})
    o2, _ = memorize(q, k, v, architecture="mlp", optimizer="momentum", theta=0.0, window=3, chunk_size=4,
                     gates={"eta": eta})
    assert rel_err(o2, o1) < 1e-12


@pytest.mark.parametrize("kwargs,message", [
    (dict(architecture="deep"), "valid choices: linear, mlp, gated_mlp"),
    (dict(feature_map="exp"), "valid choices: identity, polynomial, taylor"),
    (dict(attentional_bias="l1"), "valid choices: l2, dot"),
    (dict(optimizer="adamw"), "valid choices: gd, momentum, muon, adam"),
    (dict(optimizer={"name": "muon", "ns_coefficients": "septic"}), "valid choices: quintic, cubic"),
    (dict(optimizer={"name": "muon", "ns_step": 3}),
     "memorize.optimizer.ns_step: muon does not take 'ns_step'; it takes ns_steps, ns_coefficients"),
    (dict(optimizer={"name": "gd", "ns_steps": 3}), "memorize.optimizer.ns_steps: gd does not take 'ns_steps'; it "
                                                    "takes no options"),
    (dict(ns_steps=3), "memorize.ns_steps: an option of the optimizer now; write optimizer.ns_steps: 3"),
    (dict(objective="dot"), "memorize.objective: renamed; write attentional_bias: dot"),
    (dict(window=0), "memorize.window: expected an int >= 1 or null (global), got 0"),
    (dict(chunk_size=0), "memorize.chunk_size: expected an int >= 1"),
    (dict(impl="cuda"), "valid choices: reference, chunked, triton"),
    (dict(read="every"), "memorize.read: unknown value 'every'; valid choices: token, start, chunk"),
    (dict(gates={"alpha": torch.ones(2, 3)}), "gate alpha must be a [B, T, H]"),
    (dict(normalize=True), "memorize.normalize: needs architecture linear, attentional_bias dot"),
    (dict(architecture="linear", initial_state={"W": torch.zeros(7, 7)}), "initial_state['W'] must have shape"),
    (dict(architecture="linear", initial_state={"V": torch.zeros(4, 5)}), "the memory expects ['W']"),
    (dict(architecture={"name": "mlp", "depth": 0}), "depth must be >= 1"),
    (dict(architecture={"name": "mlp", "activation": "swish"}), "valid choices: gelu, silu, relu, tanh"),
    (dict(feature_map={"name": "polynomial", "degree": 2}, coefficients=torch.ones(2)), "coefficients must have shape"),
])
def test_bad_arguments_say_what_is_valid(kwargs, message):
    q, k, v = qkv(T=4)
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        memorize(q, k, v, **kwargs)


def test_triton_says_what_it_does_not_cover():
    q, k, v = qkv(T=4)  # float64 and an MLP memory with gd: not covered by the kernels
    with pytest.raises(NotImplementedError, match="impl='triton' does not cover"):
        memorize(q, k, v, architecture="mlp", impl="triton")
    with pytest.raises(NotImplementedError, match="read='chunk'"):
        memorize(q.float(), k.float(), v.float(), read="chunk", impl="triton")


@pytest.mark.parametrize("impl", ["bmm", "cpu"])
@pytest.mark.parametrize("coefficients", ["quintic", "cubic"])
@pytest.mark.parametrize("shape", [(7, 5, 9), (6, 9, 5), (2, 3, 4, 4), (3, 15, 16), (2, 16, 15), (40, 1, 3),
                                   (2, 17, 40)])
def test_newton_schulz_matches_autograd_through_the_literal_iteration(impl, coefficients, shape, monkeypatch):
    """Values and gradients of both NS paths against autograd through X ← aX + (bA + cA²)X, in float64.

    bmm: several blocks, the last one partial; m = 5, 15 and 17 run with zero rows padded to a multiple of 8.
    kernel: rows padded to whole vectors inside the kernel; 40 matrices span several parallel tasks."""
    from atlas_lab.memory.ops.newton_schulz import reference

    monkeypatch.setattr(reference, "NS_BLOCK_ELEMENTS", 50)
    a, b, c = reference.NS_COEFFICIENTS[coefficients]
    torch.manual_seed(0)
    G = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    X = G.mT if shape[-2] > shape[-1] else G
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + 1e-7)
    for _ in range(5):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    literal = X.mT if shape[-2] > shape[-1] else X
    out = newton_schulz(G, 5, coefficients, impl=impl)
    assert rel_err(out, literal) < 1e-12
    weight = torch.randn_like(out)
    (g_literal,) = torch.autograd.grad((literal * weight).sum(), G)
    (g_out,) = torch.autograd.grad((out * weight).sum(), G)
    assert rel_err(g_out, g_literal) < 1e-12
    assert torch.autograd.gradcheck(lambda G: newton_schulz(G, 3, coefficients, impl=impl),
                                    G[..., :3, :4].detach().clone().requires_grad_())


@pytest.mark.parametrize("shape", [(64, 16, 15), (64, 4, 16), (8, 45, 180)])
def test_newton_schulz_kernel_matches_bmm_in_float32(shape):
    """The C++ kernel in float32 against bmm in float64, within the error model of tests/helpers.py."""
    g = torch.Generator().manual_seed(0)
    x = {"G": torch.randn(*shape, generator=g), "weight": torch.randn(*shape, generator=g)}

    def ns(impl):
        def go(x):
            G = x["G"].detach().requires_grad_()
            out = newton_schulz(G, impl=impl)
            return {"output": out, "grad.G": torch.autograd.grad((out * x["weight"]).sum(), G)[0]}
        return go

    compare_float32(ns("cpu"), ns("bmm"), x, ns("bmm")({n: t.double() for n, t in x.items()}), str(shape))


def test_newton_schulz_kernel_says_what_it_takes():
    with pytest.raises(ValueError, match="impl 'cpu' takes float32/float64 CPU tensors"):
        newton_schulz(torch.randn(2, 4, 4, dtype=torch.bfloat16), impl="cpu")
    with pytest.raises(ValueError, match="valid choices: bmm, cpu"):
        newton_schulz(torch.randn(2, 4, 4), impl="triton")




def test_newton_schulz_takes_batched_matmuls_without_the_kernel(monkeypatch, tmp_path):
    """A failed build warns once and leaves impl "auto" on the bmm path; ATLAS_LAB_NS_KERNEL=0 turns the kernel off."""
    from torch.utils import cpp_extension

    from atlas_lab.memory.ops.newton_schulz import cpu as newton_schulz_cpu

    G = torch.randn(6, 4, 16, dtype=torch.float64)
    expected = newton_schulz(G, impl="bmm")
    monkeypatch.setenv("ATLAS_LAB_NS_KERNEL", "0")
    assert not newton_schulz_cpu.applies(G)
    monkeypatch.delenv("ATLAS_LAB_NS_KERNEL")
    assert newton_schulz_cpu.applies(G)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    newton_schulz_cpu.kernel.cache_clear()
    try:
        with pytest.warns(UserWarning, match="did not build .*no C\\+\\+ compiler.*uses batched matmuls"):
            assert not newton_schulz_cpu.applies(G)
        assert rel_err(newton_schulz(G), expected) == 0.0
        with pytest.raises(ValueError, match="where the kernel builds"):
            newton_schulz(G, impl="cpu")
    finally:
        newton_schulz_cpu.kernel.cache_clear()  # the next caller loads the real build again


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_kernel():
    """torch's build lock (a file) stays behind when a process is killed while it loads the kernel; every later load
    then waited for it forever. Under atlas-lab's own flock such a file is stale and removed."""
    import fcntl
    import threading

    from atlas_lab.memory.ops.newton_schulz import cpu as newton_schulz_cpu

    if newton_schulz_cpu.kernel() is None:
        pytest.skip("the CPU kernel does not build here")
    with open(newton_schulz_cpu.build_directory() / "atlas-lab.flock", "a") as guard:  # no loader is inside
        fcntl.flock(guard, fcntl.LOCK_EX)  # (other test processes load the kernel too)
        (newton_schulz_cpu.build_directory() / "lock").touch()
    newton_schulz_cpu.kernel.cache_clear()
    load = threading.Thread(target=newton_schulz_cpu.kernel, daemon=True)
    load.start()
    load.join(timeout=120)
    assert not load.is_alive() and newton_schulz_cpu.kernel() is not None
