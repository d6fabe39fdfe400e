"""``atlas-lab eval --niah``: S-NIAH scored from the checkpoint's logits, logged to its run by length; refused with
one line where the checkpoint cannot read the task's text."""
import json

import pytest
import torch
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.data.niah import NIAHDataModule
from atlas_lab.eval import Checkpoint

LENGTHS, SAMPLES = (300, 400), 3


def direct_scores(model, dm: NIAHDataModule) -> tuple[float, float, float]:
    """(the mean NLL of the answer tokens and the share of them that are the argmax, from one call's logits per
    sample; the share of samples whose answer is generated greedily, one call per token without a cache)."""
    nll = correct = count = hits = 0
    ds = dm.datasets["test"]
    with torch.no_grad():
        for i in range(len(ds)):
            item = ds[i]
            ids, labels = item["input_ids"], item["labels"]
            logits, _ = model(ids[None])
            mask = labels != -100
            nll -= logits[0, mask].double().log_softmax(-1).gather(-1, labels[mask, None]).sum().item()
            correct += int((logits[0].argmax(-1)[mask] == labels[mask]).sum())
            count += int(mask.sum())
            start, length = int(item["answer_start"]), int(item["answer_length"])
            tokens = ids[:start].tolist()
            for _ in range(length):
                tokens.append(int(model(torch.tensor([tokens]))[0][0, -1].argmax()))
            hits += tokens[start:] == ids[start:start + length].tolist()
    return nll / count, correct / count, hits / len(ds)


@pytest.mark.parametrize("recorded", [None, {"value_type": "words", "depth_buckets": 2}])
def test_niah_scores_are_those_of_the_checkpoint_on_the_niah_data(checkpoint, tmp_path, monkeypatch, capsys,
                                                                 recorded):
    """A byte-level LM (the task's text read as it was trained), or a checkpoint trained on S-NIAH (its recorded
    arguments: here word values and 2 depth buckets): acc and exact match at each length, logged with the length as
    the step, equal those computed from the model's logits on the same samples (the answer NLL discriminates: the
    tiny model answers none)."""
    monkeypatch.chdir(tmp_path)
    ckpt_path = checkpoint
    if recorded is not None:
        contents = torch.load(checkpoint, weights_only=False)
        contents["datamodule_hyper_parameters"] = {"_class_path": "atlas_lab.data.NIAHDataModule", "variant": 1,
                                                   "lengths": [4096], "eval_size": 50, **recorded}
        ckpt_path = tmp_path / "niah.ckpt"
        torch.save(contents, ckpt_path)
    assert main(["eval", "--ckpt_path", str(ckpt_path), "--niah", ",".join(map(str, LENGTHS)),
                 "--limit", str(SAMPLES)]) == 0
    out = capsys.readouterr().out
    assert "S-NIAH-1" in out and "exact match" in out
    ckpt = Checkpoint.load(checkpoint)
    client = MlflowClient(ckpt.run["tracking_uri"])
    run_id = ckpt.run["run_id"]
    def logged(name: str, step: int, value: float) -> bool:  # the session's run gets both cases' values
        return any(m.value == pytest.approx(value) for m in client.get_metric_history(run_id, name) if m.step == step)

    report = json.loads(open(client.download_artifacts(run_id, "eval/niah.json", str(tmp_path))).read())
    assert [(s["length"], s["samples"]) for s in report["scores"]] == [(n, SAMPLES) for n in LENGTHS]
    depths = ["depth0-50", "depth50-100"] if recorded else [f"depth{a}-{a + 20}" for a in range(0, 100, 20)]
    for n, scores in zip(LENGTHS, report["scores"]):
        dm = NIAHDataModule(**(recorded or {}), lengths=[n], train_lengths=[n], train_size=1, eval_size=SAMPLES)
        dm.setup("test")
        loss, acc, exact = direct_scores(ckpt.model, dm)
        assert scores["loss"] == pytest.approx(loss, rel=1e-5) and logged("niah/loss", n, scores["loss"])
        assert (scores["acc"], scores["exact_match"]) == pytest.approx((acc, exact))
        assert logged("niah/acc", n, acc) and logged("niah/exact_match", n, exact)
        assert scores["depth_acc"] and set(scores["depth_acc"]) <= set(depths)
        for depth, value in scores["depth_acc"].items():
            assert logged(f"niah/acc/{depth}", n, value)
