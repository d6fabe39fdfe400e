"""``atlas-lab eval``: tables printed, results logged to the fit's MLflow run (or a new run tagged with the checkpoint's
path), and bad input as one line, exit code 2 and nothing written."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from eval_helpers import MULTIPLE_CHOICE, SEQ_LEN, TEXT, direct_accuracy, direct_position_nll
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.eval import Checkpoint


def store_runs(checkpoint) -> tuple[MlflowClient, list]:
    """The client of the store the fit logged to, and its runs."""
    client = MlflowClient(Checkpoint.load(checkpoint).run["tracking_uri"])
    return client, client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_eval_prints_and_logs_to_the_run_that_trained_the_checkpoint(checkpoint, tasks, tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "held_out.txt").write_text(TEXT * 4)
    assert main(["eval", "--ckpt_path", str(checkpoint), "--tasks", "tiny_mc", "--include-path", str(tasks),
                 "--limit", "4", "--ppl-by-position", "held_out.txt", "--max-length", str(2 * SEQ_LEN + 8),
                 "--buckets", "5", "--batch-size", "3"]) == 0
    out = capsys.readouterr().out
    assert "lm-evaluation-harness" in out and "next-token NLL by position" in out
    ckpt = Checkpoint.load(checkpoint)
    assert "the run that trained the checkpoint" in out and ckpt.run["run_id"] in out
    client = MlflowClient(ckpt.run["tracking_uri"])
    run = client.get_run(ckpt.run["run_id"])
    assert run.data.metrics["lm_eval/tiny_mc/acc"] == pytest.approx(direct_accuracy(ckpt.model, MULTIPLE_CHOICE[:4]))
    assert "val/loss" in run.data.metrics  # the fit's own metrics beside the evaluation's
    history = client.get_metric_history(run.info.run_id, "position/nll")
    nll = direct_position_nll(ckpt.model, list((TEXT * 4).encode()), 2 * SEQ_LEN + 8, 4)
    edges = [b * (2 * SEQ_LEN + 8) // 5 for b in range(6)]
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == edges[:-1]
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [nll[:, a:b].mean().item() for a, b in zip(edges[:-1], edges[1:])], rel=1e-5)
    png = client.download_artifacts(run.info.run_id, "eval/ppl_by_position.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "results" in client.download_artifacts(run.info.run_id, "eval/lm_eval_results.json", str(tmp_path))
    assert not (tmp_path / "runs").exists()  # the fit's store, not one in the working directory


def test_a_checkpoint_that_records_no_run_is_logged_to_a_new_run_tagged_with_its_path(checkpoint, tmp_path,
                                                                                     monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    contents = torch.load(checkpoint, weights_only=False)
    uri = contents.pop("mlflow_run")["tracking_uri"]
    torch.save(contents, tmp_path / "norun.ckpt")
    (tmp_path / "held_out.txt").write_text(TEXT)
    assert main(["eval", "--ckpt_path", "norun.ckpt", "--ppl-by-position", "held_out.txt", "--max-length", "40",
                 "--tracking-uri", uri]) == 0
    assert "a new run (the checkpoint records no run)" in capsys.readouterr().out
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string="tags.`atlas_lab.checkpoint` = '" + str(tmp_path / "norun.ckpt") + "'")
    assert run.info.run_name == "eval-norun" and run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "position/ppl")) == [
        b * 40 // 8 for b in range(8)]


def _with_data(checkpoint, path, **changes):
    contents = torch.load(checkpoint, weights_only=False)
    contents["datamodule_hyper_parameters"].update(changes)
    torch.save(contents, path)


@pytest.mark.parametrize("args,message", [
    (["--ckpt_path", "missing.ckpt", "--tasks", "tiny_mc"], "--ckpt_path: no such checkpoint file: missing.ckpt"),
    (["--ckpt_path", "text.ckpt", "--tasks", "tiny_mc"], "--ckpt_path: text.ckpt is not a readable checkpoint"),
    (["--ckpt_path", "mqar.ckpt", "--tasks", "tiny_mc"],
     "--ckpt_path: mqar.ckpt was trained on atlas_lab.data.MQARDataModule, which has no text tokenizer"),
    (["--tasks", "tiny_mc,hellaswag"], "--tasks: unknown task 'hellaswag'; the tasks under TASKS: tiny_mc, tiny_ppl"),
    (["--tasks", "tiny_mc", "--include-path", "nowhere"], "--include-path: no such folder: nowhere"),
    ([], "eval: give --tasks a,b (lm-evaluation-harness tasks), --ppl-by-position FILE, --niah LENGTHS, or several"),
    (["--ppl-by-position", "held_out.txt", "--max-length", "0"], "max-length: expected an int >= 1, got '0'"),
    (["--ppl-by-position", "held_out.txt", "--max-length", "4x"], "max-length: expected an int >= 1, got '4x'"),
    (["--ppl-by-position", "held_out.txt", "--max-length", "500"],
     "--max-length: 500 needs 501 tokens per sequence; the file holds 172 tokens"),
    (["--ppl-by-position", "held_out.txt"], "--max-length: required with --ppl-by-position FILE"),
    (["--tasks", "tiny_mc", "--max-length", "64"], "--max-length: used by --ppl-by-position FILE only"),
    (["--ppl-by-position", "held_out.txt", "--max-length", "40", "--buckets", "41"],
     "--buckets: expected an int in [1, --max-length = 40], got 41"),
    (["--ppl-by-position", "missing.txt", "--max-length", "40"], "--ppl-by-position: no such file: missing.txt"),
    (["--ckpt_path", "mqar.ckpt", "--niah", "512"], "--niah: mqar.ckpt was trained on no text "
     "(atlas_lab.data.MQARDataModule), which does not read S-NIAH's UTF-8 bytes as they are written; expected a "
     "checkpoint trained on bytes"),
    (["--niah", "400,100"], "--niah: 100 tokens cannot hold the needle, question and answer"),
    (["--niah", "256,x"], "niah: expected comma-separated ints >= 1 (sequence lengths), got '256,x'"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(checkpoint, tasks, tmp_path, monkeypatch, capsys, args,
                                                         message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "held_out.txt").write_text(TEXT)
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    _with_data(checkpoint, tmp_path / "mqar.ckpt", _class_path="atlas_lab.data.MQARDataModule")
    shutil.copytree(tasks, tmp_path / "TASKS")
    if "--ckpt_path" not in args:
        args = ["--ckpt_path", str(checkpoint), *args]
    if "--tasks" in args and "--include-path" not in args:
        args += ["--include-path", "TASKS"]
    before = sorted(p.name for p in tmp_path.iterdir())
    _, runs = store_runs(checkpoint)
    assert main(["eval", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert [r.info.run_id for r in store_runs(checkpoint)[1]] == [r.info.run_id for r in runs]


PROBE = """import json, sys
from atlas_lab.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted(m for m in ("torch", "lightning", "litdata", "lm_eval.tasks") if m in sys.modules)]))
"""


@pytest.mark.parametrize("args,message,imported", [
    (["--ckpt_path", "missing.ckpt", "--tasks", "no_such_task"], "--ckpt_path: no such checkpoint file", []),
    (["--tasks", "no_such_task", "--include-path", "TASKS"], "--tasks: unknown task 'no_such_task'",
     ["lm_eval.tasks"]),
    (["--tasks", "no_such_task"], "--tasks: unknown task 'no_such_task'; no task of lm-evaluation-harness", []),
    (["--ckpt_path", "mqar.ckpt", "--tasks", "tiny_mc", "--include-path", "TASKS"], "which has no text tokenizer", []),
    (["--ckpt_path", "mqar.ckpt", "--niah", "512"], "--niah: mqar.ckpt was trained on no text", []),
    (["--ppl-by-position", "held_out.txt", "--max-length", "500"], "--max-length: 500 needs 501 tokens", []),
])
def test_the_checkpoint_is_checked_before_the_tasks_and_both_before_lightning(checkpoint, tasks, tmp_path, args,
                                                                             message, imported):
    """In a fresh process: a missing checkpoint is reported before the harness indexes its tasks (without
    --include-path, its own: half a minute), and every check comes before torch (the checkpoint's plain data is read
    without it), Lightning or litdata is imported; the harness's task index only where the tasks are checked."""
    (tmp_path / "held_out.txt").write_text(TEXT)
    _with_data(checkpoint, tmp_path / "mqar.ckpt", _class_path="atlas_lab.data.MQARDataModule")
    shutil.copytree(tasks, tmp_path / "TASKS")
    if "--ckpt_path" not in args:
        args = ["--ckpt_path", str(checkpoint), *args]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["eval", *args])], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, imported]


def test_the_checkpoints_plain_data_is_read_without_torch(checkpoint, tmp_path):
    """peek_checkpoint gives what torch.load gives of a checkpoint's plain data (hyper-parameters, the data's arguments
    and tokenizer, the run), each tensor left unread; a zip archive of something else is one line."""
    import zipfile

    from atlas_lab.eval import EvalError
    from atlas_lab.eval.checkpoint import Opaque, peek_checkpoint

    peeked, loaded = peek_checkpoint(checkpoint), torch.load(checkpoint, map_location="cpu", weights_only=False)
    for key in ("hyper_parameters", "datamodule_hyper_parameters", "LMDataModule", "mlflow_run", "global_step"):
        assert peeked[key] == loaded[key], key
    assert peeked["LMDataModule"] == {"tokenizer": {"class": "ByteTokenizer"}}
    assert list(peeked["state_dict"]) == list(loaded["state_dict"])
    assert all(isinstance(v, Opaque) for v in peeked["state_dict"].values())
    with zipfile.ZipFile(tmp_path / "other.ckpt", "w") as archive:
        archive.writestr("archive/data.pkl", b"not a pickle")
    with pytest.raises(EvalError, match=r"--ckpt_path: .*other.ckpt is not a readable checkpoint \(UnpicklingError"):
        peek_checkpoint(tmp_path / "other.ckpt")
