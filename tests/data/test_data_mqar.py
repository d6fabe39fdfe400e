"""MQAR: labels re-derived from the raw sequences, determinism, vectorised generation, and the DataModule interface."""
import numpy as np
import pytest
import torch

from atlas_lab.data.base import GroupedBatchSampler, distinct_integers
from atlas_lab.data.mqar import MQARDataModule, multiquery_ar


def check_mqar_rows(x, y, N, V):
    """Independent check of every row: the k-v prefix, the queries and the −100 elsewhere."""
    for row, lab in zip(x, y):
        keys, values = row[0:2 * N:2], row[1:2 * N:2]
        assert len(set(keys.tolist())) == N and len(set(values.tolist())) == N
        assert keys.min() >= 1 and keys.max() < V // 2 and values.min() >= V // 2 and values.max() < V
        pairs = dict(zip(keys.tolist(), values.tolist()))
        labelled = np.flatnonzero(lab != -100)
        assert len(labelled) == N
        assert labelled.min() >= 2 * N and np.all((labelled - 2 * N) % 2 == 0)
        for t in labelled:  # the key at t appeared earlier, paired with the label
            assert pairs[int(row[t])] == lab[t]
        assert sorted(row[labelled].tolist()) == sorted(keys.tolist())  # every key queried exactly once
        assert np.all(lab[lab != -100] >= V // 2)


@pytest.mark.parametrize("L,N,V", [(64, 4, 8192), (128, 32, 8192), (256, 64, 300), (1024, 256, 8192), (16, 4, 20)])
def test_labels_follow_from_the_sequence(L, N, V):
    x, y = multiquery_ar(np.random.default_rng(1), 50, L, N, V)
    assert x.shape == y.shape == (50, L)
    assert x.min() >= 0 and x.max() < V
    check_mqar_rows(x, y, N, V)


def test_query_gaps_follow_the_power_law():
    """Gaps match Zoology's np.random.choice(space, N, replace=False, p ∝ (g+1)^(a−1)), gap by gap."""
    L, N, n, a = 1024, 16, 2000, 0.01
    x, y = multiquery_ar(np.random.default_rng(0), n, L, N, 8192, power_a=a)
    space = (L - 2 * N) // 2
    counts = np.bincount((np.nonzero(y != -100)[1] - 2 * N) // 2, minlength=space)
    p = np.arange(1, space + 1) ** (a - 1.0)
    rng = np.random.default_rng(1)
    ref = np.bincount(np.concatenate([rng.choice(space, N, replace=False, p=p / p.sum()) for _ in range(n)]),
                      minlength=space)
    assert np.abs(counts[:16] - ref[:16]).max() < 120  # binomial sd <= 23 each
    assert abs(counts[64:].sum() - ref[64:].sum()) < 0.1 * ref[64:].sum()


def test_distinct_integers_both_branches_are_uniform_and_distinct():
    rng = np.random.default_rng(0)
    for n, k, low, high in [(4000, 3, 10, 20), (4000, 8, 0, 10)]:  # rejection branch, shuffle branch
        x = distinct_integers(rng, n, k, low, high)
        assert x.shape == (n, k) and x.min() >= low and x.max() < high
        assert all(len(set(r)) == k for r in x.tolist())
        for col in (0, k - 1):  # each position uniform over the range
            freq = np.bincount(x[:, col] - low, minlength=high - low) / n
            assert np.abs(freq - 1 / (high - low)).max() < 0.03


def test_determinism_and_seeds():
    a = multiquery_ar(np.random.default_rng(5), 20, 64, 4, 8192)
    b = multiquery_ar(np.random.default_rng(5), 20, 64, 4, 8192)
    c = multiquery_ar(np.random.default_rng(6), 20, 64, 4, 8192)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not np.array_equal(a[0], c[0])


class CountingRNG:
    """A numpy Generator that counts the calls made to it."""

    def __init__(self, seed):
        self.rng, self.calls = np.random.default_rng(seed), 0

    def __getattr__(self, name):
        method = getattr(self.rng, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)
        return counted


def test_generator_is_vectorised():
    """A few RNG calls per batch of sequences, not one or more per sequence (no Python loop over n)."""
    rng = CountingRNG(0)
    x, y = multiquery_ar(rng, 2000, 1024, 256, 8192)
    assert x.shape == y.shape == (2000, 1024)
    assert rng.calls < 40, rng.calls


def small_module(seed=0, **kw):
    return MQARDataModule(vocab_size=512, train_slices=[(64, 4, 96), (128, 16, 40)],
                          test_slices=[(64, 8, 20), (256, 64, 12)], batch_size=16, seed=seed, **kw)


def test_datamodule_interface():
    dm = small_module()
    assert dm.vocab_size == 512  # before setup
    assert dm.slice_names == ["L64-N4", "L128-N16", "L64-N8", "L256-N64"]
    dm.setup("fit")
    dm.setup("test")
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        n = 0
        for batch in loader:
            assert set(batch) == {"input_ids", "labels", "slice"}
            assert batch["input_ids"].dtype == batch["labels"].dtype == batch["slice"].dtype == torch.long
            assert len(set(batch["slice"].tolist())) == 1  # one (L, N) slice per batch
            L, N = (int(v) for v in dm.slice_names[batch["slice"][0]][1:].split("-N"))
            assert batch["input_ids"].shape[1] == L
            check_mqar_rows(batch["input_ids"].numpy(), batch["labels"].numpy(), N, 512)
            n += len(batch["input_ids"])
        assert n == len(loader.dataset)
    assert len(dm.datasets["train"]) == 136 and len(dm.datasets["test"]) == 32 and len(dm.datasets["val"]) == 32


def rows(dm, split):
    return {tuple(np.asarray(x).tolist()) for x in dm.datasets[split].input_ids}


def test_splits_are_deterministic_and_disjoint():
    a, b, c = small_module(), small_module(), small_module(seed=1)
    for dm in (a, b, c):
        dm.setup(None)
    assert rows(a, "train") == rows(b, "train") and rows(a, "test") == rows(b, "test")
    assert rows(a, "train") != rows(c, "train")
    assert not rows(a, "val") & rows(a, "test")  # same slices, independent streams
    assert not rows(a, "train") & rows(a, "test")
    order = [batch["input_ids"][0, :8].tolist() for batch in a.train_dataloader()]
    assert order == [batch["input_ids"][0, :8].tolist() for batch in b.train_dataloader()]


@pytest.mark.parametrize("kw,name", [
    (dict(train_slices=[(64, 17, 10)]), "train_slices"),  # 4N > L
    (dict(test_slices=[(63, 4, 10)]), "test_slices"),  # odd L
    (dict(vocab_size=64), "vocab_size"),  # V <= L
    (dict(power_a=0.0), "power_a"),
])
def test_bad_arguments(kw, name):
    args = dict(vocab_size=512, train_slices=[(64, 4, 10)], test_slices=[(64, 4, 10)])
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        MQARDataModule(**args)


def test_grouped_batches_cover_every_sequence_once_and_reshuffle():
    group = np.repeat([0, 1, 2], [40, 33, 7])
    sampler = GroupedBatchSampler(group, batch_size=8, shuffle=True, seed=0)
    epochs = [list(sampler)]
    sampler.set_epoch(1)  # Lightning calls set_epoch before every epoch
    epochs.append(list(sampler))
    for batches in epochs:
        assert len(batches) == len(sampler) == 5 + 5 + 1
        assert sorted(i for b in batches for i in b) == list(range(80))
        assert all(len(set(group[b])) == 1 for b in batches)  # one group per batch
    assert epochs[0] != epochs[1]  # a new order every epoch
    assert [group[b[0]] for b in epochs[0]] != sorted(group[b[0]] for b in epochs[0])  # groups interleaved
    assert list(GroupedBatchSampler(group, 8, True, seed=0)) == epochs[0]  # reproducible from the seed
    resumed = GroupedBatchSampler(group, 8, True, seed=0)
    resumed.set_epoch(1)
    assert list(resumed) == epochs[1]  # and from (seed, epoch): a resumed run sees the same batches
    fixed = list(GroupedBatchSampler(group, 8, shuffle=False, seed=0))
    assert [i for b in fixed for i in b] == list(range(80))
