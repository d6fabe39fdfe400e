"""The one object every path of ``memorize`` takes, and the one it returns (docs/memory.md §5).

    path(call: Call) -> Result(y, state)

Every tensor is heads first: N = B·H sequences, S = T·n_h steps of the rule (n_h: its steps per token).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch


class Inputs(NamedTuple):
    """A call's steps, as the rule wrote them (LearningRule.act).

    q [N, S, d_k]; k, v, gamma [N, m0 + S, ·]: the m0 window tokens a state carries, then the call's; alpha, eta,
    theta [N, S(, C)] (C: a gate per channel or per weight matrix); scale: f [N, S(, C)], token t's gradient at
    W_{t−1} Diag(f_t), or None: at W̃ (LearningRule.point)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gamma: torch.Tensor
    alpha: torch.Tensor
    eta: torch.Tensor
    theta: torch.Tensor
    scale: torch.Tensor | None


class Carried(NamedTuple):
    """What runs from one chunk (and one call) to the next, {name: [N, *shape]} for each weight matrix:
    weights W, optimizer_state S (None for a stateless optimizer), eval_weights W̃ (mid-chunk, read token and start;
    else None), offset (tokens of the chunk in progress: of the longest level's chunk with read chunk), pending (read
    chunk: the commits in progress, optimizers.accumulate; else None)."""

    weights: dict
    optimizer_state: dict | None
    eval_weights: dict | None
    offset: int
    pending: dict | None


class Memory(NamedTuple):
    """The components and settings a path computes with: mem, bias, optimizer (component objects; the optimizer on
    the plan's Newton–Schulz), phi (the feature map as a function), window (c or None), chunk_size, read, commits
    (read chunk: {name: (C, r)}, LearningRule.commits; else None), checkpoint (the chunked path's option)."""

    mem: object
    phi: Callable
    bias: object
    optimizer: object
    window: int | None
    chunk_size: int
    read: str
    commits: dict | None
    checkpoint: bool


class Call(NamedTuple):
    """One call of a path: its inputs, the carried state it starts from, the plan (memory/plan.py) and the memory."""

    inputs: Inputs
    state: Carried
    plan: object
    memory: Memory


class Result(NamedTuple):
    """What a path returns: y [N, S, d_out] (every step's read) and the carried state after the call."""

    y: torch.Tensor
    state: Carried
