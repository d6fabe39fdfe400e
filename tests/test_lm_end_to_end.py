"""Language modelling end to end, as a user runs it (docs/tasks.md §7, "End to end"): local text -> a BPE -> token
shards -> a fit on 2 processes (DDP, gloo) stopped after K steps and resumed to the planned total -> the harness on a
local multiple-choice task -> perplexity by position on the held-out split -> S-NIAH refused (a BPE model); every
number checked against a direct computation, every result found in the MLflow store."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.data.shards import held_out
from atlas_lab.eval import Checkpoint

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]
FRUITS = ["apples", "pears", "plums", "figs"]
K, TOTAL = 4, 8  # steps before the interruption, steps planned
MAX_LENGTH, BUCKETS, HOLDOUT = 96, 4, 0.2
QUESTIONS = [  # question, choices (each with its leading space), the right one
    ("record 7\nalice has 3", [" apples.", " carol."], 0),
    ("bob has 2 pears. carol", [" has", " record"], 0),
    ("dave has 5", [" plums.", " erin.", " has"], 0),
    ("erin has 1 figs. frank has", [" 4", " apples"], 0),
    ("record", [" 12", " pears"], 0),
    ("frank has 6 apples. alice has 2", [" figs.", " bob."], 0),
]


def documents(n: int, seed: int = 0) -> list[str]:
    """Records of 3–40 lines "<name> has <k> <fruit>." after a "record <i>" line: about 40–800 bytes each."""
    rng = np.random.default_rng(seed)
    return [f"record {i}\n" + "".join(f"{rng.choice(NAMES)} has {rng.integers(1, 9)} {rng.choice(FRUITS)}.\n"
                                      for _ in range(rng.integers(3, 41))) for i in range(n)]


def write_inputs(folder: Path, docs: list[str]) -> None:
    """docs[:40] as txt/<i>.txt, the rest as one .jsonl."""
    (folder / "txt").mkdir(parents=True)
    for i, doc in enumerate(docs[:40]):
        (folder / "txt" / f"{i:02d}.txt").write_text(doc)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[40:]))


def write_task(folder: Path) -> None:
    """e2e_mc: multiple choice over a local jsonl, in the harness's YAML format."""
    folder.mkdir()
    (folder / "mc.jsonl").write_text("".join(json.dumps({"question": q, "choices": c, "label": a}) + "\n"
                                             for q, c, a in QUESTIONS))
    (folder / "e2e_mc.yaml").write_text(
        f"task: e2e_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\ntarget_delimiter: \"\"\nmetric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")


def fit(max_steps: int, *extra: str) -> None:
    """`atlas-lab fit` on 2 processes: Lightning's DDP launcher starts the second rank with this command line."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + os.environ.get("PYTHONPATH", "").split(os.pathsep))
               .rstrip(os.pathsep))
    run = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "fit", "-c", "lightning_config.yaml", "-c",
                          "experiments/lm_tiny_shards.yaml", "--data.init_args.data_dir=corpus",
                          "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp",
                          f"--trainer.max_steps={max_steps}", f"--model.schedule_steps={TOTAL}",
                          f"--trainer.val_check_interval={K}", "--trainer.log_every_n_steps=1",
                          *extra],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]


def logprob(model, context: list[int], continuation: list[int]) -> float:
    """Σ log p(continuation | context): one call over the whole sequence."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
    scores = logits[0].double().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    return scores[-len(continuation):].sum().item()


def direct_accuracy(ckpt: Checkpoint) -> float:
    """The share of QUESTIONS whose answer has the highest Σ log p of its tokens after the question's."""
    tok, right = ckpt.tokenizer, []
    for question, choices, answer in QUESTIONS:
        context = tok.encode(question)
        for c in choices:  # the harness's split of context and continuation is this one for these texts
            assert tok.encode(question + c) == context + tok.encode(c)
        scores = [logprob(ckpt.model, context, tok.encode(c)) for c in choices]
        right.append(int(np.argmax(scores)) == answer)
    return sum(right) / len(right)


def direct_position_nll(ckpt: Checkpoint, docs: list[str]) -> tuple[list[float], int]:
    """Mean NLL per position bucket over the held-out documents of at least MAX_LENGTH + 1 tokens (their text encoded
    here, <eos> appended), each one call over its first MAX_LENGTH + 1 tokens; and how many documents."""
    tok, rows = ckpt.tokenizer, []
    for doc in docs:
        ids = tok.encode(doc) + [tok.eos_id]
        if held_out(doc, 0, HOLDOUT) and len(ids) > MAX_LENGTH:
            x = torch.tensor([ids[:MAX_LENGTH + 1]])
            with torch.no_grad():
                logits, _ = ckpt.model(x[:, :-1])
            rows.append(-logits[0].double().log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0])
    nll = torch.stack(rows)
    edges = [b * MAX_LENGTH // BUCKETS for b in range(BUCKETS + 1)]
    return [nll[:, a:b].mean().item() for a, b in zip(edges[:-1], edges[1:])], len(rows)


@pytest.mark.slow  # two fits of 2 processes each (4 starts of Lightning): about 1.5 minutes on 2 cores
def test_text_to_shards_to_a_resumed_ddp_fit_to_evaluations_in_mlflow(workdir, capsys):
    docs = documents(300)
    write_inputs(workdir / "text", docs)
    write_task(workdir / "tasks")
    inputs = [str(workdir / "text" / "txt" / "*.txt"), str(workdir / "text" / "docs.jsonl")]
    assert main(["data", "tokenizer", *inputs, "--out", "tokenizer.json", "--vocab-size", "320"]) == 0
    assert main(["data", "prepare", *inputs, "--out", "corpus", "--tokenizer", "tokenizer.json",
                 "--holdout-fraction", str(HOLDOUT)]) == 0
    corpus = json.loads(Path("corpus/corpus.json").read_text())
    assert corpus["vocab_size"] == 320 and sum(s["documents"] for s in corpus["splits"].values()) == 300

    fit(K)  # interrupted: the fit ends after K steps, with its checkpoint (as a run stopped by a time limit)
    first = torch.load("runs/checkpoints/last.ckpt", weights_only=False)
    assert first["global_step"] == K
    fit(TOTAL, "--ckpt_path=runs/checkpoints/last.ckpt")  # resumed to the planned total
    last = torch.load("runs/checkpoints/last.ckpt", weights_only=False)
    assert last["global_step"] == TOTAL and last["mlflow_run"]["run_id"] == first["mlflow_run"]["run_id"]

    ckpt = "runs/checkpoints/last.ckpt"
    assert main(["eval", "--ckpt_path", ckpt, "--tasks", "e2e_mc", "--include-path", "tasks"]) == 0
    assert main(["eval", "--ckpt_path", ckpt, "--ppl-by-position", "corpus/val", "--max-length", str(MAX_LENGTH),
                 "--buckets", str(BUCKETS)]) == 0
    out = capsys.readouterr().out
    assert main(["eval", "--ckpt_path", ckpt, "--niah", "512"]) == 2  # a BPE model cannot read S-NIAH's bytes
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --niah: ") and "BPEFileTokenizer of 320 tokens" in err[0]

    loaded = Checkpoint.load(ckpt)
    client = MlflowClient(loaded.run["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])  # one run, resumed
    assert run.info.run_id == loaded.run["run_id"] and run.info.status == "FINISHED"
    train_steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert train_steps == list(range(TOTAL))  # K steps, then TOTAL - K resumed: each trained once
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss")) == [K - 1, TOTAL - 1]
    acc = run.data.metrics["lm_eval/e2e_mc/acc"]
    assert acc == pytest.approx(direct_accuracy(loaded))
    want, count = direct_position_nll(loaded, docs)
    history = sorted(client.get_metric_history(run.info.run_id, "position/nll"), key=lambda m: m.step)
    assert [m.step for m in history] == [b * MAX_LENGTH // BUCKETS for b in range(BUCKETS)]
    assert [m.value for m in history] == pytest.approx(want, rel=1e-5)
    assert f"the first {MAX_LENGTH} positions of {count} documents of corpus/val" in " ".join(out.split())
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | \
        {a.path for a in client.list_artifacts(run.info.run_id, "eval")}
    assert {"config.yaml", "eval/lm_eval_results.json", "eval/ppl_by_position.png"} <= artifacts
    results = json.loads(Path(client.download_artifacts(run.info.run_id, "eval/lm_eval_results.json",
                                                        str(workdir))).read_text())
    assert results["results"]["e2e_mc"]["acc,none"] == acc
    # the corpus as the data module recorded it (absolute), typed relative on the command line
    assert f"data_dir: {workdir / 'corpus'}" in Path(client.download_artifacts(run.info.run_id, "config.yaml",
                                                                                str(workdir))).read_text()
    assert run.data.params["data.init_args.data_dir"] == str(workdir / "corpus")
    print(f"\nresumed steps {last['global_step']} of {TOTAL}; harness acc {acc:.4f} = direct "
          f"{direct_accuracy(loaded):.4f}; position NLL by bucket {[round(x, 4) for x in want]} over {count} "
          "held-out documents", file=sys.__stdout__)
