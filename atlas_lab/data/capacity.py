"""Memory-capacity probe (docs/tasks.md §6): how many random key -> value pairs one memory can hold.

For each N: write N random pairs (unit-norm keys and values, d_k and d_v dims) with `memorize`, then read
the memory at every key. Writing and reading is one `memorize` call over 2N tokens: the first N tokens are
the pairs; on the last N tokens the memory is frozen (η = 0, θ = 0, α = 1, so W_t = W_{t−1} for every
optimiser) and queried with the N keys, so each read sees the memory after all N writes.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from atlas_lab.memory import MemoryConfig, memorize

from .base import IGNORE_INDEX, SequenceDataset, TaskDataModule, distinct_integers, split_rng
from .checks import check


PROBED = MemoryConfig(architecture="linear", chunk_size=1)  # the memory probed unless told otherwise: delta rule
GATES = ("eta", "theta", "alpha", "normalize_eta")  # the probe's own write gates (not memory options)


def probe_config(where: str = "capacity_probe", config: MemoryConfig | None = None, **changes) -> MemoryConfig:
    """The probed memory: ``config`` (default PROBED) with ``changes`` in MemoryConfig.replace's form, checked; a
    bad option is a ValueError starting with ``where``."""
    return (config or PROBED).replace(where, **changes)


def capacity_probe(n_pairs: list[int] = [4, 8, 16, 32, 64, 128, 256], d_k: int = 16, d_v: int = 16,
                   trials: int = 8, seed: int = 0, config: MemoryConfig | None = None, eta: float = 1.0,
                   theta: float = 0.0, alpha: float = 1.0, normalize_eta: bool = True,
                   dtype: torch.dtype = torch.float64, **changes) -> list[dict]:
    """Recall of N random pairs as N grows -> one row per N:

        {"n_pairs", "recall_error" (mean ‖M(k_i) − v_i‖², values have norm 1), "cosine" (mean cos(M(k_i), v_i)),
         "retrieval_acc" (fraction of i whose read-out is closest, by dot product, to v_i among the N values),
         "feature_dim" (D, the width the memory reads keys at), "state_floats" (the memory's state after the call,
         counted tensor by tensor per head: weights, optimiser state, the Omega window's keys, values and γ), and
         the memory's fields}

    trials: independent draws per N (the batch dimension); the metrics are means over pairs and trials.
    config: the memory (default PROBED: a linear memory, chunk 1), with ``changes`` in MemoryConfig.replace's form
    (e.g. architecture={"name": "mlp", "expansion": 2}, feature_map="polynomial", window=4). Its gates are the
    probe's: eta (inner learning rate), theta (momentum), alpha (retention) while writing, γ = 1.
    normalize_eta: write with η / ‖φ(k_t)‖² (for a linear memory with the l2 bias, the normalised delta
    rule: each write stores its pair exactly; it keeps wide feature maps stable, so maps compare fairly).
    """
    check(len(n_pairs) > 0 and min(n_pairs) >= 1, "n_pairs", f"expected a non-empty list of ints >= 1, got {n_pairs}")
    check(d_k >= 1 and d_v >= 1 and trials >= 1, "d_k", f"expected d_k, d_v, trials >= 1, got {d_k}, {d_v}, {trials}")
    config = probe_config("capacity_probe", config, **changes)
    fmap = config.components("capacity_probe")[1]
    g = torch.Generator().manual_seed(seed)
    rows = []
    for N in n_pairs:
        k = torch.nn.functional.normalize(torch.randn(trials, N, 1, d_k, generator=g, dtype=dtype), dim=-1)
        v = torch.nn.functional.normalize(torch.randn(trials, N, 1, d_v, generator=g, dtype=dtype), dim=-1)
        q = torch.cat([k, k], 1)  # queries of the write tokens are not used
        writing = torch.cat([torch.ones(N), torch.zeros(N)]).to(dtype).view(1, 2 * N, 1).expand(trials, 2 * N, 1)

        def gate(value, frozen):
            return value * writing + frozen * (1 - writing)

        step = eta / (fmap(q) ** 2).sum(-1) if normalize_eta else eta  # [trials, 2N, 1]
        o, state = memorize(q, q, torch.cat([v, torch.zeros_like(v)], 1), config,
                            gamma=1.0,
                            gates={"eta": gate(step, 0.0), "theta": gate(theta, 0.0), "alpha": gate(alpha, 1.0)})
        carried = [*state.weights.values(), *(state.optimizer_state or {}).values(), state.keys, state.values,
                   state.gamma]
        read, v = o[:, N:, 0], v[:, :, 0]  # [trials, N, d_v]
        scores = read @ v.transpose(1, 2)  # [trials, N, N]
        rows.append({
            "n_pairs": N,
            "recall_error": ((read - v) ** 2).sum(-1).mean().item(),
            "cosine": torch.nn.functional.cosine_similarity(read, v, dim=-1).mean().item(),
            "retrieval_acc": (scores.argmax(-1) == torch.arange(N)).to(dtype).mean().item(),
            "feature_dim": fmap.dim(d_k),
            "state_floats": sum(t.numel() for t in carried) // trials,  # one head of one sequence
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)},
            "eta": eta, "normalize_eta": normalize_eta, "theta": theta, "alpha": alpha, "d_k": d_k, "d_v": d_v,
        })
    return rows


def recall_sequences(rng: np.random.Generator, n: int, N: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of length 4N: k_1 v_1 … k_N v_N, then every key once more in random order, each followed by
    its value. Labels: at each repeated key, its value (−100 elsewhere). Keys from [1, V/2), values [V/2, V)."""
    keys = distinct_integers(rng, n, N, 1, V // 2)
    values = distinct_integers(rng, n, N, V // 2, V)
    order = rng.permuted(np.broadcast_to(np.arange(N), (n, N)), axis=1)
    x = np.empty((n, 4 * N), dtype=np.int64)
    x[:, 0:2 * N:2], x[:, 1:2 * N:2] = keys, values
    x[:, 2 * N::2] = np.take_along_axis(keys, order, 1)
    x[:, 2 * N + 1::2] = np.take_along_axis(values, order, 1)
    labels = np.full_like(x, IGNORE_INDEX)
    labels[:, 2 * N::2] = x[:, 2 * N + 1::2]
    return x, labels


class CapacityDataModule(TaskDataModule):
    """In-context capacity of a whole model (the trained counterpart of ``capacity_probe``): read N random
    key→value pairs, then recall every one of them; accuracy per N is reported per slice ("N16", …).

    Every N in ``n_pairs`` appears in every split (one N per batch); the largest N shows where a model's
    state runs out. vocab_size V must exceed 2·max(n_pairs) + 2 (distinct keys and values).
    """

    def __init__(self, vocab_size: int = 512, n_pairs: list[int] = [4, 8, 16, 32, 64], train_size: int = 2000,
                 eval_size: int = 200, batch_size: int = 32, seed: int = 0, num_workers: int = 0):
        super().__init__(batch_size, seed, num_workers)
        check(len(n_pairs) > 0 and min(n_pairs) >= 1, "n_pairs",
              f"expected a non-empty list of ints >= 1, got {n_pairs}")
        check(vocab_size // 2 - 1 >= max(n_pairs), "vocab_size",
              f"expected vocab_size >= 2·max(n_pairs) + 2 = {2 * max(n_pairs) + 2}, got {vocab_size}")
        check(train_size >= 1 and eval_size >= 1, "train_size", f"expected sizes >= 1, got {train_size}, {eval_size}")
        self.vocab_size, self.n_pairs = vocab_size, list(n_pairs)
        self.sizes = {"train": train_size, "val": eval_size, "test": eval_size}
        self.slice_names = [f"N{N}" for N in self.n_pairs]

    def build(self, split: str) -> SequenceDataset:
        inputs, labels, slices = [], [], []
        for i, N in enumerate(self.n_pairs):
            x, y = recall_sequences(split_rng(self.seed, split, i), self.sizes[split], N, self.vocab_size)
            inputs += list(x)
            labels += list(y)
            slices.append(np.full(len(x), i))
        slices = np.concatenate(slices)
        return SequenceDataset(inputs, labels, {"slice": slices}, group=slices)
