"""MQAR: multi-query associative recall (Zoology, Arora et al. 2023; docs/tasks.md §2)."""
from __future__ import annotations

import numpy as np

from .base import IGNORE_INDEX, SPLITS, SequenceDataset, TaskDataModule, distinct_integers, split_rng
from .checks import check


def multiquery_ar(rng: np.random.Generator, n: int, seq_len: int, num_kv_pairs: int, vocab_size: int,
                  power_a: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """n MQAR sequences -> (input_ids [n, L], labels [n, L]), L = seq_len, N = num_kv_pairs, V = vocab_size.

    input_ids starts with k1 v1 … kN vN (keys distinct from [1, V/2), values distinct from [V/2, V)); in the
    remaining L − 2N positions key i is queried once at offset 2·gap_i, gaps drawn without replacement with
    p(g) ∝ (g+1)^(a−1) (Gumbel top-N); every other position is a uniform random token from [0, V).
    labels[query position of key i] = v_i; −100 elsewhere.
    """
    L, N, V = seq_len, num_kv_pairs, vocab_size
    keys = distinct_integers(rng, n, N, 1, V // 2)
    values = distinct_integers(rng, n, N, V // 2, V)
    space = (L - 2 * N) // 2
    logp = (power_a - 1) * np.log(np.arange(1, space + 1))  # log of (g+1)^(a−1), g = 0 .. space−1
    scores = logp + rng.gumbel(size=(n, space))
    gaps = np.argpartition(-scores, N - 1, axis=1)[:, :N]  # the N largest: weighted sampling without replacement
    query_pos = 2 * N + 2 * gaps

    input_ids = rng.integers(0, V, size=(n, L))
    input_ids[:, 0:2 * N:2], input_ids[:, 1:2 * N:2] = keys, values
    np.put_along_axis(input_ids, query_pos, keys, axis=1)
    labels = np.full((n, L), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, query_pos, values, axis=1)
    return input_ids, labels


def check_slices(name: str, slices: list, vocab_size: int) -> None:
    check(len(slices) > 0, name, "expected at least one (L, N, count) slice")
    for s in slices:
        check(len(s) == 3, name, f"expected (L, N, count) triples, got {s!r}")
        L, N, count = s
        check(L % 2 == 0 and N >= 1 and 4 * N <= L, name, f"slice {tuple(s)}: expected an even L with 1 <= N and "
              f"4N <= L")
        check(vocab_size > L, "vocab_size", f"expected vocab_size > L for every slice; {vocab_size} <= L={L} in {name}")
        check(count >= 1, name, f"slice {tuple(s)}: expected count >= 1")


class MQARDataModule(TaskDataModule):
    """MQAR with one (L, N) slice per batch; slice_names "L64-N4", …; batch: input_ids, labels [B, L], slice [B].

    Accuracy = exact next-value prediction at the labelled (query) positions, per slice and overall.
    """

    def __init__(self, vocab_size: int = 8192,
                 train_slices: list[tuple[int, int, int]] = [(64, 4, 10_000), (128, 8, 2_000), (256, 16, 2_000),
                                                             (256, 32, 2_000), (256, 64, 2_000)],
                 test_slices: list[tuple[int, int, int]] = [(64, 4, 500), (64, 8, 500), (64, 16, 500), (128, 32, 500),
                                                            (256, 64, 500), (512, 128, 500), (1024, 256, 500)],
                 val_slices: list[tuple[int, int, int]] | None = None, power_a: float = 0.01,
                 batch_size: int = 64, seed: int = 0, num_workers: int = 0):
        """
        Args:
            vocab_size: V (standard 8192); keys from [1, V/2), values from [V/2, V). Needs V > L.
            train_slices: (L, N, count) triples: sequence length, key-value pairs, number of sequences. The
                default is the standard (L, N) with counts cut for CPU (docs/tasks.md §2 gives the standard counts).
            test_slices: (L, N, count) triples of the test set (the standard (L, N), counts cut likewise).
            val_slices: (L, N, count) triples of the validation set; None = test_slices (another random stream).
            power_a: a of the query-gap power law p(g) ∝ (g+1)^(a−1).
            batch_size: sequences per batch.
            seed: seeds the data (every split) and the training order.
            num_workers: DataLoader worker processes.
        """
        super().__init__(batch_size, seed, num_workers)
        check(vocab_size >= 4, "vocab_size", f"expected an int >= 4, got {vocab_size}")
        check(power_a > 0, "power_a", f"expected a float > 0, got {power_a}")
        for name, slices in (("train_slices", train_slices), ("test_slices", test_slices), ("val_slices", val_slices)):
            if slices is not None:
                check_slices(name, slices, vocab_size)
        self.slices = {"train": [tuple(s) for s in train_slices], "test": [tuple(s) for s in test_slices]}
        self.slices["val"] = [tuple(s) for s in val_slices] if val_slices is not None else self.slices["test"]
        self.vocab_size, self.power_a = vocab_size, power_a
        names = [f"L{L}-N{N}" for split in SPLITS for L, N, _ in self.slices[split]]
        self.slice_names = list(dict.fromkeys(names))

    def build(self, split: str) -> SequenceDataset:
        inputs, labels, slice_ids = [], [], []
        for i, (L, N, count) in enumerate(self.slices[split]):
            x, y = multiquery_ar(split_rng(self.seed, split, i), count, L, N, self.vocab_size, self.power_a)
            inputs += list(x.astype(np.int32))
            labels += list(y)
            slice_ids.append(np.full(count, self.slice_names.index(f"L{L}-N{N}")))
        slice_ids = np.concatenate(slice_ids)
        return SequenceDataset(inputs, labels, {"slice": slice_ids}, group=slice_ids)
