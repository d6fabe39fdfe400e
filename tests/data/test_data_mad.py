"""MAD: per task, the labels re-derived from the raw tokens with separate, simple code."""
import numpy as np
import pytest
import torch

from atlas_lab.data.mad import TASKS, MADDataModule


def data(task, split="test", **kw):
    dm = MADDataModule(task=task, num_train=64, num_val=16, num_test=200, **kw)
    dm.setup(None)
    ds = dm.datasets[split]
    return dm, np.asarray(ds.input_ids), np.asarray(ds.labels)


@pytest.mark.parametrize("task,noise", [("in_context_recall", 0), ("noisy_in_context_recall", 16)])
def test_in_context_recall(task, noise):
    dm, x, y = data(task)
    V, L = dm.vocab_size, dm.seq_len
    K, real = (V - noise) // 2, V - noise
    assert x.shape == y.shape == (200, L - 1)
    noise_slots = 0
    for row, lab in zip(x, y):
        seq = np.append(row, lab[-1])  # the last value is only a label
        seen = {}
        for s in range(L // 2):
            k, v = int(seq[2 * s]), int(seq[2 * s + 1])
            if k >= real:  # noise: two noise tokens, nothing scored
                assert v >= real and lab[2 * s] == -100
                noise_slots += 1
                continue
            assert k < K and K <= v < real
            assert (lab[2 * s] != -100) == (k in seen)  # scored iff the key was seen in an earlier pair
            if k in seen:
                assert lab[2 * s] == v == seen[k]  # the value of an already-seen key
            seen.setdefault(k, v)
        assert lab[-1] != -100  # the last slot queries a key seen before
        assert np.all(lab[1::2] == -100)  # only key positions are scored
    frac = noise_slots / (200 * (L // 2 - 1))
    assert (0.15 < frac < 0.25) if noise else frac == 0
    train = dm.datasets["train"]
    assert np.array_equal(np.asarray(train.labels)[:, :-1], np.asarray(train.input_ids)[:, 1:])  # next token everywhere


def test_fuzzy_in_context_recall():
    dm, x, y = data("fuzzy_in_context_recall")
    V, L = dm.vocab_size, dm.seq_len
    pad, K = V - 1, (V - 1) // 2
    assert x.shape == y.shape == (200, L)
    for row, lab in zip(x, y):
        seq = np.append(row, lab[-1])
        t = int(np.argmax(seq != pad))
        assert np.all(seq[:t] == pad) and np.all(seq[t:] != pad)
        runs = []  # [(is_key, start, tokens)]
        for i in range(t, len(seq)):
            is_key = seq[i] < K
            if not runs or runs[-1][0] != is_key:
                runs.append((is_key, i, []))
            runs[-1][2].append(int(seq[i]))
        assert runs[0][0] and len(runs) % 2 == 0  # key, value, key, value, ...
        seen, expected = {}, np.full(len(seq), -100)
        for (_, _, key), (_, start, value) in zip(runs[0::2], runs[1::2]):
            assert len(key) == 3 and 1 <= len(value) <= 3  # test keys have 3 tokens
            assert len(set(key)) == len(key) and len(set(value)) == len(value)
            if tuple(key) in seen:
                assert seen[tuple(key)] == value
                expected[start:start + len(value)] = value
            seen.setdefault(tuple(key), value)
        assert np.array_equal(lab, expected[1:])
        assert lab[-1] != -100  # the final key was seen before
    train_x = np.asarray(dm.datasets["train"].input_ids)
    key_lengths = set()
    for row in train_x:
        runs = np.flatnonzero(np.diff(np.r_[False, row < K, False].astype(int)) != 0).reshape(-1, 2)
        key_lengths |= set((runs[:, 1] - runs[:, 0]).tolist())
    assert key_lengths == {1, 2, 3}  # training keys have 1–3 tokens


def test_selective_copying():
    dm, x, y = data("selective_copying")
    V, L, n = dm.vocab_size, dm.seq_len, dm.num_tokens_to_copy
    blank, copy = V - 2, V - 1
    for row, lab in zip(x, y):
        (c,) = np.flatnonzero(row == copy)
        assert c == L - n - 1 and np.all(row[c + 1:] == blank)
        content = row[:c][row[:c] != blank]
        assert len(content) == n and content.max() < blank
        assert np.array_equal(lab[c + 1:], content) and np.all(lab[:c + 1] == -100)
    assert dm.target == "positions"
    assert len({tuple(np.flatnonzero(r[:L - n - 1] != blank)) for r in x}) == len(x)  # scattered differently


def test_compression():
    dm, x, y = data("compression")
    assert dm.target == "compression" and x.shape == (200, 32)
    assert np.all(x[:, -1] == dm.vocab_size - 1) and x[:, :-1].max() < dm.vocab_size - 1
    assert np.array_equal(x, y)


def test_memorization_map_is_shared():
    dm, x, y = data("memorization")
    train_x, train_y = np.asarray(dm.datasets["train"].input_ids), np.asarray(dm.datasets["train"].labels)
    V = dm.vocab_size
    learned = {}
    for xs, ys in ((train_x, train_y), (x, y)):
        assert np.all(xs[:, 1::2] == V - 1) and np.all(ys[:, 0::2] == -100)
        for k, v in zip(xs[:, 0::2].ravel().tolist(), ys[:, 1::2].ravel().tolist()):
            assert k < (V - 1) // 2 <= v < V - 1
            assert learned.setdefault(k, v) == v  # one map for train and test
    assert len(set(learned.values())) == len(learned)  # injective
    other = MADDataModule(task="memorization", seed=1)
    assert np.array_equal(MADDataModule(task="memorization").kv_map, dm.kv_map)
    assert not np.array_equal(other.kv_map, dm.kv_map)


def test_baselines_interface_and_determinism():
    expected = {"in_context_recall": (16, 127), "noisy_in_context_recall": (32, 127),
                "fuzzy_in_context_recall": (16, 128), "selective_copying": (16, 256), "compression": (16, 32),
                "memorization": (256, 32)}
    for task in TASKS:
        dm = MADDataModule(task=task, batch_size=32)
        assert dm.seed == 12345 and dm.num_sequences["test"] == 1280
        assert dm.num_sequences["train"] == (256 if task == "memorization" else 12_800)
        V, T = expected[task]
        assert dm.vocab_size == V
        for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
            batch = next(iter(loader))
            assert set(batch) == {"input_ids", "labels", "slice"}
            assert batch["input_ids"].shape == batch["labels"].shape == (32, T)
            assert batch["input_ids"].dtype == torch.long and int(batch["input_ids"].max()) < V
        assert len(dm.datasets["test"]) == 1280
    a = data("fuzzy_in_context_recall")[1]
    assert np.array_equal(a, data("fuzzy_in_context_recall")[1])
    assert not np.array_equal(a, data("fuzzy_in_context_recall", seed=1)[1])


@pytest.mark.parametrize("kw,name", [(dict(task="copying"), "task"),
                                     (dict(task="selective_copying", seq_len=20), "seq_len"),
                                     (dict(task="in_context_recall", seq_len=33), "seq_len"),
                                     (dict(task="noisy_in_context_recall", frac_noise=1.0), "frac_noise"),
                                     (dict(task="fuzzy_in_context_recall", vocab_size=6), "vocab_size")])
def test_bad_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        MADDataModule(**kw)
