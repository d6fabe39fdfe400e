"""MAD: the mechanistic architecture design suite (Poli et al. 2024; docs/tasks.md §5), vectorised.

Token layout per task (V = vocab_size, L = seq_len; special tokens take the highest ids):
- in_context_recall: keys [0, V/2), values [V/2, V). L/2 slots "k v"; keys drawn with replacement, a key's
  value fixed at its first occurrence; the last slot repeats a key already seen. input_ids = seq[:-1] (L−1
  tokens), labels[t] = seq[t+1]: training scores every position; val/test only positions whose next token is
  the value of an already-seen key.
- noisy_in_context_recall: as above with the top `noise_vocab_size` ids as noise (keys/values share the
  rest); every slot but the last (and one kept at random) becomes two noise tokens with prob. frac_noise.
- fuzzy_in_context_recall: pad V−1; keys [0, (V−1)//2), values up to V−2; keys and values are tuples of 1 to
  k_motif_size / v_motif_size distinct tokens (test keys all have k_motif_size tokens). Slots fill the
  sequence, the last one repeats a seen key, the rest is left-padded; input_ids = seq[:-1] (L tokens).
  Training scores every position; val/test the value tokens of repeated keys.
- selective_copying: n = num_tokens_to_copy content tokens from [0, V−2) scattered in order among blanks
  (V−2) in the first L−n−1 positions, then the copy token (V−1), then n blanks whose labels are the content
  tokens in order (labels aligned with positions, not shifted).
- compression: L−1 tokens from [0, V−1), then the compression token V−1. target = "compression": the model
  reads input_ids [B, L] and decodes its LAST hidden state (plus a position embedding of i, small MLP) into
  every token; labels [B, L] = input_ids: labels[:, i] is the token to reconstruct at position i.
- memorization: one fixed key -> value map (keys [0, (V−1)//2), values [(V−1)//2, V−1)) shared by train, val
  and test (`kv_map`); sequences of L/2 pairs "key insert" (insert = V−1); labels at each insert position =
  the key's value.
`target`: "next_token" (recall tasks: labels[t] is the token after t), "positions" (selective copying,
memorization: labels[t] is what the output at t must be) — both score output t against labels[t] — or
"compression" (the special head above).
"""
from __future__ import annotations

import numpy as np

from .base import IGNORE_INDEX, SequenceDataset, TaskDataModule, distinct_integers, split_rng
from .checks import check, check_choice

TASKS = ("in_context_recall", "noisy_in_context_recall", "fuzzy_in_context_recall", "selective_copying",
         "compression", "memorization")
BASELINES = {  # MAD's baseline setting per task
    "in_context_recall": {"vocab_size": 16, "seq_len": 128, "num_train": 12_800},
    "noisy_in_context_recall": {"vocab_size": 32, "seq_len": 128, "num_train": 12_800},
    "fuzzy_in_context_recall": {"vocab_size": 16, "seq_len": 128, "num_train": 12_800},
    "selective_copying": {"vocab_size": 16, "seq_len": 256, "num_train": 12_800},
    "compression": {"vocab_size": 16, "seq_len": 32, "num_train": 12_800},
    "memorization": {"vocab_size": 256, "seq_len": 32, "num_train": 256},
}
TARGETS = {"in_context_recall": "next_token", "noisy_in_context_recall": "next_token",
           "fuzzy_in_context_recall": "next_token", "selective_copying": "positions", "compression": "compression",
           "memorization": "positions"}


def first_occurrence(codes: np.ndarray) -> np.ndarray:
    """codes [n, S] -> [n, S]: for each entry, the index of the first entry of its row with the same code."""
    n, S = codes.shape
    order = np.argsort(codes, axis=1, kind="stable")
    sorted_codes = np.take_along_axis(codes, order, axis=1)
    run_start = np.ones((n, S), dtype=bool)
    run_start[:, 1:] = sorted_codes[:, 1:] != sorted_codes[:, :-1]
    head = np.maximum.accumulate(np.where(run_start, np.arange(S), 0), axis=1)  # sorted index of the run's start
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.take_along_axis(order, head, axis=1), axis=1)
    return out


def in_context_recall(rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, train: bool,
                      noise_vocab_size: int = 0, frac_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """-> (input_ids [n, L−1], labels [n, L−1]); plain recall with frac_noise = 0, noisy recall otherwise."""
    S, ns = seq_len // 2, vocab_size - noise_vocab_size
    K = ns // 2
    keys = rng.integers(0, K, size=(n, S))
    noise = rng.random((n, S)) < frac_noise
    noise[np.arange(n), rng.integers(0, S - 1, size=n)] = False  # at least one real pair before the query
    noise[:, -1] = False  # the query slot
    codes = np.where(noise, K + np.arange(S), keys)  # a noise slot matches nothing
    first = first_occurrence(codes[:, :-1])
    values = np.take_along_axis(rng.integers(K, ns, size=(n, S - 1)), first, axis=1)
    is_first = (first == np.arange(S - 1)) & ~noise[:, :-1]
    query = np.where(is_first, rng.random((n, S - 1)), -1.0).argmax(axis=1)  # a random key already seen
    keys[:, -1] = keys[np.arange(n), query]
    values = np.concatenate([values, values[np.arange(n), query][:, None]], axis=1)

    seq = np.empty((n, 2 * S), dtype=np.int64)
    seq[:, 0::2], seq[:, 1::2] = keys, values
    if noise_vocab_size:
        pairs = seq.reshape(n, S, 2)  # a view of seq
        pairs[noise] = rng.integers(ns, vocab_size, size=(int(noise.sum()), 2))
    if train:
        return seq[:, :-1], seq[:, 1:]
    scored = np.zeros((n, 2 * S), dtype=bool)
    scored[:, 1::2] = ~noise & ~np.concatenate([is_first, np.zeros((n, 1), bool)], axis=1)
    labels = np.where(scored, seq, IGNORE_INDEX)
    return seq[:, :-1], labels[:, 1:]


def fuzzy_in_context_recall(rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, train: bool,
                            k_motif_size: int = 3, v_motif_size: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """-> (input_ids [n, L], labels [n, L]); see the module docstring."""
    pad, K = vocab_size - 1, (vocab_size - 1) // 2
    kmax, vmax, W = k_motif_size, v_motif_size, k_motif_size + v_motif_size
    M = (seq_len + 1) // 2  # enough slots to fill any sequence (a slot has >= 2 tokens)
    k_len = rng.integers(1, kmax + 1, size=(n, M)) if train else np.full((n, M), kmax)
    k_tok = distinct_integers(rng, n * M, kmax, 0, K).reshape(n, M, kmax)
    k_tok = np.where(np.arange(kmax) < k_len[..., None], k_tok, K)  # K marks "no token"
    codes = (k_tok * (K + 1) ** np.arange(kmax)).sum(-1)  # one code per key tuple (its length included)
    first = first_occurrence(codes)
    v_len = np.take_along_axis(rng.integers(1, vmax + 1, size=(n, M)), first, axis=1)
    v_tok = distinct_integers(rng, n * M, vmax, K, pad).reshape(n, M, vmax)
    v_tok = np.take_along_axis(v_tok, first[..., None], axis=1)

    # keep the slots that fit before room for the final query slot (at most W tokens) and one pad-free shift
    ends = np.cumsum(k_len + v_len, axis=1)
    valid = ends <= seq_len + 1 - W
    is_first = (first == np.arange(M)) & valid
    query = np.where(is_first, rng.random((n, M)), -1.0).argmax(axis=1)
    r = np.arange(n)
    k_tok = np.concatenate([k_tok, k_tok[r, query][:, None]], axis=1)
    v_tok = np.concatenate([v_tok, v_tok[r, query][:, None]], axis=1)
    k_len = np.concatenate([k_len, k_len[r, query][:, None]], axis=1)
    v_len = np.concatenate([v_len, v_len[r, query][:, None]], axis=1)
    valid = np.concatenate([valid, np.ones((n, 1), bool)], axis=1)
    repeated = np.concatenate([~is_first[:, :M], np.ones((n, 1), bool)], axis=1) & valid

    j = np.arange(W)  # position inside a slot: key tokens, then value tokens
    in_key = j < k_len[..., None]
    idx = np.where(in_key, j, kmax + j - k_len[..., None]).clip(0, W - 1)
    tokens = np.take_along_axis(np.concatenate([k_tok, v_tok], axis=2), idx, axis=2)
    used = (j < (k_len + v_len)[..., None]) & valid[..., None]
    scored = used & ~in_key & repeated[..., None]

    tokens, used, scored = tokens.reshape(n, -1), used.reshape(n, -1), scored.reshape(n, -1)
    offset = seq_len + 1 - used.sum(1)  # left padding
    pos = offset[:, None] + np.cumsum(used, axis=1) - 1
    seq = np.full((n, seq_len + 1), pad, dtype=np.int64)
    labels = np.full((n, seq_len + 1), IGNORE_INDEX, dtype=np.int64)
    rr = np.broadcast_to(r[:, None], used.shape)
    seq[rr[used], pos[used]] = tokens[used]
    labels[rr[scored], pos[scored]] = tokens[scored]
    if train:
        return seq[:, :-1], seq[:, 1:]
    return seq[:, :-1], labels[:, 1:]


def selective_copying(rng: np.random.Generator, n: int, vocab_size: int, seq_len: int,
                      num_tokens_to_copy: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (input_ids [n, L], labels [n, L])."""
    k, blank, copy = num_tokens_to_copy, vocab_size - 2, vocab_size - 1
    P = seq_len - k - 1  # positions before the copy token
    content = rng.integers(0, vocab_size - 2, size=(n, k))
    pos = np.sort(distinct_integers(rng, n, k, 0, P), axis=1)
    seq = np.full((n, seq_len), blank, dtype=np.int64)
    np.put_along_axis(seq, pos, content, axis=1)
    seq[:, P] = copy
    labels = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    labels[:, P + 1:] = content
    return seq, labels


def compression(rng: np.random.Generator, n: int, vocab_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (input_ids [n, L], labels [n, L] = input_ids)."""
    seq = np.concatenate([rng.integers(0, vocab_size - 1, size=(n, seq_len - 1)),
                          np.full((n, 1), vocab_size - 1)], axis=1)
    return seq, seq.copy()


def memorization_map(vocab_size: int, seed: int) -> np.ndarray:
    """The fixed map: kv_map[key] = value for keys 0 .. (V−1)//2 − 1, values a random injection into
    [(V−1)//2, V−1)."""
    K = (vocab_size - 1) // 2
    return np.random.default_rng(seed).permutation(np.arange(K, vocab_size - 1))[:K]


def memorization(rng: np.random.Generator, n: int, kv_map: np.ndarray, vocab_size: int,
                 seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (input_ids [n, L], labels [n, L]): "key insert" pairs, label = kv_map[key] at the insert position."""
    keys = rng.integers(0, len(kv_map), size=(n, seq_len // 2))
    seq = np.full((n, seq_len), vocab_size - 1, dtype=np.int64)
    seq[:, 0::2] = keys
    labels = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    labels[:, 1::2] = kv_map[keys]
    return seq, labels


class MADDataModule(TaskDataModule):
    """One MAD task in one setting. Batch: input_ids, labels [B, T], slice [B] (one slice: the setting).

    Attributes: vocab_size, seq_len, target ("next_token" | "positions" | "compression"), kv_map
    (memorization only). Metric: accuracy over labelled positions of the test set (1,280 sequences).
    """

    def __init__(self, task: str = "in_context_recall", vocab_size: int | None = None, seq_len: int | None = None,
                 num_train: int | None = None, num_val: int = 1280, num_test: int = 1280, frac_noise: float = 0.2,
                 noise_vocab_size: int = 16, num_tokens_to_copy: int = 16, k_motif_size: int = 3,
                 v_motif_size: int = 3, batch_size: int = 128, seed: int = 12345, num_workers: int = 0):
        """
        Args:
            task: in_context_recall | noisy_in_context_recall | fuzzy_in_context_recall | selective_copying |
                compression | memorization.
            vocab_size: None = the task's MAD baseline (BASELINES); includes the special and noise tokens.
            seq_len: None = the task's MAD baseline.
            num_train: training sequences; None = the task's MAD baseline (256 for memorization, else 12,800).
            num_val: validation sequences.
            num_test: test sequences (MAD: 1,280).
            frac_noise: noisy recall only: probability that a slot is noise.
            noise_vocab_size: noisy recall only: the top noise_vocab_size ids are noise tokens.
            num_tokens_to_copy: selective copying only.
            k_motif_size: fuzzy recall only: the most tokens of a key.
            v_motif_size: fuzzy recall only: the most tokens of a value.
            batch_size: sequences per batch.
            seed: MAD's 12345 by default; seeds the data, the memorization map and the training order.
            num_workers: DataLoader worker processes.
        """
        super().__init__(batch_size, seed, num_workers)
        check_choice("task", task, TASKS)
        base = BASELINES[task]
        V = base["vocab_size"] if vocab_size is None else vocab_size
        L = base["seq_len"] if seq_len is None else seq_len
        self.num_sequences = {"train": base["num_train"] if num_train is None else num_train, "val": num_val,
                              "test": num_test}
        for split, count in self.num_sequences.items():
            check(count >= 1, f"num_{split}", f"expected an int >= 1, got {count}")
        if task in ("in_context_recall", "noisy_in_context_recall", "memorization"):
            check(L % 2 == 0 and L >= 4, "seq_len", f"{task} needs an even seq_len >= 4, got {L}")
        noise = noise_vocab_size if task == "noisy_in_context_recall" else 0
        if task == "noisy_in_context_recall":
            check(0 <= frac_noise < 1, "frac_noise", f"expected a float in [0, 1), got {frac_noise}")
            check(noise >= 1, "noise_vocab_size", f"expected an int >= 1, got {noise}")
        if task in ("in_context_recall", "noisy_in_context_recall"):
            check(V - noise >= 2, "vocab_size", f"expected vocab_size >= noise tokens + 2 (a key and a value), got {V}")
        if task == "fuzzy_in_context_recall":
            check(k_motif_size >= 1 and v_motif_size >= 1, "k_motif_size", "expected motif sizes >= 1")
            check((V - 1) // 2 >= k_motif_size and V - 1 - (V - 1) // 2 >= v_motif_size, "vocab_size",
                  f"{V} leaves too few key/value tokens for motifs of {k_motif_size}/{v_motif_size} distinct tokens")
            check(L + 1 >= 2 * (k_motif_size + v_motif_size), "seq_len",
                  f"expected seq_len >= {2 * (k_motif_size + v_motif_size) - 1} for motifs of "
                  f"{k_motif_size}/{v_motif_size}, got {L}")
        if task == "selective_copying":
            check(num_tokens_to_copy >= 1 and L > 2 * num_tokens_to_copy + 1, "seq_len",
                  f"expected seq_len > 2·num_tokens_to_copy + 1 = {2 * num_tokens_to_copy + 1}, got {L}")
            check(V >= 3, "vocab_size", f"selective_copying needs vocab_size >= 3, got {V}")
        if task in ("compression", "memorization"):
            check(V >= 3 and L >= 2, "vocab_size", f"{task} needs vocab_size >= 3 and seq_len >= 2, got {V}, {L}")
        self.task, self.vocab_size, self.seq_len, self.target = task, V, L, TARGETS[task]
        self.frac_noise, self.noise_vocab_size = frac_noise, noise
        self.num_tokens_to_copy, self.k_motif_size, self.v_motif_size = num_tokens_to_copy, k_motif_size, v_motif_size
        self.kv_map = memorization_map(V, seed) if task == "memorization" else None
        self.slice_names = [f"{task}-V{V}-L{L}"]

    def generate(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split's (input_ids [n, T], labels [n, T])."""
        rng, n, V, L = split_rng(self.seed, split), self.num_sequences[split], self.vocab_size, self.seq_len
        train = split == "train"
        if self.task in ("in_context_recall", "noisy_in_context_recall"):
            frac = self.frac_noise if self.noise_vocab_size else 0.0
            return in_context_recall(rng, n, V, L, train, self.noise_vocab_size, frac)
        if self.task == "fuzzy_in_context_recall":
            return fuzzy_in_context_recall(rng, n, V, L, train, self.k_motif_size, self.v_motif_size)
        if self.task == "selective_copying":
            return selective_copying(rng, n, V, L, self.num_tokens_to_copy)
        if self.task == "compression":
            return compression(rng, n, V, L)
        return memorization(rng, n, self.kv_map, V, L)

    def build(self, split: str) -> SequenceDataset:
        x, y = self.generate(split)
        return SequenceDataset(x, y, {"slice": np.zeros(len(x), dtype=np.int64)})
