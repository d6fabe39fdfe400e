"""torchmetrics for sequence tasks: token loss/accuracy, per-slice accuracy, exact match."""
from __future__ import annotations

import math
import re

import torch
from torchmetrics import Metric


def metric_key(name: str) -> str:
    """A name MLflow accepts as a metric key (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


class TokenMetrics(Metric):
    """Sums over labelled positions: loss (nats), correct argmax predictions, labelled tokens.

    compute() -> {"loss", "ppl", "acc"} and, given bytes_per_token, "bpb" = loss / ln 2 / bytes_per_token.
    """

    full_state_update = False

    def __init__(self, bytes_per_token: float | None = None):
        super().__init__()
        self.bytes_per_token = bytes_per_token
        for name in ("loss_sum", "correct", "count"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor):
        mask = labels != -100
        target = labels[mask]
        picked = logits[mask].float()
        self.loss_sum += torch.nn.functional.cross_entropy(picked, target, reduction="sum").double()
        self.correct += (picked.argmax(-1) == target).sum()
        self.count += mask.sum()

    def compute(self) -> dict:
        loss = self.loss_sum / self.count.clamp_min(1)
        out = {"loss": loss, "ppl": loss.exp(), "acc": self.correct / self.count.clamp_min(1)}
        if self.bytes_per_token:
            out["bpb"] = loss / math.log(2) / self.bytes_per_token
        return {k: v.float() for k, v in out.items()}


class SliceAccuracy(Metric):
    """Accuracy over labelled positions, separately for each slice of the data (e.g. MQAR (L, N))."""

    full_state_update = False

    def __init__(self, n_slices: int):
        super().__init__()
        self.add_state("correct", default=torch.zeros(n_slices, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(n_slices, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor, slices: torch.Tensor):
        mask = labels != -100
        hit = ((logits.argmax(-1) == labels) & mask).sum(1).double()
        self.correct.index_add_(0, slices, hit)
        self.count.index_add_(0, slices, mask.sum(1).double())

    def compute(self) -> torch.Tensor:
        return (self.correct / self.count.clamp_min(1)).float()


def exact_matches(generated, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Greedy continuations of a batch's prompts ([B, A] or B sequences, A >= answer_length) -> BoolTensor [B]:
    whether the first answer_length[b] generated tokens are the answer, input_ids[b, answer_start[b]:][:length]."""
    return torch.tensor([torch.equal(g[:n], ids[s:s + n]) for g, ids, s, n in
                         zip(generated, batch["input_ids"], batch["answer_start"].tolist(),
                             batch["answer_length"].tolist())], dtype=torch.bool)


class ExactMatch(Metric):
    """Fraction of examples whose greedily generated answer equals the reference answer exactly (exact_matches)."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("hits", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, generated, batch: dict[str, torch.Tensor]):
        hits = exact_matches(generated, batch)
        self.hits += float(hits.sum())
        self.total += len(hits)

    def compute(self) -> torch.Tensor:
        return (self.hits / self.total.clamp_min(1)).float()
