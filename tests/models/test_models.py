"""Every preset builds, trains a step, streams exactly, and differs from its neighbours only where it should."""
import dataclasses
import itertools

import pytest
import torch

from atlas_lab.layers import Attention, LaCT, MemoryMixer
from atlas_lab.memory import MemoryConfig
from atlas_lab.models import PRESETS, LanguageModel, resolve_preset
from helpers import rel_err

TINY = dict(d_model=32, n_layers=2, n_heads=4, swa_window=5)


def tiny(preset, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    return LanguageModel(64, preset, **{**TINY, **kw}).to(dtype)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_trains_a_step(preset):
    # a large-chunk memory (lact: 2,048 tokens; hope_cms's slower levels) learns only at a chunk's end: chunks of 8
    # here, so that 21 tokens do
    model = tiny(preset)
    if max((m.config.chunk_size for m in model.modules() if isinstance(m, (MemoryMixer, LaCT))), default=1) > 21:
        model = tiny(preset, memory={"chunk_size": 8})
    x = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1))
    logits, _ = model(x)
    assert logits.shape == (2, 21, 64)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()
               or p.grad.abs().sum() == 0]
    assert not missing, f"{preset}: parameters without a finite non-zero gradient: {missing}"


def cache_tensors(cache):
    if isinstance(cache, torch.Tensor):
        yield cache
    elif isinstance(cache, dict):
        for v in cache.values():
            yield from cache_tensors(v)
    elif isinstance(cache, (list, tuple)):
        for v in cache:
            yield from cache_tensors(v)
    elif dataclasses.is_dataclass(cache):
        for f in dataclasses.fields(cache):
            yield from cache_tensors(getattr(cache, f.name))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_streaming_in_random_pieces_equals_one_call(preset):
    model = tiny(preset, torch.float64)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 64, (2, 45), generator=g)
    with torch.no_grad():
        full, _ = model(x)
        cache, pieces, t = None, [], 0
        while t < x.shape[1]:
            n = int(torch.randint(1, 12, (1,), generator=g))
            logits, cache = model(x[:, t:t + n], cache)
            pieces.append(logits)
            t += n
    err = ((torch.cat(pieces, 1) - full).norm() / full.norm()).item()
    assert err < 1e-10, f"{preset}: streaming differs from one call by {err:.2e}"


@pytest.mark.parametrize("preset", ["atlas", "titans", "gated_deltanet", "atlas_mag"])
def test_chunk_start_reads_train_a_step_and_stream(preset):
    """memory.read = chunk (one optimizer step per chunk) from the model config: a finite training step, and
    pieces that split chunks (the chunk in progress travels in the cache) give the outputs of one call."""
    model = tiny(preset, memory={"read": "chunk"})
    assert all(m.config.read == "chunk" for m in model.modules() if isinstance(m, MemoryMixer))
    x = torch.randint(0, 64, (2, 45), generator=torch.Generator().manual_seed(1))
    logits, _ = model(x)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model = model.double()
    with torch.no_grad():
        full, _ = model(x)
        cache, pieces = None, []
        for lo, hi in [(0, 7), (7, 8), (8, 30), (30, 45)]:
            out, cache = model(x[:, lo:hi], cache)
            pieces.append(out)
    err = ((torch.cat(pieces, 1) - full).norm() / full.norm()).item()
    assert err < 1e-10, f"{preset}: streaming differs from one call by {err:.2e}"


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "transformer"])
def test_recurrent_state_does_not_grow(preset):
    """After the first window, the streaming cache of every recurrent preset keeps a constant size, and that size
    counted tensor by tensor (float32 values, int64 positions) is the ``state_bytes`` that `atlas-lab presets`
    shows. (lact's attention window is its chunk: chunks of 8 here.)"""
    model = tiny(preset, memory={"chunk_size": 8}) if preset == "lact" else tiny(preset)
    g = torch.Generator().manual_seed(3)
    sizes = []
    cache = None
    with torch.no_grad():
        for _ in range(6):
            _, cache = model(torch.randint(0, 64, (1, 17), generator=g), cache)
            sizes.append(sum(t.numel() * t.element_size() for t in cache_tensors(cache)))
    assert sizes[1:] == [sizes[1]] * 5, sizes
    assert model.cache_bytes_per_token() == 0
    assert sizes[-1] == model.state_bytes(), (sizes[-1], model.state_bytes())


def test_transformer_kv_cache_grows_per_token():
    model = tiny("transformer")
    _, c1 = model(torch.zeros(1, 10, dtype=torch.long))
    _, c2 = model(torch.zeros(1, 5, dtype=torch.long), c1)
    grown = sum(t.numel() for t in cache_tensors(c2)) - sum(t.numel() for t in cache_tensors(c1))
    assert grown * 4 == 5 * model.cache_bytes_per_token()


@pytest.mark.parametrize("preset", ["transformer", "swa", "deltanet", "atlas", "atlas_mag"])
def test_greedy_generation_with_cache_equals_recomputation(preset):
    model = tiny(preset, torch.float64)
    prompt = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(4))
    tokens, _ = model.generate(prompt, 6)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            logits, _ = model(seq)
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(tokens, seq[:, 9:])


def test_sampling_with_temperature_is_seeded():
    model = tiny("gla")
    prompt = torch.zeros(1, 3, dtype=torch.long)
    a, _ = model.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    b, _ = model.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    c, _ = model.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (1, 8)
    assert not torch.equal(a, c)  # sampled from the generator, not greedy


def changed_fields(a: MemoryConfig, b: MemoryConfig):
    return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


@pytest.mark.parametrize("a,b,expected", [
    ("atlas", "omeganet", {"optimizer", "eta_max"}),  # gd diverges at atlas's η_max 0.1 (muon steps are bounded)
    ("omeganet", "dla", {"architecture", "attentional_bias", "window", "gamma", "eta_max"}),  # + output_norm
    ("atlas", "atlas_pp", {"architecture"}),
    ("deltanet", "gated_deltanet", {"alpha"}),
    ("linear_attention", "gla", {"alpha"}),
    ("deltanet", "linear_attention", {"attentional_bias", "eta", "chunk_size"}),
    ("deep_transformer", "swdt", {"window", "eta", "eta_max"}),
    ("omeganet", "dot", {"feature_map"}),
])
def test_presets_differ_only_in_their_components(a, b, expected):
    (_, ca), (_, cb) = resolve_preset(a), resolve_preset(b)
    assert changed_fields(ca, cb) == expected


def test_hybrids_use_the_atlas_memory():
    _, atlas = resolve_preset("atlas")
    for name, layers in [("atlas_mag", ["mag"]), ("atlas_mal", ["memory", "swa"])]:
        pattern, config = resolve_preset(name)
        assert pattern == layers and config == atlas


def test_overrides_change_one_component():
    model = LanguageModel(64, "atlas", **TINY, memory={"window": 3, "optimizer": "gd"})
    mixer = model.blocks[0].mixer
    assert isinstance(mixer, MemoryMixer)
    assert mixer.config == resolve_preset("atlas")[1].replace(window=3, optimizer="gd")
    mal = LanguageModel(64, "atlas_mal", **{**TINY, "n_layers": 4})
    assert mal.layer_kinds == ["memory", "swa", "memory", "swa"]
    assert isinstance(mal.blocks[1].mixer, Attention) and mal.blocks[1].mixer.window == 5


def test_memory_heads_apply_to_memories_only():
    model = LanguageModel(64, "atlas_mag", d_model=16, n_layers=1, n_heads=2, memory_heads=4)
    mag = model.blocks[0].mixer
    assert (mag.swa.n_heads, mag.memory.n_heads, mag.memory.head_dim) == (2, 4, 4)
    assert LanguageModel(64, "atlas", d_model=16, n_layers=1, n_heads=2).blocks[0].mixer.n_heads == 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(preset="atlass"), "unknown preset 'atlass'; valid choices: transformer, swa"),
    (dict(preset="atlas", memory={"windw": 2}), "memory.windw: unknown field; valid fields: architecture, feature_map"),
    (dict(preset="atlas", memory={"optimizer": "adamw"}),
     "memory.optimizer: unknown optimizer 'adamw'; valid choices: gd"),
    (dict(preset="atlas", memory={"optimizer.ns_step": 3}),
     "memory.optimizer.ns_step: muon does not take 'ns_step'; it takes ns_steps, ns_coefficients"),
    (dict(preset="atlas", memory={"ns_steps": 3}), "memory.ns_steps: an option of the optimizer now; write "
                                                   "optimizer.ns_steps: 3, or optimizer: {name: <optimizer>"),
    (dict(preset="atlas", memory={"memory": "linear"}), "memory.memory: renamed; write architecture: linear"),
    (dict(preset="transformer", memory={"window": 2}), "has no memory layer"),
    (dict(preset="atlas", layers=["memory", "lstm"]), "unknown layer kind(s) ['lstm']"),
    (dict(preset="atlas", memory={"window": 0}), "memory.window: expected an int >= 1 or null"),
    (dict(preset="atlas", memory_heads=3), "memory_heads: d_model=32 must be divisible by memory_heads=3"),
])
def test_bad_model_configuration_is_named(kwargs, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        LanguageModel(64, **{**TINY, **kwargs})


def test_short_conv_is_the_causal_depthwise_conv1d_and_streams():
    from torch.nn import functional as F

    from atlas_lab.layers.conv import ShortConv
    torch.manual_seed(0)
    conv = ShortConv(6, 4).double()
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(2, 9, 6, dtype=torch.float64, requires_grad=True)
    y, _ = conv(x)
    padded = F.pad(x.transpose(1, 2), (3, 0))
    expected = F.conv1d(padded, conv.weight, conv.bias, groups=6).transpose(1, 2)
    torch.testing.assert_close(y, expected)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, conv.weight, conv.bias), gy)
    expected_grads = torch.autograd.grad(expected, (x, conv.weight, conv.bias), gy)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)
    first, cache = conv(x[:, :4])
    second, _ = conv(x[:, 4:], cache)
    torch.testing.assert_close(torch.cat([first, second], 1), y)
    # the form taken off the CPU (one depthwise conv1d): the same values and gradients
    padded = torch.cat([x.new_zeros(2, 3, 6), x], 1)
    other = conv.convolved(padded)
    torch.testing.assert_close(other, y)
    for g, e in zip(torch.autograd.grad(other, (x, conv.weight, conv.bias), gy), expected_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_no_logit_sees_a_later_token_or_another_sequence(preset):
    """Changing tokens 60.. of one sequence changes none of its logits before 60 (inside a chunk of 16 too), and no
    logit of the other sequences in the batch; in training mode, as a fit computes them."""
    torch.manual_seed(0)
    model = LanguageModel(256, preset, d_model=32, n_layers=2, n_heads=2, memory_heads=8).train()
    x = torch.randint(0, 256, (3, 96), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[1, 60:] = (y[1, 60:] + 1) % 256
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
    assert torch.equal(a[1, :60], b[1, :60]) and torch.equal(a[[0, 2]], b[[0, 2]])
    assert not torch.equal(a[1, 60:], b[1, 60:])


def _preset_memory(preset, q, k, v, initial_state=None, **gates):
    """memorize with the components of ``preset``'s memory layer (a one-memory-layer preset)."""
    from atlas_lab.memory import memorize

    _, config = resolve_preset(preset)
    return memorize(q, k, v, config, gates=gates, initial_state=initial_state)[0]


def test_retnet_preset_is_fla_retention():
    """retnet: α_h = 1 − 2^(−5−h) from the layer's gates, and its memory equals flash-linear-attention's naive
    retention o_t = Σ_{s≤t} γ_h^{t−s} (q_t·k_s / √d) v_s."""
    naive = pytest.importorskip("fla.ops.retention.naive")
    B, T, H, d = 2, 37, 4, 8
    mixer = tiny("retnet", memory_heads=H).blocks[0].mixer
    alpha = mixer.gates(torch.zeros(B, T, 32))["alpha"]
    assert torch.equal(alpha[0, 0], torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)]))
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, T, H, d, generator=g) for _ in range(3))
    o = _preset_memory("retnet", q * d ** -0.5, k, v, alpha=alpha, eta=1.0)
    o_ref = naive.naive_retention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert ((o - o_ref).norm() / o_ref.norm()).item() < 1e-5


def test_mamba2_preset_is_fla_simple_gla():
    """mamba2: h_t = a_t h_{t−1} + Δ_t v_t k_tᵀ, y_t = h_t q_t — flash-linear-attention's naive simple GLA (Mamba2's
    SSD form) with log-decay g = log a and values Δ·v."""
    naive = pytest.importorskip("fla.ops.simple_gla.naive")
    B, T, H, d = 2, 37, 3, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, T, H, d, generator=g) for _ in range(3))
    a, delta = torch.rand(B, T, H, generator=g) * 0.3 + 0.7, torch.rand(B, T, H, generator=g)
    o = _preset_memory("mamba2", q, k, v, alpha=a, eta=delta)
    o_ref, _ = naive.naive_chunk_simple_gla(q, k, v * delta.unsqueeze(-1), a.log(), scale=1.0, chunk_size=16)
    assert ((o - o_ref).norm() / o_ref.norm()).item() < 1e-5


@pytest.mark.parametrize("preset", ["moneta", "memora"])
def test_miras_presets_are_their_equations_computed_directly(preset):
    """Moneta and Memora by hand, per head: the 2-layer MLP memory M(x) = x + W2 gelu(W1 x), gradients of the
    attentional bias (|M(k) − v|³ summed, or ‖M(k) − v‖²/2) taken by autograd at the weights the chunk of 16 started
    from, then the retention's literal step — Moneta: A = α A − η g, W = A / ‖A‖₄² (A_0 with W_0 = A_0/‖A_0‖₄²);
    Memora: W = c · softmax(α log W − η g) over each row, c = √in (W_0 = c · softmax of the initial weights)."""
    B, T, H, d, E = 2, 37, 3, 4, 4
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=torch.float64) for _ in range(3))
    alpha, eta = torch.rand(B, T, H, generator=g, dtype=torch.float64) * 0.2 + 0.8, torch.rand(
        B, T, H, generator=g, dtype=torch.float64) * 0.1
    W0 = {"W1": torch.randn(B, H, E * d, d, generator=g, dtype=torch.float64) / d ** 0.5,
          "W2": torch.randn(B, H, d, E * d, generator=g, dtype=torch.float64) / (E * d) ** 0.5}
    o = _preset_memory(preset, q, k, v, alpha=alpha, eta=eta, initial_state=W0)

    def M(W, x):
        return x + torch.nn.functional.gelu(x @ W["W1"].T) @ W["W2"].T

    def loss(W, x, target):
        r = M(W, x) - target
        return r.abs().pow(3).sum() if preset == "moneta" else 0.5 * r.square().sum()

    out = torch.zeros_like(o)
    for b, h in itertools.product(range(B), range(H)):
        W = {n: w[b, h] for n, w in W0.items()}
        if preset == "moneta":
            A = {n: w / w.norm(p=4) ** 2 for n, w in W.items()}  # the A_0 with W_0 = A_0 / ‖A_0‖₄²
            assert all(torch.allclose(A[n] / A[n].norm(p=4) ** 2, W[n]) for n in W)
        else:
            W = {n: w.shape[1] ** 0.5 * torch.softmax(w, -1) for n, w in W.items()}
        for t in range(T):
            if t % 16 == 0:
                at = {n: w.detach().requires_grad_() for n, w in W.items()}  # the chunk's evaluation point
            grads = torch.autograd.grad(loss(at, k[b, t, h], v[b, t, h]), list(at.values()))
            a, e = alpha[b, t, h], eta[b, t, h]
            for (n, w), gr in zip(list(W.items()), grads):
                if preset == "moneta":
                    A[n] = a * A[n] - e * gr
                    W[n] = A[n] / A[n].norm(p=4) ** 2
                else:
                    W[n] = w.shape[1] ** 0.5 * torch.softmax(a * w.log() - e * gr, -1)
            out[b, t, h] = M(W, q[b, t, h])
    assert rel_err(o, out) < 1e-10


def test_hybrid_layer_patterns_take_each_presets_memory():
    """gated_deltanet_h2 cycles Mamba2, Gated DeltaNet and SWA layers; samba Mamba2 and SWA; a memory override reaches
    every memory layer."""
    model = tiny("gated_deltanet_h2", n_layers=3, memory={"chunk_size": 8})
    kinds = [type(b.mixer).__name__ for b in model.blocks]
    assert model.layer_kinds == ["mamba2", "memory", "swa"] and kinds == ["MemoryMixer", "MemoryMixer", "Attention"]
    mamba, gdn = model.blocks[0].mixer.config, model.blocks[1].mixer.config
    assert (mamba.attentional_bias, gdn.attentional_bias, mamba.chunk_size, gdn.chunk_size) == ("dot", "l2", 8, 8)
    assert tiny("samba").layer_kinds == ["memory", "swa"] and tiny("samba").memory_config.attentional_bias == "dot"
    with pytest.raises(ValueError, match="or a preset of one memory layer"):
        tiny("atlas", layers=["atlas_mag"])


def test_kimi_linear_is_three_kda_layers_to_one_global_attention_layer():
    """kimi_linear cycles KDA, KDA, KDA, full attention: its streaming state is the three KDA states (state_bytes)
    plus the attention's KV cache, which grows by cache_bytes_per_token per token read."""
    model = tiny("kimi_linear", n_layers=4)
    assert model.layer_kinds == ["memory", "memory", "memory", "attention"]
    assert all(b.mixer.config == tiny("kda").blocks[0].mixer.config for b in model.blocks[:3])
    assert model.blocks[3].mixer.window is None and model.cache_bytes_per_token() > 0
    g, cache, read = torch.Generator().manual_seed(3), None, 0
    with torch.no_grad():
        for n in (17, 5, 11):
            _, cache = model(torch.randint(0, 64, (1, n), generator=g), cache)
            read += n
            size = sum(t.numel() * t.element_size() for t in cache_tensors(cache))
            assert size == model.state_bytes() + read * model.cache_bytes_per_token(), (n, size)


@pytest.mark.parametrize("preset", ["atlas_mag", "atlas_mal", "samba", "gated_deltanet_h2"])
def test_hybrids_with_persistent_tokens_train_and_stream(preset):
    """persistent_tokens = 4: every attention layer (MAG's branch included) holds 4 learnable key/value pairs, which
    get gradients; a stream of pieces equals one call."""
    model = tiny(preset, n_layers=3, persistent_tokens=4)
    attention = [m for m in model.modules() if isinstance(m, Attention)]
    assert attention and all(m.persistent is not None and m.persistent[0].shape[1] == 4 for m in attention)
    x = torch.randint(0, 64, (2, 23), generator=torch.Generator().manual_seed(1))
    logits, _ = model(x)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for m in attention for p in m.persistent)
    model = model.double()
    with torch.no_grad():
        full, _ = model(x)
        cache, pieces = None, []
        for lo, hi in [(0, 6), (6, 7), (7, 23)]:
            out, cache = model(x[:, lo:hi], cache)
            pieces.append(out)
    assert ((torch.cat(pieces, 1) - full).norm() / full.norm()).item() < 1e-10


def test_mac_is_memory_as_context():
    """MAC against a direct computation: segments of 4, retrieval h = M at the segment's start weights (memorize with
    η = 0, which never moves them), attention as an explicit softmax over [P; h_j, x_j for j ≤ i in the segment], the
    memory layer read once over the whole sequence of attention outputs y, o = W_o(RMSNorm(y) ⊙ σ(RMSNorm(z)))."""
    from atlas_lab.layers import MAC
    from atlas_lab.layers.rope import rotary
    from atlas_lab.memory import memorize

    torch.manual_seed(0)
    _, config = resolve_preset("titans")
    mac = MAC(16, 2, config, segment=4, memory_heads=4, persistent=2).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    out, _ = mac(x)
    mem, a = mac.memory, mac.attention
    B, T, Hm, dm, H, d = 2, 10, 4, 4, 2, 8
    weights, ys = {n: w.unsqueeze(0).expand(B, *w.shape) for n, w in mem.initial_weights.items()}, []
    for lo in range(0, T, 4):
        xs = x[:, lo:lo + 4]
        n = xs.shape[1]
        qh = torch.nn.functional.normalize(torch.nn.functional.silu(mac.retrieve_q(xs)).view(B, n, Hm, dm), dim=-1)
        read, _ = memorize(qh, qh, torch.zeros_like(qh), mem.memory, alpha=1.0, eta=0.0, theta=0.0, gamma=1.0,
                           initial_state=weights)
        h = mac.retrieve_out(read.reshape(B, n, Hm * dm))
        pos = torch.arange(lo, lo + n)
        q, k, v = a.qkv(xs).view(B, n, 3, H, d).unbind(2)
        _, kh, vh = a.qkv(h).view(B, n, 3, H, d).unbind(2)
        q, k, kh = rotary(q, pos, a.rope_base), rotary(k, pos, a.rope_base), rotary(kh, pos, a.rope_base)
        y = torch.zeros(B, n, H, d, dtype=x.dtype)
        for i in range(n):
            keys = torch.cat([a.persistent[0].unsqueeze(0).expand(B, -1, -1, -1), kh[:, :i + 1].transpose(1, 2),
                              k[:, :i + 1].transpose(1, 2)], 2)
            vals = torch.cat([a.persistent[1].unsqueeze(0).expand(B, -1, -1, -1), vh[:, :i + 1].transpose(1, 2),
                              v[:, :i + 1].transpose(1, 2)], 2)
            w = torch.softmax(torch.einsum("bhd,bhsd->bhs", q[:, i], keys) / d ** 0.5, -1)
            y[:, i] = torch.einsum("bhs,bhsd->bhd", w, vals)
        ys.append(a.o_proj(y.reshape(B, n, H * d)))
        _, cache = mem(torch.cat(ys, 1))  # the memory after reading every y so far, from the start
        weights = cache["state"].weights
    y = torch.cat(ys, 1)
    z, _ = mem(y)
    direct = mac.o_proj(mac.y_norm(y) * torch.sigmoid(mac.z_norm(z)))
    assert (out - direct).abs().max() < 1e-10
