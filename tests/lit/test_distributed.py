"""One trial on several processes: Lightning's DDP launcher and ddp_spawn on CPU (gloo), sharded samplers.

The equivalence tests compare 2 processes of per-rank batch b with 1 process of batch 2b, step by step. The
ranks' batches of a step are the halves of the single process's batch; DDP averages the ranks' gradients,
which equals the gradient of the mean loss over 2b sequences because every sequence has the same number of
labelled tokens (MQAR and LM windows). Only the order of float32 additions differs (the all-reduce sums two
half-batch gradients), so losses and weights agree to float32 rounding amplified by a few AdamW steps:
relative 1e-4 on the losses, absolute 1e-4 on the weights (they move by ~1e-3 per step at lr 3e-3).
"""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import DistributedSampler

from atlas_lab.data.base import GroupedBatchSampler
from atlas_lab.lit.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def shards(group, batch_size, world, shuffle=True, epoch=0):
    out = []
    for rank in range(world):
        s = GroupedBatchSampler(group, batch_size, shuffle, seed=3,
                                sampler=DistributedSampler(range(len(group)), num_replicas=world, rank=rank))
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_grouped_batches_split_the_global_batches_among_ranks(world):
    group = np.repeat([0, 1, 2], [48, 30, 7])
    (single,) = shards(group, 4 * world, 1, epoch=1)
    ranks = shards(group, 4, world, epoch=1)
    assert all(len(r) == len(single) for r in ranks)  # DDP needs the same number of steps on every rank
    for step, whole in enumerate(single):
        parts = [r[step] for r in ranks]
        assert all(len(set(group[p])) == 1 for p in parts)  # grouping by length kept
        if len(whole) >= world:
            assert sorted(i for p in parts for i in p) == sorted(whole)  # the ranks' batches are its halves
            assert sum(len(p) for p in parts) == len(set(i for p in parts for i in p))  # disjoint
    assert sorted({i for r in ranks for b in r for i in b}) == list(range(len(group)))  # every sample seen
    assert shards(group, 4, world, epoch=1) == ranks and shards(group, 4, world, epoch=2) != ranks


def task_modules(cache):
    from atlas_lab.data import (BABILongDataModule, CapacityDataModule, LMDataModule, MADDataModule, MQARDataModule,
                                NIAHDataModule)
    return {
        "mqar": lambda: MQARDataModule(vocab_size=64, train_slices=[(16, 2, 40), (32, 4, 24)],
                                       test_slices=[(16, 2, 8)], batch_size=4),
        "lm": lambda: LMDataModule(seq_len=64, batch_size=4, cache_dir=cache),
        "niah": lambda: NIAHDataModule(lengths=[384], train_lengths=[384, 512], train_size=12, eval_size=4,
                                       batch_size=2, cache_dir=cache),
        "babilong": lambda: BABILongDataModule(lengths=[0], train_lengths=[0], train_size=24, eval_size=4,
                                               batch_size=4, cache_dir=cache),
        "mad": lambda: MADDataModule(task="in_context_recall", num_train=40, num_val=8, num_test=8, batch_size=4),
        "capacity": lambda: CapacityDataModule(vocab_size=64, n_pairs=[3, 7], train_size=20, eval_size=5,
                                               batch_size=4),
    }


@pytest.mark.parametrize("task", ["mqar", "lm", "niah", "babilong", "mad", "capacity"])
def test_every_task_shards_its_training_batches(task, tmp_path_factory):
    """Each task's train loader on rank r of 2 (as a Trainer attaches it) serves rank r's halves of the global
    batches: disjoint across ranks, one group each, the same count on both ranks, together every sample."""
    make = task_modules(str(tmp_path_factory.getbasetemp() / "atlas_cache"))[task]
    loaders = []
    for rank in range(2):
        dm = make()
        dm.trainer = types.SimpleNamespace(world_size=2, global_rank=rank)  # what the DataModule reads of its Trainer
        loaders.append(list(dm.train_dataloader().batch_sampler))
    assert len(loaders[0]) == len(loaders[1]) > 0
    n = len(dm.datasets["train"])
    assert {i for r in loaders for b in r for i in b} == set(range(n))
    for a, b in zip(*loaders):
        assert not set(a) & set(b) or a == b and len(a) == 1  # a one-sample tail batch is repeated, as padding
    group = dm.datasets["train"].group
    if group is not None:
        assert all(len(set(np.asarray(group)[b])) == 1 for r in loaders for b in r)


CHECKPOINT = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
              "init_args": {"dirpath": "runs/checkpoints", "save_last": True}}


def fit_args(task, out, batch_size, *extra, checkpoint=False):
    data = {"mqar": ["-c", "experiments/mqar.yaml", "--data.init_args.train_slices=[[16, 2, 128]]",
                     "--data.init_args.test_slices=[[16, 2, 16]]", "--model.memory_heads=2"],
            "lm": ["-c", "experiments/lm.yaml", "--data.init_args.seq_len=32", "--model.memory_heads=2",
                   "--model.eval_piece=0", "--trainer.limit_val_batches=1"]}[task]
    probe = json.dumps([{"class_path": "dist_probe.Probe", "init_args": {"out": str(out)}}]
                       + [CHECKPOINT] * checkpoint)
    return ["fit", "-c", "lightning_config.yaml", *data, "--model.preset=gla", "--model.d_model=16",
            "--model.n_layers=1", "--model.n_heads=2", "--model.warmup_steps=2", "--model.lr=3e-3",
            f"--data.init_args.batch_size={batch_size}", f"--trainer.max_steps={STEPS}", "--trainer.max_epochs=1",
            "--trainer.log_every_n_steps=1",
            "--trainer.val_check_interval=null", "--trainer.limit_val_batches=1", "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.callbacks={probe}", *extra]


# ddp_spawn starts both ranks anew (three processes importing Lightning): ~2 minutes on 2 cores, so slow
@pytest.mark.parametrize("task,strategy", [("mqar", "ddp"), pytest.param("lm", "ddp_spawn", marks=pytest.mark.slow)])
def test_two_processes_train_like_one_with_the_global_batch(workdir, task, strategy):
    """`atlas-lab fit --trainer.strategy=<ddp|ddp_spawn> --trainer.devices=2` (gloo): the ranks see disjoint halves
    of each global batch, the run has one MLflow run and one checkpoint, and its losses and weights are those of
    one process with the global batch (tolerances: the module docstring)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), OMP_NUM_THREADS="1")
    two = subprocess.run([sys.executable, "-m", "atlas_lab.cli",
                          *fit_args(task, workdir / "two", 4, f"--trainer.strategy={strategy}", "--trainer.devices=2",
                                    checkpoint=True)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "tests"))
    run_cli(fit_args(task, workdir / "one", 8, "--trainer.logger=false", "--trainer.enable_checkpointing=false"))
    ranks = [json.loads((workdir / "two" / f"rank-{r}.json").read_text()) for r in range(2)]
    one = json.loads((workdir / "one" / "rank-0.json").read_text())
    assert [r["world_size"] for r in ranks] == [2, 2] and len(one["steps"]) == STEPS
    for step in range(STEPS):
        a, b = (r["steps"][step]["ids"] for r in ranks)
        assert len(a) == len(b) == 4 and not set(a) & set(b)  # each rank its own shard
        assert sorted(a + b) == sorted(one["steps"][step]["ids"])  # together: the single process's batch
        mean = (ranks[0]["steps"][step]["loss"] + ranks[1]["steps"][step]["loss"]) / 2
        assert mean == pytest.approx(one["steps"][step]["loss"], rel=1e-4)
    p2, p1 = torch.load(workdir / "two" / "params.pt"), torch.load(workdir / "one" / "params.pt")
    assert max((p2[k] - p1[k]).abs().max().item() for k in p1) < 1e-4
    client = MlflowClient("sqlite:///" + str(workdir / "runs" / "mlflow.db"))
    runs = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])
    assert len(runs) == 1 and runs[0].data.metrics["train/loss"] > 0
    checkpoints = sorted(p.name for p in (workdir / "runs" / "checkpoints").glob("*.ckpt"))
    assert checkpoints == [f"epoch=0-step={STEPS}.ckpt", "last.ckpt"]
