"""Perplexity by position: how well a model predicts a token against how much of its sequence it has read.

The protocol of flash-linear-attention's PG19 evaluation (evals/ppl.py): the held-out token stream is cut into
consecutive sequences of max_length + 1 tokens (a remainder shorter than that is dropped); each is read from an
empty state, here in windows of the training length T through the streaming cache; the negative log-likelihood of
the next token is taken at every position t ∈ [0, max_length) and averaged over all sequences within each of N
equal position buckets [b·max_length/N, (b+1)·max_length/N). A model that uses its context gets better (lower NLL)
with position; past T it reads what training never showed it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..models import LanguageModel
from .checkpoint import EvalError
from .scores import token_scores


def read_tokens(path: str | Path, tokenizer) -> np.ndarray:
    """The token stream of ``path``: a ``.npy`` array of token ids (held-out tokens, 1-D), or a UTF-8 text file
    encoded by ``tokenizer``. EvalError for a missing or unreadable file or ids outside the vocabulary."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"--ppl-by-position: no such file: {path}")
    if path.suffix == ".npy":
        try:
            ids = np.load(path)
        except ValueError as e:
            raise EvalError(f"--ppl-by-position: {path} is not a readable .npy array ({e})") from None
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise EvalError(f"--ppl-by-position: {path} holds a {ids.dtype} array of shape {list(ids.shape)}; "
                            "expected a 1-D array of token ids")
        if len(ids) and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
            raise EvalError(f"--ppl-by-position: {path} holds token ids from {ids.min()} to {ids.max()}; expected ids "
                            f"in [0, {tokenizer.vocab_size}) of the checkpoint's tokenizer")
        return ids.astype(np.int64)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EvalError(f"--ppl-by-position: {path} is not UTF-8 text ({e.reason} at byte {e.start}); give a text "
                        "file or a .npy array of token ids") from None
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def sequences(tokens: np.ndarray, max_length: int, buckets: int, limit: int | None = None) -> np.ndarray:
    """The consecutive sequences of max_length + 1 tokens of a stream [S, max_length + 1] (at most ``limit``).
    EvalError where the stream holds none or ``buckets`` is not in [1, max_length]."""
    if not 1 <= buckets <= max_length:
        raise EvalError(f"--buckets: expected an int in [1, --max-length = {max_length}], got {buckets}")
    count = len(tokens) // (max_length + 1)
    if count == 0:
        raise EvalError(f"--max-length: {max_length} needs {max_length + 1} tokens per sequence; the file holds "
                        f"{len(tokens)} tokens")
    count = min(count, limit or count)
    return tokens[:count * (max_length + 1)].reshape(count, max_length + 1)


@dataclass
class PositionCurve:
    """Mean NLL (nats per token) by position bucket: bucket b covers positions [edges[b], edges[b+1])."""

    edges: list[int]
    nll: list[float]
    tokens: list[int]  # tokens scored in each bucket (sequences × bucket width)
    sequences: int
    train_length: int

    @property
    def ppl(self) -> list[float]:
        return [float(np.exp(x)) for x in self.nll]


def ppl_by_position(model: LanguageModel, tokens: np.ndarray, max_length: int, window: int, buckets: int,
                    batch_size: int = 8, limit: int | None = None) -> PositionCurve:
    """Mean next-token NLL per position bucket over the sequences of ``tokens`` (module docstring), each read through
    the streaming state in windows of ``window`` (the training length), ``batch_size`` sequences at a time."""
    data = torch.from_numpy(sequences(tokens, max_length, buckets, limit))
    device = next(model.parameters()).device
    total = torch.zeros(max_length, dtype=torch.float64)
    for batch in data.split(batch_size):
        batch = batch.to(device)
        log_probs, _ = token_scores(model, batch[:, :-1], batch[:, 1:], window)
        total -= log_probs.double().sum(0).cpu()
    edges = [b * max_length // buckets for b in range(buckets + 1)]
    nll = [total[a:b].sum().item() / (len(data) * (b - a)) for a, b in zip(edges[:-1], edges[1:])]
    return PositionCurve(edges, nll, [len(data) * (b - a) for a, b in zip(edges[:-1], edges[1:])], len(data), window)


def plot_curve(curve: PositionCurve, path: str | Path, title: str) -> None:
    """Perplexity against position (each bucket at its centre), the training length dashed; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centres = [(a + b) / 2 for a, b in zip(curve.edges[:-1], curve.edges[1:])]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(centres, curve.ppl, marker="o")
    ax.axvline(curve.train_length, color="grey", linestyle="--", label=f"training length T = {curve.train_length}")
    ax.set_xlabel("position in the sequence (tokens read)")
    ax.set_ylabel("perplexity (bucket mean NLL, exponentiated)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
