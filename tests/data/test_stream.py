"""StreamingLMDataModule: windows of the packed token stream, document starts, and resuming where a run stopped."""
import json

import lightning as L
import numpy as np
import pytest
import torch
from helpers import chunk_tokens, prepared_corpus

from atlas_lab.cli import main
from atlas_lab.data.stream import StreamingLMDataModule


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """80 documents of 10–200 bytes (byte tokens), chunks of ~512 tokens."""
    return prepared_corpus(tmp_path_factory.mktemp("stream"), 80)


def expected_windows(split_dir, seq_len: int) -> np.ndarray:
    """[N, seq_len + 1]: each chunk's token stream cut into consecutive windows (its last partial one dropped), in
    chunk order."""
    block = seq_len + 1
    return np.concatenate([s[:len(s) // block * block].reshape(-1, block) for s in chunk_tokens(split_dir)])


def windows(batches) -> np.ndarray:
    """The windows [N, T + 1] of a list of batches (input_ids, then the last label)."""
    for b in batches:
        assert torch.equal(b["input_ids"][:, 1:], b["labels"][:, :-1])
    return torch.cat([torch.cat([b["input_ids"], b["labels"][:, -1:]], 1) for b in batches]).numpy()


def sorted_rows(x: np.ndarray) -> np.ndarray:
    return x[np.lexsort(x.T[::-1])]


def test_batches_are_windows_of_the_packed_token_stream(data_dir):
    """Validation: the windows in order; training (2 workers, shuffled): every window once an epoch, in another
    order each epoch."""
    dm = StreamingLMDataModule(data_dir, seq_len=15, batch_size=8, num_workers=0)
    dm.setup("fit")
    val = list(dm.val_dataloader())
    assert val[0]["input_ids"].shape == (8, 15) and val[0]["input_ids"].dtype == torch.long
    np.testing.assert_array_equal(windows(val), expected_windows(f"{data_dir}/val", 15))
    dm = StreamingLMDataModule(data_dir, seq_len=15, batch_size=8, num_workers=2)
    loader = dm.train_dataloader()
    first, second = windows(list(loader)), windows(list(loader))
    expected = expected_windows(f"{data_dir}/train", 15)
    assert len(expected) > 100
    np.testing.assert_array_equal(sorted_rows(first), sorted_rows(expected))
    np.testing.assert_array_equal(sorted_rows(second), sorted_rows(expected))
    assert not np.array_equal(first, expected) and not np.array_equal(first, second)


def test_document_start_marks_the_token_after_each_end_token(data_dir):
    dm = StreamingLMDataModule(data_dir, seq_len=31, batch_size=4, num_workers=0, reset_at_document=True)
    for batch in dm.train_dataloader():
        ids, start = batch["input_ids"].tolist(), batch["document_start"]
        direct = [[t == 0 or row[t - 1] == dm.eos_id for t in range(len(row))] for row in ids]
        assert start.dtype == torch.bool and start.tolist() == direct
    assert start.sum() > start.shape[0]  # documents start inside windows too
    assert "document_start" not in next(iter(StreamingLMDataModule(data_dir, seq_len=31, num_workers=0)
                                              .train_dataloader()))


def test_attributes_and_setup_checks(data_dir):
    info = json.loads(open(f"{data_dir}/corpus.json").read())
    dm = StreamingLMDataModule(data_dir, seq_len=15)
    assert (dm.vocab_size, dm.pad_id, dm.eos_id, dm.slice_names) == (258, 256, 257, [])
    assert dm.bytes_per_token == info["splits"]["val"]["bytes"] / info["splits"]["val"]["tokens"] < 1
    assert dm.decode([104, 105, 257]) == "hi"
    with pytest.raises(ValueError, match=r"^seq_len: 4000 leaves no window of seq_len \+ 1 tokens in .*val'$"):
        StreamingLMDataModule(data_dir, seq_len=4000).setup("validate")
    with pytest.raises(ValueError, match="^data_dir: 'nowhere' has no corpus.json; expected a folder written by"):
        StreamingLMDataModule("nowhere")


def token_stream(loader, stop: int | None = None) -> list[torch.Tensor]:
    """input_ids of every batch of one pass (of the first `stop` batches)."""
    seen = []
    for batch in loader:
        seen.append(batch["input_ids"])
        if len(seen) == stop:
            break
    return seen


@pytest.mark.parametrize("k", [1, 4, 7])
def test_a_loader_resumed_from_its_state_continues_with_the_unseen_batches(data_dir, k):
    """StreamingDataLoader.state_dict after k batches (2 workers) -> a new loader loaded with it yields the rest of
    the epoch, then the next epoch, exactly as the uninterrupted loader."""
    def loader():
        return StreamingLMDataModule(data_dir, seq_len=15, batch_size=8, num_workers=2, seed=3).train_dataloader()

    full = loader()
    uninterrupted = token_stream(full) + token_stream(full)
    first = loader()
    seen = token_stream(first, stop=k)
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    seen += token_stream(resumed) + token_stream(resumed)
    assert len(seen) == len(uninterrupted)
    assert torch.equal(torch.cat(seen), torch.cat(uninterrupted))


class Record(L.Callback):
    """The input_ids of every training batch."""

    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())


def fit(data_dir, max_steps: int, ckpt_dir, resume: bool) -> list[torch.Tensor]:
    """A tiny transformer trained for max_steps (resumed from ckpt_dir/last.ckpt); the batches it trained on."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from atlas_lab.lit.module import SequenceModel

    L.seed_everything(0)
    dm = StreamingLMDataModule(data_dir, seq_len=31, batch_size=32, num_workers=2, seed=1)
    model = SequenceModel(dm.vocab_size, "transformer", d_model=16, n_layers=1, n_heads=2, warmup_steps=0)
    record = Record()
    trainer = L.Trainer(max_steps=max_steps, limit_val_batches=0, logger=False, accelerator="cpu",
                        callbacks=[record, ModelCheckpoint(dirpath=ckpt_dir, save_last=True)],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm, ckpt_path=f"{ckpt_dir}/last.ckpt" if resume else None)
    return record.seen


def test_a_fit_resumed_mid_epoch_trains_on_the_batches_it_had_not_seen(data_dir, tmp_path):
    """A fit of 14 steps (2 epochs of 7 batches) stopped after 3 steps, resumed from its checkpoint and stopped after 8,
    resumed again to 14, trains on the same batches in the same order as the fit that never stopped. Lightning
    keeps the loader's position: its fit loop saves StreamingDataLoader.state_dict() in the checkpoint and loads it
    into the new loader on resume (the loader has a length, so Lightning fetches no batch ahead of the step)."""
    uninterrupted = fit(data_dir, 14, tmp_path / "a", resume=False)
    epoch = len(StreamingLMDataModule(data_dir, seq_len=31, batch_size=32, num_workers=2).train_dataloader())
    assert 3 < epoch < 8  # the fit stops in the first epoch, then in the second
    seen = fit(data_dir, 3, tmp_path / "b", resume=False)
    state = torch.load(tmp_path / "b" / "last.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]
    assert state["combined_loader"][0]["num_samples_yielded"] == 3 * 32
    seen += fit(data_dir, 8, tmp_path / "b", resume=True)
    seen += fit(data_dir, 14, tmp_path / "b", resume=True)
    assert len(seen) == len(uninterrupted) == 14
    assert torch.equal(torch.cat(seen), torch.cat(uninterrupted))


def test_atlas_lab_fits_and_tests_on_a_prepared_corpus(data_dir, workdir):
    """experiments/lm_tiny_shards.yaml on a prepared corpus (deltanet for speed; documents read apart with
    document_start): the data module's vocabulary and bytes per token reach the model, and its arguments the
    checkpoint (where atlas-lab eval finds the tokenizer). `atlas-lab test` then scores the held-out split: test/loss
    is the mean next-token loss over its every window, as the checkpoint's model gives it window by window."""
    from mlflow.tracking import MlflowClient

    from atlas_lab.lit.module import SequenceModel

    args = ["-c", "lightning_config.yaml", "-c", "experiments/lm_tiny_shards.yaml",
            f"--data.init_args.data_dir={data_dir}", "--model.preset=deltanet"]
    assert main(["fit", *args, "--trainer.max_steps=2"]) == 0
    checkpoint = torch.load("runs/checkpoints/last.ckpt", weights_only=False)
    hparams, data = checkpoint["hyper_parameters"], checkpoint["datamodule_hyper_parameters"]
    assert hparams["vocab_size"] == 258 and hparams["bytes_per_token"] == \
        StreamingLMDataModule(data_dir).bytes_per_token
    assert (data["data_dir"], data["seq_len"], data["reset_at_document"]) == (data_dir, 64, True)
    assert main(["test", *args, "--ckpt_path=runs/checkpoints/last.ckpt"]) == 0
    client = MlflowClient("sqlite:///" + str(workdir / "runs" / "mlflow.db"))
    (run,) = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id],
                                filter_string="attributes.run_name = 'test-streaminglm-deltanet'")
    model = SequenceModel.load_from_checkpoint("runs/checkpoints/last.ckpt").eval()
    windows = torch.as_tensor(expected_windows(f"{data_dir}/val", 64).astype(np.int64))
    ids, labels = windows[:, :-1], windows[:, 1:]
    start = torch.ones_like(ids, dtype=torch.bool)
    start[:, 1:] = ids[:, :-1] == 257
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(ids, start).flatten(0, 1), labels.flatten())
    assert run.data.metrics["test/loss"] == pytest.approx(loss.item(), rel=1e-5)


@pytest.mark.slow  # two processes that start Lightning, and a third: ~1 minute on 2 cores
def test_each_ddp_rank_reads_its_own_windows(data_dir, workdir):
    """`atlas-lab fit --trainer.strategy=ddp --trainer.devices=2` (gloo) for one epoch: litdata gives each rank its
    own windows (read from torch.distributed when the loader is built), as many on both ranks; together they are
    the epoch's windows, but for at most one batch per rank left out so that the ranks' counts match."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dist_probe import row_ids

    root = Path(__file__).resolve().parents[2]
    probe = json.dumps([{"class_path": "dist_probe.Probe", "init_args": {"out": str(workdir / "probe")}}])
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(root / "tests"), str(root)] + os.environ.get("PYTHONPATH", "").split(
                   os.pathsep)).rstrip(os.pathsep))
    run = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "fit", "-c", "lightning_config.yaml",
                          "--data=atlas_lab.data.StreamingLMDataModule", f"--data.data_dir={data_dir}",
                          "--data.seq_len=31", "--data.batch_size=8", "--data.num_workers=1",
                          "--model.preset=transformer", "--model.d_model=16", "--model.n_layers=1",
                          "--model.n_heads=2", "--trainer.max_epochs=1", "--trainer.limit_val_batches=0",
                          "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--validate_at_end=false",
                          "--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.devices=2",
                          "--trainer.enable_progress_bar=false", f"--trainer.callbacks={probe}"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((workdir / "probe" / f"rank-{r}.json").read_text()) for r in range(2)]
    ids = [[i for step in r["steps"] for i in step["ids"]] for r in ranks]
    assert [r["world_size"] for r in ranks] == [2, 2] and len(ranks[0]["steps"]) == len(ranks[1]["steps"]) > 0
    expected = row_ids({"input_ids": torch.as_tensor(expected_windows(f"{data_dir}/train", 31)[:, :-1].astype(int))})
    assert len(set(expected)) == len(expected)
    assert not set(ids[0]) & set(ids[1]) and set(ids[0]) | set(ids[1]) <= set(expected)
    assert len(ids[0]) + len(ids[1]) > len(expected) - 2 * 8
