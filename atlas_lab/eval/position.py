"""Perplexity by position: how well a model predicts a token against how much of its sequence it has read.

The protocol of flash-linear-attention's PG19 evaluation (evals/ppl.py): the held-out token stream is cut into
consecutive sequences of max_length + 1 tokens (a remainder shorter than that is dropped); each is read from an
empty state, here in windows of the training length T through the streaming cache; the negative log-likelihood of
the next token is taken at every position t ∈ [0, max_length) and averaged over all sequences within each of N
equal position buckets [b·max_length/N, (b+1)·max_length/N). A model that uses its context gets better (lower NLL)
with position; past T it reads what training never showed it.

A split of a prepared corpus (``atlas-lab data prepare``: DATA_DIR/val) is read as documents instead: its token
stream is read back with litdata, cut after every <eos>, and each document at least max_length + 1 tokens long
(its <eos> included) gives one sequence, its first max_length + 1 tokens, so every position counts the tokens read
of its document.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..data.tokenizers import describe
from .arguments import EvalError, check_buckets

if TYPE_CHECKING:
    from ..models import LanguageModel


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


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers give every text the same ids: the same class and, for BPE, the same vocabulary and
    merges (tokenizer.json)."""
    return type(a) is type(b) and (not hasattr(a, "tokenizer") or a.tokenizer.to_str() == b.tokenizer.to_str())


def split_documents(split_dir: str | Path, tokenizer) -> Iterator[np.ndarray]:
    """The documents of a split written by ``atlas-lab data prepare`` (a folder such as DATA_DIR/val), each with its
    <eos>, in the order written. The split's token stream is read back with litdata (StreamingDataset, TokensLoader)
    in blocks of g tokens, g the greatest common divisor of its chunks' token counts, so every token is read once.
    EvalError where the folder is not such a split or was tokenised otherwise than ``tokenizer`` encodes."""
    from ..data.shards import load_tokenizer, read_corpus

    split = Path(split_dir)
    if (split / "corpus.json").is_file():
        raise EvalError(f"--ppl-by-position: {split} is a prepared corpus; expected one of its splits, e.g. "
                        f"{split / 'val'}")
    try:
        corpus = read_corpus(split.parent)
    except ValueError:
        raise EvalError(f"--ppl-by-position: {split} is a folder without corpus.json beside it; expected a text file, "
                        "a .npy array of token ids or a split of atlas-lab data prepare (DATA_DIR/val)") from None
    if split.name not in corpus["splits"] or not (split / "index.json").is_file():
        raise EvalError(f"--ppl-by-position: {split.parent} has no split {split.name!r}; its splits: "
                        f"{', '.join(corpus['splits'])}")
    written = load_tokenizer(split.parent)
    if not same_tokenizer(written, tokenizer):
        raise EvalError(f"--ppl-by-position: {split} holds tokens of {describe(written)} ({split.parent}); the "
                        f"checkpoint reads text with {describe(tokenizer)}: expected a corpus prepared with the "
                        "checkpoint's tokenizer")
    try:
        from litdata import StreamingDataset
        from litdata.streaming.item_loader import TokensLoader
    except ModuleNotFoundError:
        raise EvalError("--ppl-by-position: reading token shards needs litdata, which comes with the lm extra: "
                        "pip install 'atlas-lab[lm]'") from None
    block = math.gcd(*(c["dim"] for c in json.loads((split / "index.json").read_text())["chunks"]))
    data = StreamingDataset(str(split), item_loader=TokensLoader(block_size=block), shuffle=False)
    pending: list[np.ndarray] = []
    for i in range(len(data)):
        tokens = np.asarray(data[i], dtype=np.int64)
        start = 0
        for end in np.flatnonzero(tokens == written.eos_id) + 1:
            yield np.concatenate(pending + [tokens[start:end]])
            pending, start = [], end
        pending.append(tokens[start:])


def document_sequences(split_dir: str | Path, tokenizer, max_length: int, limit: int | None = None) -> np.ndarray:
    """The first max_length + 1 tokens of every document of a prepared split at least that long [S, max_length + 1]
    (the first ``limit``). EvalError where no document is that long."""
    rows, count, longest = [], 0, 0
    for document in split_documents(split_dir, tokenizer):
        count, longest = count + 1, max(longest, len(document))
        if len(document) > max_length:
            rows.append(document[:max_length + 1])
            if len(rows) == limit:
                break
    if not rows:
        raise EvalError(f"--max-length: {max_length} needs documents of {max_length + 1} tokens (with their <eos>); "
                        f"the longest of the {count} documents of {split_dir} has {longest}")
    return np.stack(rows)


def read_sequences(path: str | Path, tokenizer, max_length: int, buckets: int, limit: int | None = None) -> np.ndarray:
    """The sequences scored by position [S, max_length + 1]: a prepared split's documents (``document_sequences``),
    or the consecutive sequences of a file's token stream (``read_tokens``, ``sequences``). EvalError on bad input."""
    check_buckets(buckets, max_length)
    if Path(path).is_dir():
        return document_sequences(path, tokenizer, max_length, limit)
    return sequences(read_tokens(path, tokenizer), max_length, buckets, limit)


def sequences(tokens: np.ndarray, max_length: int, buckets: int, limit: int | None = None) -> np.ndarray:
    """The consecutive sequences of max_length + 1 tokens of a stream [S, max_length + 1] (at most ``limit``).
    EvalError where the stream holds none or ``buckets`` is not in [1, max_length]."""
    check_buckets(buckets, max_length)
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
    """Mean next-token NLL per position bucket over the consecutive sequences of the stream ``tokens`` (module
    docstring): ``position_curve`` of ``sequences``."""
    return position_curve(model, sequences(tokens, max_length, buckets, limit), window, buckets, batch_size)


def position_curve(model: LanguageModel, rows: np.ndarray, window: int, buckets: int,
                   batch_size: int = 8) -> PositionCurve:
    """Mean next-token NLL per position bucket over the sequences ``rows`` [S, max_length + 1], each read from an
    empty state through the streaming state in windows of ``window`` (the training length), ``batch_size``
    sequences at a time."""
    import torch  # here: the sequences are read and checked without it

    from .scores import token_scores

    data = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    max_length = data.shape[1] - 1
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
