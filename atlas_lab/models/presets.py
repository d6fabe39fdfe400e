"""Named models (docs/memory.md §6): each is a layer pattern plus a memory (its five components and gates).

A preset is a plain dict: ``layers`` (cycled over the model's depth; kinds: memory, attention, swa, mag, mac, or the
name of a one-memory-layer preset: a memory layer with that preset's memory) and ``memory`` (fields of MemoryConfig
that differ from its defaults, or the name of the preset whose memory the memory layers take). A layer of the pattern
may also be ``{"kind": kind, "memory": changes}``: a layer of that kind whose memory differs from the preset's by
``changes`` (HOPE's continuum memory: the same memory at different chunk sizes). Any field can be overridden; memory
overrides apply to every memory layer, after a layer's own changes.
Gates not listed as "learned" are constants; window presets use c = 8.

Chunk size (docs/memory.md §4, §9): a preset whose published model is the exact online rule uses it — DeltaNet
and Gated DeltaNet take chunk 1 (the WY path computes it 64 tokens at a time), and linear memories with the dot
bias are exact at any chunk size (their gradient does not depend on the weights). The deep memories are
chunk-parallel models, as their papers train them (TTT: inner mini-batch b = 16; Titans, Atlas, OmegaNet, DLA,
the DeepTransformers and DoT take chunk-start gradients over chunks without fixing b in their main text): b = 16
here (MemoryConfig's default), part of the model's definition.
"""
from __future__ import annotations

from ..memory import MemoryConfig

LAYER_KINDS = ("memory", "attention", "swa", "mag", "mac", "lact")
MEMORY_KINDS = ("memory", "mag", "mac", "lact")  # the kinds that hold a memory (and a one-memory-layer preset's name)
_L = "learned"
_WINDOW = 8
# η_max of the deep gd/momentum memories. Chunk-start gradients take b = 16 steps at one point: the chunk's update
# is stable while η · Σ_i ‖h_i‖² (over the chunk's tokens and their windows, h the memory's hidden activations)
# stays below 2. At η_max = 0.1 the memories reach inf within a few hundred tokens at initialisation (d_model
# 128–256, head dim 16–64, T ≥ 256); ttt_mlp at 0.1 trains to step 15 of experiments/lm.yaml before one sequence's
# memory diverges geometrically over chunks (×4·10³ from one chunk to the next by token 160). 0.01 keeps it finite.
_STABLE_ETA_MAX = 0.01
# Momentum multiplies the steady step by 1/(1 − θ) ≈ 10 (θ ≈ 0.9), an Omega window of c tokens sums c gradients per
# step: titans at 0.01 and omeganet at 0.01 (c = 8) diverged like ttt_mlp at 0.1.
_STABLE_MOMENTUM_ETA_MAX = _STABLE_ETA_MAX / 10
_STABLE_WINDOW_ETA_MAX = _STABLE_ETA_MAX / _WINDOW

_LN = {"name": "mlp", "output_norm": True}  # the dot bias has no minimum for an MLP: normalise the memory's output
# LaCT's chunk: one fast-weight update per 2,048 tokens; its muon step has learning rate 1 per chunk (η_c = Σ_t η_t)
# and its momentum about 0.9 per chunk (θ_c = ∏_t θ_t)
_LACT_CHUNK = 2048
# HOPE's continuum memory: the chunk C^(ℓ) of each level (update frequency f_ℓ = C^(4)/C^(ℓ) = 64, 16, 4, 1) and the
# learning rate of one commit, η_c = Σ_{t∈c} η_t = 0.1 at every level (η_t = 0.1/C^(ℓ)): a step on the chunk's mean
# gradient
_CMS_CHUNKS = (16, 64, 256, 1024)
_CMS_ETA = 0.1


_TNT_GLOBAL, _TNT_LOCAL = 64, 8  # TNT's chunk of the global memory, and the local memories' chunk


def _cms_level(chunk_size: int) -> dict:
    """One CMS level: the hope_cms memory committed once per chunk of ``chunk_size`` tokens."""
    return dict(kind="memory", memory=dict(chunk_size=chunk_size, eta=_CMS_ETA / chunk_size))


def _memory(architecture, attentional_bias, **fields):
    return dict(architecture=architecture, attentional_bias=attentional_bias, **fields)


PRESETS: dict[str, dict] = {
    "transformer": dict(layers=["attention"], memory=None),
    "swa": dict(layers=["swa"], memory=None),
    # linear memory
    "linear_attention": dict(layers=["memory"], memory=_memory("linear", "dot", alpha=1.0, eta=1.0)),
    "gla": dict(layers=["memory"], memory=_memory("linear", "dot", alpha=_L, eta=1.0)),
    # RetNet (Sun et al. 2023, eq. 5–8): a fixed decay per head, γ_h = 1 − 2^(−5−h), no input gate; its
    # xPos/complex rotation of q, k is left out (the memory layers have no positional encoding).
    "retnet": dict(layers=["memory"], memory=_memory("linear", "dot", alpha="head_decay", eta=1.0)),
    # Mamba2's SSD layer (Dao & Gu 2024, §3–§7): h_t = a_t h_{t−1} + Δ_t x_t B_tᵀ, y_t = h_t C_t, i.e. a linear memory
    # with the dot bias, a scalar data-dependent decay a_t (α) and input gate Δ_t (η) per head; x, B, C are our
    # v, k, q. Departs from Mamba2's block: a = σ(w·x + b) instead of exp(−softplus(Δ) A), Δ = σ(·) instead of
    # softplus(·), q and k L2-normalised, no D skip; the short conv, SiLU output gate and norm are the mixer's.
    "mamba2": dict(layers=["memory"], memory=_memory("linear", "dot", alpha=_L, eta=_L)),
    # DeltaNet (Schlag et al. 2021; Yang et al. 2024) and Gated DeltaNet (Yang et al. 2025): the exact delta rule,
    # chunk 1. Chunk-start gradients over b > 1 tokens are another, unstable model (I − Σ η_i k_i k_iᵀ can have
    # eigenvalues far below −1); `--model.memory.chunk_size=16` still asks for it.
    "deltanet": dict(layers=["memory"], memory=_memory("linear", "l2", alpha=1.0, eta=_L, chunk_size=1)),
    "gated_deltanet": dict(layers=["memory"], memory=_memory("linear", "l2", alpha=_L, eta=_L, chunk_size=1)),
    # Longhorn (Liu et al., arXiv 2407.14207): the implicit online step S_t = S_{t−1} (I − ε_t k_t k_tᵀ) + ε_t x_t k_tᵀ,
    # ε_t = β_t / (1 + β_t ‖k_t‖²): the delta rule with η_t rescaled by the key (``learning_rule: longhorn``), chunk
    # 1, no retention. Departs from Longhorn's layer: β = σ(w·x + b) (its β comes through a softplus), and the
    # exact state update, not its kernel's diagonal approximation; conv, L2-normalised q, k and the output gate and
    # norm are the mixer's.
    "longhorn": dict(layers=["memory"], memory=_memory("linear", "l2", learning_rule="longhorn", alpha=1.0, eta=_L,
                                                       chunk_size=1)),
    # Kimi Delta Attention (KDA: Kimi Team, "Kimi Linear", arXiv 2510.26692): the gated delta rule with a retention
    # per key channel, S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ, i.e. W_t = W_{t−1} Diag(α_t) −
    # β_t ∇ℓ(W_{t−1} Diag(α_t)) for ℓ = ½‖W k − v‖²: gd with α per key channel and the gradient at the retained
    # weights, chunk 1 (the exact rule, in WY blocks). Departs from Kimi Linear's layer: α = σ(w·x + b) per channel
    # (its α = exp(−exp(A) softplus(·)) comes through a low-rank projection), β = σ(·), no 1/√d_k on q; the short
    # conv, L2-normalised q, k and the output gate and norm are the mixer's.
    "kda": dict(layers=["memory"], memory=_memory("linear", "l2", learning_rule="kda", alpha=_L, eta=_L,
                                                  chunk_size=1)),
    # Gated DeltaNet-2 (GDN-2; defined by flash-linear-attention 0.6, fla/ops/gdn2: no paper is cited there): KDA with
    # separate erase and write gates, S_t = (I − k_t (b_t ⊙ k_t)ᵀ) Diag(α_t) S_{t−1} + k_t (w_t ⊙ v_t)ᵀ, i.e. W_t =
    # P_t − ∇ℓ(P_t Diag(b_t); k_t, w_t ⊙ v_t) with P_t = W_{t−1} Diag(α_t): the gradient (η = 1) at the retained
    # weights times the erase gate b per key channel, of the value times the write gate w per value channel; chunk 1.
    # b = w = β·1 is KDA. Gates σ(w·x + b) as every learned gate here.
    "gated_deltanet2": dict(layers=["memory"], memory=_memory("linear", "l2", learning_rule="gdn2", alpha=_L, eta=1.0,
                                                              chunk_size=1)),
    # Gated DeltaProduct (Siems et al., "DeltaProduct", arXiv 2502.10297): n_h = 2 delta-rule (Householder) steps per
    # token, S_t = (∏_{j=n_h..1} (I − β_{t,j} k_{t,j} k_{t,j}ᵀ)) α_t S_{t−1} + …, i.e. W_{t,0} = α_t W_{t−1}, W_{t,j} =
    # W_{t,j−1} − β_{t,j} ∇ℓ(W_{t,j−1}; k_{t,j}, v_{t,j}), W_t = W_{t,n_h}, y_t = W_t q_t: gd at the retained weights,
    # chunk 1, steps_per_token 2. Departs from the paper's layer: α, β = σ(w·x + b) (no β ∈ [0, 2] negative
    # eigenvalues, no Mamba-style exp(−exp(A) softplus(·)) decay), no 1/√d_k on q; conv, norms, output gate the mixer's.
    "gated_deltaproduct": dict(layers=["memory"], memory=_memory(
        "linear", "l2", learning_rule={"name": "deltaproduct", "householder_steps": 2}, alpha=_L, eta=_L,
        chunk_size=1)),
    "swla": dict(layers=["memory"], memory=_memory("linear", "dot", feature_map="polynomial", window=_WINDOW,
                                                   alpha=_L, eta=_L, gamma=_L, eta_max=0.1)),
    # deep (MLP) memory
    "ttt_mlp": dict(layers=["memory"], memory=_memory("mlp", "l2", alpha=1.0, eta=_L, eta_max=_STABLE_ETA_MAX)),
    "titans": dict(layers=["memory"], memory=_memory("mlp", "l2", optimizer="momentum", alpha=_L, eta=_L, theta=_L,
                                                     eta_max=_STABLE_MOMENTUM_ETA_MAX)),
    "dla": dict(layers=["memory"], memory=_memory(_LN, "dot", feature_map="polynomial", alpha=_L, eta=_L,
                                                  eta_max=_STABLE_ETA_MAX)),
    "omeganet": dict(layers=["memory"], memory=_memory("mlp", "l2", feature_map="polynomial", window=_WINDOW,
                                                       alpha=_L, eta=_L, gamma=_L, eta_max=_STABLE_WINDOW_ETA_MAX)),
    "atlas": dict(layers=["memory"], memory=_memory("mlp", "l2", feature_map="polynomial", window=_WINDOW,
                                                    optimizer="muon", alpha=_L, eta=_L, theta=_L, gamma=_L,
                                                    eta_max=0.1)),
    "atlas_pp": dict(layers=["memory"], memory=_memory("gated_mlp", "l2", feature_map="polynomial", window=_WINDOW,
                                                       optimizer="muon", alpha=_L, eta=_L, theta=_L, gamma=_L,
                                                       eta_max=0.1)),
    "deep_transformer": dict(layers=["memory"], memory=_memory(_LN, "dot", feature_map="taylor", alpha=1.0,
                                                               eta=1.0)),
    # docs/memory.md fixes only α = 1 for SWDT; η = 1 (DeepTransformer's) overflows within 200 tokens at head dim 16
    "swdt": dict(layers=["memory"], memory=_memory(_LN, "dot", feature_map="taylor", window=_WINDOW, alpha=1.0,
                                                   eta=_L, eta_max=_STABLE_ETA_MAX)),
    "dot": dict(layers=["memory"], memory=_memory("mlp", "l2", feature_map="taylor", window=_WINDOW, alpha=_L,
                                                  eta=_L, gamma=_L, eta_max=_STABLE_WINDOW_ETA_MAX)),
    # Miras' Yaad (Behrouz et al. 2025, "It's All Connected", §5): a 2-layer MLP memory, the Huber attentional bias
    # (δ = 1, a constant: Yaad's δ_t is data-dependent), ℓ2 retention (α_t) and gradient descent.
    "yaad": dict(layers=["memory"], memory=_memory("mlp", "huber", alpha=_L, eta=_L, eta_max=_STABLE_ETA_MAX)),
    # Miras' Moneta (§5): a 2-layer MLP memory, the ℓp attentional bias with p = 3 and ℓq retention with q = 4
    # (W_t = A_t / ‖A_t‖_q^{q−2} of an accumulator A_t = α_t A_{t−1} − η_t g_t): lp's and lq_retention's defaults.
    "moneta": dict(layers=["memory"], memory=_memory("mlp", "lp", optimizer="lq_retention", alpha=_L, eta=_L,
                                                     eta_max=_STABLE_ETA_MAX)),
    # Miras' Memora (§5): a 2-layer MLP memory, the ℓ2 attentional bias and KL retention (each row of W a scaled
    # softmax of accumulated logits: W_t = c · softmax(α_t log W_{t−1} − η_t g_t)).
    "memora": dict(layers=["memory"], memory=_memory("mlp", "l2", optimizer="kl_retention", alpha=_L, eta=_L,
                                                     eta_max=_STABLE_ETA_MAX)),
    # hybrids with sliding-window attention
    # Kimi Linear (Kimi Team, arXiv 2510.26692, §3): three KDA layers to one full global-attention layer. Departs
    # from the paper: its global layers are multi-head latent attention without positional encoding (NoPE); here
    # they are the model's multi-head attention with RoPE, and its MoE MLPs are the blocks' dense SwiGLU.
    "kimi_linear": dict(layers=["memory", "memory", "memory", "attention"], memory="kda"),
    "atlas_mag": dict(layers=["mag"], memory="atlas"),
    "atlas_mal": dict(layers=["memory", "swa"], memory="atlas"),
    # memory as context (Titans §4.1; Atlas uses it for BABILong): segments of swa_window tokens attend to themselves
    # and to what they retrieve from the memory, which then reads the attention's output (layers/hybrid.py, MAC)
    "titans_mac": dict(layers=["mac"], memory="titans"),
    "atlas_mac": dict(layers=["mac"], memory="atlas"),
    # Samba (Ren et al. 2024, §2): Mamba, MLP, SWA, MLP — our blocks each carry their MLP: mamba2 layers and SWA.
    "samba": dict(layers=["memory", "swa"], memory="mamba2"),
    # Gated DeltaNet-H2 (Yang, Kautz & Hatamizadeh 2025, §4): Mamba2, Gated DeltaNet and SWA layers in turn.
    "gated_deltanet_h2": dict(layers=["mamba2", "memory", "swa"], memory="gated_deltanet"),
    # LaCT (Zhang et al., "Test-Time Training Done Right", arXiv 2505.23884; its official lact_llm code): large-chunk
    # test-time training beside sliding-window attention. Its fast weights are a SwiGLU MLP, f_W(k) = W_1 (SiLU(W_2 k) ⊙
    # W_3 k) (gated_mlp, SiLU, E = 1, no residual), trained on the dot-product loss −⟨f_W(k), v⟩ with one update per
    # chunk of 2,048 tokens, every token of a chunk reading the weights the chunk started from ("apply, then update":
    # read chunk):
    #     M_c = θ_c M_{c−1} + Σ_{t∈c} γ_t ∇ℓ_t(W_{c−1}) / b,   W'_c = W_{c−1} − η_c NS_5(M_c),
    #     W_c[r] = W'_c[r] ‖W_{c−1}[r]‖ / ‖W'_c[r]‖          (each row kept at its norm: muon keep_row_norms)
    # with LaCT's Newton–Schulz schedule of five coefficient triples (muon ns_coefficients: lact). γ_t: its per-token
    # learning rate; NS removes the scale, so η_c = 1 is its muon step. Its layer is LaCT's (layers.hybrid.LaCT,
    # layer kind lact): one q, k, v projection for the SWA and the memory branch, summed; the SWA window the chunk;
    # RoPE on the fast-weight q, k; the momentum the chunk's mean of a learned per-token σ(·); γ_t = softplus per
    # memory head. Departs from the paper and its code (docs/memory.md §6): one learning rate per token and head, not
    # one per weight matrix.
    "lact": dict(layers=["lact"], memory=_memory(
        {"name": "gated_mlp", "activation": "silu", "residual": False, "expansion": 1}, "dot",
        optimizer={"name": "muon", "ns_coefficients": "lact", "keep_row_norms": True},
        learning_rule={"name": "chunk_commit", "per_matrix": True}, alpha=1.0, eta=1 / _LACT_CHUNK,
        theta=0.9 ** (1 / _LACT_CHUNK), gamma=_L,
        chunk_size=_LACT_CHUNK, read="chunk")),
    # lact without its renormalisation and with Muon's fixed quintic Newton–Schulz: the weights move by one bounded
    # muon step per chunk (α = 1); the other departures as lact's
    "lact_simple": dict(layers=["mag"], memory=_memory(
        {"name": "gated_mlp", "activation": "silu", "residual": False, "expansion": 1}, "dot", optimizer="muon",
        learning_rule="chunk_commit", alpha=1.0, eta=1 / _LACT_CHUNK, theta=0.9 ** (1 / _LACT_CHUNK), gamma=_L,
        chunk_size=_LACT_CHUNK, read="chunk")),
    # HOPE's continuum memory system (CMS; Behrouz et al., "Nested Learning: The Illusion of Deep Learning
    # Architectures", NeurIPS 2025, §7.1, eqs. 70–71): a chain of MLP blocks y_t = MLP^(f_k)(… MLP^(f_1)(x_t)), block ℓ
    # updated only at the end of each chunk of C^(ℓ) tokens with the sum of its tokens' steps taken at the weights the
    # chunk started from, θ^(ℓ)_{i+1} = θ^(ℓ)_i − Σ_{t=i−C^(ℓ)..i} η^(ℓ)_t ∇ℓ(θ^(ℓ)_i; x_t) when i ≡ 0 (mod C^(ℓ)).
    # Here: one memory layer per level (the chain is the stack of layers, levels cycling over the depth), each a Titans
    # MLP memory M(k) = k + W_2 σ(W_1 k) on the l2 loss ½‖M(k_t) − v_t‖² with gd, α = 1 and read chunk (every token of a
    # chunk reads θ_i), chunk C^(ℓ) = 16, 64, 256, 1024: η^(ℓ)_t = γ_t η/C^(ℓ) (γ_t learned per head and token), so each
    # commit is a step of η = 0.1 on the chunk's γ-weighted mean gradient. Departs from the paper: its blocks are
    # the Transformer's MLPs applied to x_t itself, with an unspecified "error component" f; here each is a memory
    # layer with its own q, k, v projections and its associative-memory loss, and the blocks of our model (residual,
    # norms, their own fixed SwiGLU) sit between the levels; HOPE's self-modifying Titans layer is not included.
    "hope_cms": dict(layers=[_cms_level(c) for c in _CMS_CHUNKS], memory=_memory(
        "mlp", "l2", alpha=1.0, eta=_CMS_ETA / _CMS_CHUNKS[0], gamma=_L, chunk_size=_CMS_CHUNKS[0], read="chunk")),
    # HOPE's continuum memory as one memory (the levels rule, learning_rules.Levels): the chain's levels are the four
    # layers of one MLP memory M(k) = k + W_4 σ(W_3 σ(W_2 σ(W_1 k))), W_ℓ committed every C^(ℓ) = 16, 64, 256, 1024
    # tokens with its tokens' gradients of the memory's one loss (½‖M(k_t) − v_t‖²) at the weights of the moment, at
    # rate r_ℓ = 16/C^(ℓ): each commit a step of η = 0.1 on its chunk's γ-weighted mean gradient, as in hope_cms.
    # Departs from the paper as hope_cms does (a memory layer with its own projections and loss), and its levels are
    # single matrices of one MLP (no residual between them) trained by backpropagation through the chain, where
    # hope_cms's levels are separate MLP blocks each trained on its own loss.
    "hope_levels": dict(layers=["memory"], memory=_memory(
        {"name": "mlp", "depth": len(_CMS_CHUNKS)}, "l2", alpha=1.0, eta=_CMS_ETA / _CMS_CHUNKS[0], gamma=_L,
        chunk_size=_CMS_CHUNKS[0], read="chunk", learning_rule={
            "name": "levels", "chunks": list(_CMS_CHUNKS), "rates": [_CMS_CHUNKS[0] / c for c in _CMS_CHUNKS]})),
    # TNT (Li et al., "TNT: Improving Chunkwise Training for Test-Time Memorization", arXiv 2511.07343): a global
    # memory trained on large chunks beside local memories trained on small chunks whose state returns to its
    # learned initial weights W_0 every S_L tokens, so their segments are independent (read in parallel):
    #     global: W_t = α_t W_{t−1} − η_t ∇ℓ(W̃_G; k_t, v_t), W̃_G the state before its chunk of C_G tokens
    #     local:  the same on chunks of C_L ≪ C_G tokens, with W_{t−1} := W_0 when t ≡ 0 (mod S_L)
    # Here: Titans MLP memories on the l2 loss with gd and learned α, η; the global memory read at its chunk's start
    # (read: start, the paper's eq. 7: y_t = f(W_{ξ(t, C_G)}, q_t)), the local ones per token (read: token; start
    # is one YAML key away); C_G = 64 and C_L = 8 with S_L = 64 (a reset at each global chunk). Departs from the
    # paper: the global and local memories are separate layers in turn (the paper sums their reads in one layer,
    # with several local memories of different chunks); its Q-K projection of the local queries onto the span of
    # the chunk's keys, and the stage-2 fine-tuning at smaller chunks, are not included.
    "tnt": dict(layers=[dict(kind="memory"), dict(kind="memory", memory=dict(
        chunk_size=_TNT_LOCAL, read="token", learning_rule={"name": "chunk_commit", "reset_every": _TNT_GLOBAL}))],
                memory=_memory("mlp", "l2", learning_rule="chunk_commit", alpha=_L, eta=_L, eta_max=_STABLE_ETA_MAX,
                               chunk_size=_TNT_GLOBAL, read="start")),
}


def layer_entry(entry) -> tuple[str, dict]:
    """A layer of a pattern -> (kind, its memory changes): "swa" -> ("swa", {}); {"kind": "memory", "memory":
    {"chunk_size": 64}} -> ("memory", {"chunk_size": 64}). The kind itself is checked by the model."""
    if isinstance(entry, str):
        return entry, {}
    if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str) or set(entry) - {"kind", "memory"} \
            or not isinstance(entry.get("memory", {}), dict):
        raise ValueError(f"layers: a layer is a kind or {{kind: <kind>, memory: {{<field>: <value>}}}}; got {entry!r}")
    return entry["kind"], dict(entry.get("memory", {}))


def layer_label(kind: str, changes: dict) -> str:
    """A layer (``layer_entry``'s pair) as `atlas-lab presets` shows it: swa, memory(chunk_size=64,eta=0.1)."""
    return kind + (f"({','.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in changes.items())})"
                   if changes else "")


def resolve_preset(name: str, memory_overrides: dict | None = None,
                   layer_changes: dict | None = None) -> tuple[list, MemoryConfig | None]:
    """(layer pattern, MemoryConfig or None) of a preset, with fields changed by ``layer_changes`` (one layer's, see
    ``layer_entry``) and then by ``memory_overrides`` (both in MemoryConfig.replace's form: {"window": 16,
    "optimizer.ns_steps": 3})."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid choices: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    memory = preset["memory"]
    if isinstance(memory, str):  # a hybrid borrows another preset's memory
        memory = PRESETS[memory]["memory"]
    if memory is None:
        if memory_overrides or layer_changes:
            raise ValueError(f"preset {name!r} has no memory layer; memory overrides "
                             f"{sorted({**(layer_changes or {}), **(memory_overrides or {})})} do not apply")
        return list(preset["layers"]), None
    config = MemoryConfig().replace(f"preset {name!r}", **memory)
    if layer_changes:
        config = config.replace("layers.memory", **layer_changes)
    if memory_overrides:
        config = config.replace("memory", **memory_overrides)
    return list(preset["layers"]), config
