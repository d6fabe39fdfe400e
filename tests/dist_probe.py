"""A Lightning callback for the distributed tests: what each rank trained on, its losses, and rank 0's weights."""
import hashlib
import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


def row_ids(batch) -> list[str]:
    """A short content hash per sequence of a batch: the same sample has the same id on every rank and run."""
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in batch["input_ids"].cpu()]


class Probe(Callback):
    """Writes ``out/rank-<r>.json`` (per training step: sample ids and the rank's loss) and ``out/params.pt``."""

    def __init__(self, out: str):
        self.out, self.steps = Path(out), []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({"ids": row_ids(batch), "loss": float(outputs["loss"])})

    def on_train_end(self, trainer, pl_module):
        self.out.mkdir(parents=True, exist_ok=True)
        info = {"world_size": trainer.world_size, "steps": self.steps}
        (self.out / f"rank-{trainer.global_rank}.json").write_text(json.dumps(info))
        if trainer.global_rank == 0:
            torch.save({k: v.detach().cpu() for k, v in pl_module.state_dict().items()}, self.out / "params.pt")


class Fail(Callback):
    """Fails a run at its first training batch with the given message."""

    def __init__(self, message: str):
        self.message = message

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        raise RuntimeError(self.message)
