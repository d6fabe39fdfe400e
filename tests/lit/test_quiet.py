"""The run commands say only what a user can act on: no Lightning tips (litlogger, litmodels) on a fit or an
evaluation; and run options Lightning would take and then misuse are refused up front, with one line."""
import pytest

from atlas_lab.cli import main


def tiny():
    return ["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=deltanet",
            "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2", "--model.memory_heads=2",
            "--data.init_args.train_slices=[[16, 2, 64]]", "--data.init_args.test_slices=[[16, 2, 16]]",
            "--data.init_args.batch_size=16"]


def test_fit_and_test_print_no_lightning_tips(workdir, capfd):
    assert main(["fit", *tiny(), "--trainer.max_steps=2"]) == 0
    assert main(["fit", *tiny(), "--trainer.max_steps=2", "--trainer.callbacks=[]"]) == 0  # Lightning's own checkpoint
    assert main(["test", *tiny(), "--ckpt_path=runs/checkpoints/last.ckpt"]) == 0
    out, err = capfd.readouterr()
    assert "Tip:" not in out + err and "litmodels" not in out + err and "litlogger" not in out + err
    assert "fatal:" not in err


@pytest.mark.parametrize("option,expected", [
    ("--trainer.log_every_n_steps=0", "trainer.log_every_n_steps: expected null or an int >= 1"),
])
def test_run_options_lightning_would_misuse_are_refused(workdir, capfd, option, expected):
    assert main(["fit", *tiny(), option]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
