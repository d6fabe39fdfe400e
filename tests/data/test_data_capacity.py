"""Capacity probe: recall measured through `memorize` equals closed-form memories, and behaves as claimed."""
import pytest
import torch

from atlas_lab.data import capacity
from atlas_lab.data.capacity import capacity_probe
from atlas_lab.memory import memorize


def draws(N, d, trials, seed):
    """The probe's random pairs, drawn the same way: [trials, N, d] keys and values."""
    g = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(trials, N, 1, d, generator=g, dtype=torch.float64), dim=-1)
    v = torch.nn.functional.normalize(torch.randn(trials, N, 1, d, generator=g, dtype=torch.float64), dim=-1)
    return k[:, :, 0], v[:, :, 0]


def recall_error(W, k, v):
    return ((torch.einsum("bij,bnj->bni", W, k) - v) ** 2).sum(-1).mean().item()


def test_linear_l2_is_the_delta_rule():
    N, d, trials = 12, 8, 3
    k, v = draws(N, d, trials, seed=0)
    W = torch.zeros(trials, d, d, dtype=torch.float64)
    for i in range(N):  # W ← W − η (W k − v) kᵀ, η = 0.7
        err = torch.einsum("bij,bj->bi", W, k[:, i]) - v[:, i]
        W = W - 0.7 * torch.einsum("bi,bj->bij", err, k[:, i])
    (row,) = capacity_probe([N], d_k=d, d_v=d, trials=trials, seed=0, eta=0.7, normalize_eta=False)
    assert row["recall_error"] == pytest.approx(recall_error(W, k, v), rel=1e-9)
    assert row["n_pairs"] == N and row["feature_dim"] == d and row["architecture"] == "linear"


def test_linear_dot_is_hebbian():
    N, d, trials = 20, 8, 2
    k, v = draws(N, d, trials, seed=3)
    W = torch.einsum("bni,bnj->bij", v, k)  # Σ v kᵀ
    (row,) = capacity_probe([N], d_k=d, d_v=d, trials=trials, seed=3, attentional_bias="dot", normalize_eta=False)
    assert row["recall_error"] == pytest.approx(recall_error(W, k, v), rel=1e-9)
    reads = torch.einsum("bij,bnj->bni", W, k)
    acc = ((reads @ v.transpose(1, 2)).argmax(-1) == torch.arange(N)).double().mean().item()
    assert row["retrieval_acc"] == pytest.approx(acc)


def test_recall_degrades_with_load_and_improves_with_feature_dim():
    rows = capacity_probe([2, 8, 32], d_k=6, d_v=6, trials=16)
    errors = [r["recall_error"] for r in rows]
    assert errors[0] < errors[1] < errors[2]
    (poly,) = capacity_probe([32], d_k=6, d_v=6, trials=16, feature_map={"name": "polynomial", "degree": 2})
    assert poly["feature_dim"] == 28 and poly["recall_error"] < 0.8 * errors[2]


def test_the_memory_reaches_memorize(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3])
        return memorize(*args, **kwargs)

    monkeypatch.setattr(capacity, "memorize", spy)
    mlp = {"name": "mlp", "depth": 2, "expansion": 2}
    (row,) = capacity_probe([8], d_k=4, d_v=4, trials=2, architecture=mlp, eta=0.1, chunk_size=4)
    (config,) = calls
    assert (config.architecture, config.chunk_size) == (mlp, 4)
    assert row["architecture"] == mlp and row["chunk_size"] == 4 and torch.isfinite(torch.tensor(row["recall_error"]))
    with pytest.raises(ValueError, match="capacity_probe.optimizer: unknown optimizer 'adamw'"):
        capacity_probe([8], optimizer="adamw")
    with pytest.raises(ValueError, match="n_pairs"):
        capacity_probe([])


def test_capacity_datamodule_labels_recall_every_pair():
    """Independent check: each labelled position holds a key seen in the first half, labelled with its value."""
    from atlas_lab.data import CapacityDataModule

    dm = CapacityDataModule(vocab_size=64, n_pairs=[3, 7], train_size=20, eval_size=5, batch_size=4, seed=1)
    dm.setup("fit")
    seen_slices = set()
    for batch in dm.train_dataloader():
        for x, y, s in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), batch["slice"].tolist()):
            N = dm.n_pairs[s]
            seen_slices.add(s)
            assert len(x) == 4 * N
            pairs = dict(zip(x[0:2 * N:2], x[1:2 * N:2]))
            assert len(pairs) == N and all(1 <= k < 32 for k in pairs) and all(32 <= v < 64 for v in pairs.values())
            labelled = [(t, y[t]) for t in range(len(y)) if y[t] != -100]
            assert len(labelled) == N and sorted(x[t] for t, _ in labelled) == sorted(pairs)
            assert all(pairs[x[t]] == value and t >= 2 * N for t, value in labelled)
    assert seen_slices == {0, 1}
    again = CapacityDataModule(vocab_size=64, n_pairs=[3, 7], train_size=20, eval_size=5, batch_size=4, seed=1)
    again.setup("fit")
    assert [a.tolist() for a in again.datasets["val"].input_ids] == [a.tolist() for a in dm.datasets["val"].input_ids]
