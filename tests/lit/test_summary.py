"""The model summary counts the FLOPs of one training sequence for every data module: the in-memory tasks and the
streaming shards alike, on a fresh fit and on a resumed one."""
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import prepared_corpus

from atlas_lab.cli import main
from atlas_lab.lit.module import SequenceModel


def total_flops(text: str) -> str:
    (value,) = re.findall(r"Total FLOPs: (\S+(?: \w)?)", text)
    return value


def counted(ckpt: str, T: int) -> int:
    """FLOPs of a forward pass of [1, T] tokens through the checkpoint's model, counted here."""
    model = SequenceModel.load_from_checkpoint(ckpt).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, T, dtype=torch.long))
    return counter.get_total_flops()


def human(n: int) -> str:
    from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

    return get_human_readable_count(n)


MQAR = ["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=deltanet", "--model.d_model=16",
        "--model.n_layers=1", "--model.n_heads=2", "--model.memory_heads=2",
        "--data.init_args.train_slices=[[24, 2, 64]]", "--data.init_args.test_slices=[[24, 2, 16]]",
        "--data.init_args.batch_size=16"]


def test_an_mqar_fit_and_its_resumption_count_flops(workdir, capfd):
    assert main(["fit", *MQAR, "--trainer.max_steps=2"]) == 0
    first = capfd.readouterr().out
    assert main(["fit", *MQAR, "--trainer.max_steps=3", "--ckpt_path=runs/checkpoints/last.ckpt"]) == 0
    resumed = capfd.readouterr().out
    flops = counted("runs/checkpoints/last.ckpt", 24)
    assert flops > 0 and total_flops(first) == total_flops(resumed) == human(flops)
    assert "forward FLOPs per token at T = 24" in first


def test_a_streaming_fit_counts_flops(workdir, capfd):
    prepared_corpus(workdir, 40)
    capfd.readouterr()
    assert main(["fit", "-c", "lightning_config.yaml", "-c", "experiments/lm_tiny_shards.yaml",
                 f"--data.init_args.data_dir={workdir / 'corpus'}", "--data.init_args.seq_len=31",
                 "--data.init_args.num_workers=0", "--model.preset=deltanet", "--model.d_model=16",
                 "--model.n_layers=1", "--trainer.max_steps=1"]) == 0
    out = capfd.readouterr().out
    flops = counted("runs/checkpoints/last.ckpt", 31)
    assert flops > 0 and total_flops(out) == human(flops)
    assert "forward FLOPs per token at T = 31" in out


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the summary's last lines whole
