"""Longhorn (Liu et al., arXiv 2407.14207) as a learning rule written in one file (``learning_rules.Longhorn``): the
engine against Longhorn's published recurrence, written here without the engine,

    S_t = S_{t−1} (I − ε_t k_t k_tᵀ) + ε_t x_t k_tᵀ,   ε_t = β_t / (1 + β_t ‖k_t‖²),   o_t = S_t q_t,

(S: d_v × D, x_t the value), in float64 to 1e-10, outputs, final state and every gradient."""
import pytest
import torch

from atlas_lab.memory import MemoryConfig, check_against_reference, memorize
from atlas_lab.models import LanguageModel, resolve_preset


def longhorn(q, k, v, beta, S0):
    """Longhorn's recurrence, one token at a time: q, k [B, T, H, D], v [B, T, H, d_v], beta [B, T, H], S0 [H, d_v, D]
    -> (o [B, T, H, d_v], S_T [B, H, d_v, D])."""
    B, T, H, D = q.shape
    S, eye, out = S0.expand(B, *S0.shape), torch.eye(D, dtype=q.dtype), []
    for t in range(T):
        kt, xt, b = k[:, t], v[:, t], beta[:, t]  # [B, H, D], [B, H, d_v], [B, H]
        eps = (b / (1 + b * (kt * kt).sum(-1)))[..., None, None]
        S = S @ (eye - eps * kt.unsqueeze(-1) * kt.unsqueeze(-2)) + eps * xt.unsqueeze(-1) * kt.unsqueeze(-2)
        out.append((S @ q[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(out, 1), S


def problem(T=13, B=2, H=2, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, D, generator=g, dtype=torch.float64),
         "k": torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g, dtype=torch.float64), dim=-1) * 1.5,
         "v": torch.randn(B, T, H, D, generator=g, dtype=torch.float64),
         "beta": torch.rand(B, T, H, generator=g, dtype=torch.float64) * 2,
         "S0": 0.1 * torch.randn(H, D, D, generator=g, dtype=torch.float64)}
    return {n: t.requires_grad_(True) for n, t in x.items()}


@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_longhorn_is_its_published_recurrence(impl):
    """The preset's memory (linear, l2, gd, chunk 1, α = 1) with the longhorn rule is Longhorn's recurrence."""
    x = problem()
    config = resolve_preset("longhorn")[1]
    o, state = memorize(x["q"], x["k"], x["v"], config, gates={"eta": x["beta"]}, initial_state={"W": x["S0"]},
                        impl=impl)
    o_ref, S_ref = longhorn(x["q"], x["k"], x["v"], x["beta"], x["S0"])
    weight = torch.randn_like(o)
    ours = torch.autograd.grad((o * weight).sum() + state.weights["W"].square().sum(), list(x.values()))
    theirs = torch.autograd.grad((o_ref * weight).sum() + S_ref.square().sum(), list(x.values()))
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.weights["W"], S_ref, rtol=1e-10, atol=1e-10)
    for name, a, b in zip(x, ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"gradient of {name}")


def test_longhorn_is_not_the_plain_delta_rule():
    """The test above can fail: without the key's rescaling (online) the same inputs give another output."""
    x = problem()
    plain = memorize(x["q"], x["k"], x["v"], resolve_preset("longhorn")[1].replace(learning_rule="online"),
                     gates={"eta": x["beta"]}, initial_state={"W": x["S0"]})[0]
    assert (plain - longhorn(x["q"], x["k"], x["v"], x["beta"], x["S0"])[0]).abs().max() > 1e-3


def test_longhorn_streams_and_checks_against_its_equation():
    """The one-call check (the engine against the rule's own per-token equation, and causality) passes; a stream read
    in pieces is the same as one call."""
    config = resolve_preset("longhorn")[1]
    assert max(check_against_reference(config, T=9).values()) < 1e-10
    x = problem(T=11)
    whole = memorize(x["q"], x["k"], x["v"], config, gates={"eta": x["beta"]}, initial_state={"W": x["S0"]})[0]
    head, state = memorize(x["q"][:, :4], x["k"][:, :4], x["v"][:, :4], config, gates={"eta": x["beta"][:, :4]},
                           initial_state={"W": x["S0"]})
    tail = memorize(x["q"][:, 4:], x["k"][:, 4:], x["v"][:, 4:], config, gates={"eta": x["beta"][:, 4:]},
                    initial_state=state)[0]
    torch.testing.assert_close(torch.cat([head, tail], 1), whole, rtol=1e-12, atol=1e-12)


def test_longhorn_needs_its_closed_form():
    with pytest.raises(ValueError, match="longhorn's implicit step is the closed form of a linear memory"):
        MemoryConfig(architecture="mlp", learning_rule="longhorn", chunk_size=1).validate()
    with pytest.raises(ValueError, match="window=2"):
        MemoryConfig(architecture="linear", learning_rule="longhorn", chunk_size=1, window=2).validate()


def test_the_longhorn_preset_trains():
    torch.manual_seed(0)
    model = LanguageModel(vocab_size=11, preset="longhorn", d_model=16, n_layers=1, n_heads=2)
    logits = model(torch.randint(0, 11, (2, 9)))[0]
    logits.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
