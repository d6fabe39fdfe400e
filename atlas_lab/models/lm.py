"""Llama-style language model around any token mixer (docs/memory.md §8).

Embedding -> N × [RMSNorm -> mixer -> residual -> RMSNorm -> SwiGLU -> residual] -> RMSNorm -> LM head.
Every call takes and returns a streaming cache (one entry per layer), so a sequence can be read in
pieces of any size with the same result as in one call. A packed batch (documents back to back in a row) is read
with ``document_start``: each document as a sequence of its own (models/documents.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, TypedDict, Union

import torch
from torch import nn
from torch.nn import functional as F

from ..layers import MAC, MAG, Attention, LaCT, MemoryMixer
from ..memory.config import COMPONENTS, MOVED, RULE_FIELDS, MemoryConfig
from .documents import read_documents
from .presets import LAYER_KINDS, MEMORY_KINDS, PRESETS, layer_entry, layer_label, resolve_preset


class SwiGLU(nn.Module):
    """W_2 (SiLU(W_1 x) ⊙ W_3 x), hidden width ≈ 8/3·d rounded up to a multiple of 16."""

    def __init__(self, d_model: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or 16 * ((8 * d_model // 3 + 15) // 16)
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        a, b = self.w13(x).chunk(2, -1)
        return self.w2(F.silu(a) * b)


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, d_model: int, mlp_hidden: int | None):
        super().__init__()
        self.mixer_norm, self.mlp_norm = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.mixer, self.mlp = mixer, SwiGLU(d_model, mlp_hidden)

    def forward(self, x, cache=None):
        h, cache = self.mixer(self.mixer_norm(x), cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache


PresetName = Literal[tuple(PRESETS)]  # every preset name: the CLI's parser lists them on a bad value
# a memory field's value as YAML writes it: data, never an object a parser builds (a component's class_path stays a
# mapping, which MemoryConfig builds and names in a bad one)
MemoryValue = Union[bool, int, float, str, None, list, dict]
# changes to a preset's memory: MemoryConfig's fields, each optional, a component as a short-hand or a mapping; the
# parser names an unknown key. A value is checked by MemoryConfig, whose line states the range and the choices
# (``model.memory.window: expected an int >= 1 or null (global), got 'wide'``). The keys of the earlier flat form
# pass, so that MemoryConfig.replace says how to write them now.
MemoryChanges = TypedDict("MemoryChanges", {
    **{f.name: Union[str, dict[str, MemoryValue]] if f.name in COMPONENTS else MemoryValue
       for f in fields(MemoryConfig)},
    **{key: MemoryValue for key in (*MOVED, *RULE_FIELDS)}}, total=False)


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass
class ModelConfig:
    """A named model at a given size: LanguageModel's arguments after vocab_size (SequenceModel's ``model.*``).

    Args:
        preset: the named model (atlas, titans, omeganet, deltanet, transformer, ...; see ``atlas-lab presets``).
        memory: changes to the preset's memory, every memory layer's (MemoryConfig fields, e.g. ``{window: 16,
            optimizer: gd}``; a component's option as ``optimizer.ns_steps`` or ``optimizer: {name: muon,
            ns_steps: 3}``).
        layers: overrides the preset's layer pattern, cycled over n_layers (memory, attention, swa, mag, mac, or a
            one-memory-layer preset such as mamba2; or {kind: memory, memory: {chunk_size: 64}}, a layer whose memory
            differs from the others': presets.layer_entry).
        d_model: the width of the residual stream.
        n_layers: the blocks.
        n_heads: heads of attention and, unless memory_heads is given, of the memories (memory layers and MAG's
            memory branch); head dim = d_model / heads.
        swa_window: the window of sliding-window attention (and MAC's segment length).
        mlp_hidden: the SwiGLU's hidden width (null: 8/3 d_model rounded up to a multiple of 16).
        tie_embeddings: the LM head shares the embedding's weights.
        memory_heads: heads of the memory layers when they differ from the attention's n_heads (null: n_heads);
            e.g. attention heads of 16 dims next to memory heads of 4, whose polynomial features stay small.
        persistent_tokens: persistent memory (Titans §3.3): learnable key/value pairs every attention layer's queries
            attend to besides their window (the hybrids' SWA, MAG's attention branch); 0: none.
    """

    preset: PresetName = "atlas"
    memory: Optional[MemoryChanges] = None
    layers: Optional[list[Union[str, dict[str, MemoryValue]]]] = None
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 8
    swa_window: int = 64
    mlp_hidden: Optional[int] = None
    tie_embeddings: bool = True
    memory_heads: Optional[int] = None
    persistent_tokens: int = 0

    def __post_init__(self):
        """ValueError ``<field>: expected ..., got ...`` for a size out of its range."""
        for name, least in (("d_model", 1), ("n_layers", 1), ("swa_window", 1), ("persistent_tokens", 0)):
            if not _count(getattr(self, name), least):
                raise ValueError(f"{name}: expected an int >= {least}, got {getattr(self, name)!r}")
        if self.mlp_hidden is not None and not _count(self.mlp_hidden, 1):
            raise ValueError(f"mlp_hidden: expected null or an int >= 1, got {self.mlp_hidden!r}")
        for key in ("n_heads", "memory_heads"):
            heads = getattr(self, key)
            if heads is not None and (not _count(heads, 1) or self.d_model % heads):
                raise ValueError(f"{key}: d_model={self.d_model} must be divisible by {key}={heads}")


RECOMPILE_LIMIT = 64  # compiled variants kept per block: lengths × (training, validation) × (cache or none)


# torch.compile's options for the blocks (``model.compile: {mode: reduce-overhead}``). mode: torch's modes;
# "reduce-overhead" runs each block's forward and backward as a CUDA graph (one replay instead of a launch per kernel;
# on the CPU, which has no CUDA graphs, it compiles as the default mode does). fullgraph: a graph break is an error
# instead of a split graph. (The functional form keeps the annotations types, for the config checker.)
CompileOptions = TypedDict("CompileOptions", {
    "mode": Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
    "fullgraph": bool}, total=False)


def compile_blocks(model: nn.Module, options: Optional[CompileOptions] = None) -> None:
    """``torch.compile`` (inductor) each block of ``model`` in place with ``options`` (``CompileOptions``; a key it
    does not hold is a ValueError naming it): the chunked memory path's per-chunk element-wise kernels fused
    (docs/performance.md, "Compiled blocks"), the parameters keeping their names (checkpoints load either way). Every
    built-in memory traces in one graph without a host synchronisation, so "reduce-overhead" captures it whole. Each
    sequence length, grad mode and cache form compiles once (static shapes), the first step of each paying for it; up
    to RECOMPILE_LIMIT variants per block, beyond which torch runs the block uncompiled (it raises torch's limit to
    that number when it is lower)."""
    import torch._dynamo

    from ..memory.components import check_value

    options = {} if options is None else options
    for key, value in options.items():
        if key not in CompileOptions.__annotations__:
            raise ValueError(f"compile.{key}: unknown key; expected one of {', '.join(CompileOptions.__annotations__)}"
                             f"; got {key}: {value}")
        check_value(f"compile.{key}", value, CompileOptions.__annotations__[key])
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # its name before torch 2.7
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    for block in model.blocks:
        block.compile(dynamic=False, **options)


class LanguageModel(nn.Module):
    """A named model at a given size (``ModelConfig``). input_ids: [B, T] -> logits [B, T, vocab_size].

    ``LanguageModel(vocab_size, preset, d_model=..., ...)``: the arguments after vocab_size are ModelConfig's fields;
    ``config`` holds them.
    """

    def __init__(self, vocab_size: int, *args, **kwargs):
        super().__init__()
        self.config = config = ModelConfig(*args, **kwargs)
        preset, memory, layers, d_model, n_heads = config.preset, config.memory, config.layers, config.d_model, \
            config.n_heads
        n_layers, swa_window, persistent_tokens = config.n_layers, config.swa_window, config.persistent_tokens
        memory_heads = config.memory_heads or n_heads
        pattern, memory_config = resolve_preset(preset, memory)
        pattern = [layer_entry(e) for e in (layers or pattern)]  # (kind, the layer's memory changes)
        # a layer may also be named after a single-memory-layer preset: a memory layer with that preset's memory
        layer_presets = [p for p, spec in PRESETS.items() if spec["layers"] == ["memory"]]
        bad = [k for k, _ in pattern if k not in LAYER_KINDS and k not in layer_presets]
        if bad:
            raise ValueError(f"layers: unknown layer kind(s) {bad}; valid choices: {', '.join(LAYER_KINDS)}, or a "
                             f"preset of one memory layer ({', '.join(layer_presets)})")
        if memory_config is None and any(k in MEMORY_KINDS for k, _ in pattern):
            raise ValueError(f"layers: preset {preset!r} has no memory configuration for memory/mag/mac layers")
        for k, changes in pattern:
            if changes and k not in MEMORY_KINDS and k not in layer_presets:
                raise ValueError(f"layers: a {k} layer has no memory; its changes {sorted(changes)} do not apply")

        def layer_memory(kind, changes):  # its preset's memory (or the model's), its changes, the overrides
            if kind in layer_presets:
                return resolve_preset(kind, memory, changes)[1]
            return resolve_preset(preset, memory, changes)[1] if changes else memory_config

        self.preset, self.memory_config, self.vocab_size = preset, memory_config, vocab_size
        layer_list = [pattern[i % len(pattern)] for i in range(n_layers)]
        self.layer_kinds = [k for k, _ in layer_list]
        self.layer_labels = [layer_label(k, changes) for k, changes in layer_list]

        def mixer(kind, changes):
            if kind in ("attention", "swa"):
                return Attention(d_model, n_heads, window=swa_window if kind == "swa" else None,
                                 persistent=persistent_tokens)
            c = layer_memory(kind, changes)
            if kind == "mac":  # segments of the SWA window's length
                return MAC(d_model, n_heads, c, swa_window, memory_heads, persistent_tokens)
            if kind == "mag":
                return MAG(d_model, n_heads, c, swa_window, memory_heads, persistent_tokens)
            if kind == "lact":  # LaCT's layer: shared q, k, v, SWA over the chunk, RoPE on the fast q, k
                return LaCT(d_model, n_heads, c, swa_window, memory_heads, persistent_tokens)
            return MemoryMixer(d_model, memory_heads, c)  # memory, or a one-memory-layer preset

        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(mixer(k, changes), d_model, config.mlp_hidden) for k, changes in layer_list)
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def hidden_states(self, input_ids: torch.Tensor, cache: list | None = None,
                      document_start: torch.Tensor | None = None):
        """Final normalised hidden states [B, T, d_model] and the new cache. input_ids: integers in [0, vocab_size),
        [B, T] with T ≥ 1 (the attention layers take no empty piece); cache: one entry per layer, or None.

        document_start: None, or [B, T] bool, True where a packed document begins: every document of a row is then
        read as a sequence of its own (models/documents.py: each is exactly the model on that document alone), and
        the returned cache is None. Given with a cache it is refused (ValueError): a stream would need each row's
        first document to continue the cache and each row's state at its end, which rows read apart, right-padded,
        do not give exactly."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex() \
                or input_ids.dtype == torch.bool:
            got = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise TypeError(f"LanguageModel: input_ids must be an integer torch.Tensor [B, T]; got {got}")
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"LanguageModel: input_ids must have shape [B, T] with T >= 1; "
                             f"got {list(input_ids.shape)}")
        # on the CPU only: on an accelerator the check would synchronise every forward (its embedding asserts)
        if input_ids.device.type == "cpu" and ((input_ids < 0) | (input_ids >= self.vocab_size)).any():
            raise ValueError(f"LanguageModel: input_ids must lie in [0, vocab_size) = [0, {self.vocab_size}); got "
                             f"values from {input_ids.min().item()} to {input_ids.max().item()}")
        if cache and len(cache) != len(self.blocks):
            raise ValueError(f"LanguageModel: cache must hold one entry per layer ({len(self.blocks)}); "
                             f"got {len(cache)}")
        if document_start is None:
            return self._read(input_ids, cache)
        if not isinstance(document_start, torch.Tensor) or document_start.dtype != torch.bool \
                or document_start.shape != input_ids.shape:
            got = f"{document_start.dtype} {list(document_start.shape)}" if isinstance(document_start, torch.Tensor) \
                else type(document_start).__name__
            raise ValueError(f"LanguageModel: document_start must be a bool tensor of input_ids' shape "
                             f"{list(input_ids.shape)}; got {got}")
        if cache:
            raise ValueError("LanguageModel: document_start takes no cache (a packed batch is read from the start "
                             "of each row); stream without document_start")
        return read_documents(lambda ids: self._read(ids)[0], input_ids, document_start), None

    def _read(self, input_ids: torch.Tensor, cache: list | None = None):
        """hidden_states without the checks: the embedding, the blocks (each with its cache entry) and the norm."""
        x = self.embed(input_ids)
        cache = cache or [None] * len(self.blocks)
        new_cache = []
        for block, c in zip(self.blocks, cache):
            x, c = block(x, c)
            new_cache.append(c)
        return self.norm(x), new_cache

    def hidden_pieces(self, input_ids: torch.Tensor, piece: int):
        """The hidden states of input_ids [B, L] read in pieces of ``piece`` tokens, the streaming cache carried from
        one to the next: one [B, n, d_model] per piece, together those of one call, at the memory of one piece."""
        cache = None
        for chunk in input_ids.split(piece, 1):
            h, cache = self.hidden_states(chunk, cache)
            yield h

    def forward(self, input_ids: torch.Tensor, cache: list | None = None, document_start: torch.Tensor | None = None):
        """(logits [B, T, vocab_size], cache): ``hidden_states``'s arguments."""
        h, cache = self.hidden_states(input_ids, cache, document_start)
        return self.head(h), cache

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 cache: list | None = None, generator: torch.Generator | None = None):
        """Continue ``prompt`` [B, T] by ``max_new_tokens`` tokens with the streaming cache.

        temperature 0 is greedy decoding. Returns (new tokens [B, max_new_tokens], cache).
        """
        logits, cache = self(prompt, cache)
        out = []
        for i in range(max_new_tokens):
            last = logits[:, -1].float()
            if temperature > 0:
                token = torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=generator)
            else:
                token = last.argmax(-1, keepdim=True)
            out.append(token)
            if i + 1 < max_new_tokens:
                logits, cache = self(token, cache)
        return torch.cat(out, 1), cache

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """Fixed-size streaming state of all layers (memory weights, windows, conv caches, SWA rings)."""
        return sum(b.mixer.state_bytes(batch_size, dtype_bytes) for b in self.blocks)

    def flops_per_token(self, T: int) -> dict:
        """Forward FLOPs per token of the token mixers' cores over all layers, reading T tokens (matrix products;
        projections and MLPs left out): {"memory": the memorize calls (atlas_lab.memory.cost), "attention": softmax
        attention, full or sliding-window}; "memory" is None where a memory has no cost formula (cost.py)."""
        from ..memory.cost import attention_flops
        from ..memory.plan import Shapes, plan

        out = {"memory": 0.0, "attention": 0.0}
        segment_attention = {id(m.attention) for m in self.modules() if isinstance(m, MAC)}
        for m in self.modules():
            if isinstance(m, MAC):
                out["attention"] += m.attention_flops(T)
            elif isinstance(m, (MemoryMixer, LaCT)):
                heads, dim = (m.n_heads, m.head_dim) if isinstance(m, MemoryMixer) else (m.memory_heads, m.memory_dim)
                flops = plan(m.config, Shapes(1, T, heads, dim, dim), impl="chunked").flops
                out["memory"] = None if flops is None or out["memory"] is None else out["memory"] + heads * flops
                if isinstance(m, LaCT):  # its SWA branch
                    out["attention"] += m.n_heads * attention_flops(m.head_dim, T, m.window)
            elif isinstance(m, Attention) and id(m) not in segment_attention:
                out["attention"] += m.n_heads * attention_flops(m.head_dim, T, m.window)
        return out

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """How much the streaming state grows per token read (KV caches of full attention, global windows)."""
        return sum(b.mixer.cache_bytes_per_token(dtype_bytes) for b in self.blocks)
