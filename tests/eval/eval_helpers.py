"""The evaluation tests' material: a tiny byte-level language model fitted by ``atlas-lab fit`` and local harness
tasks (the harness's YAML format) over jsonl files."""
import json
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n")
SEQ_LEN = 16  # the training length T


def fit(folder: Path, *overrides: str) -> Path:
    """``atlas-lab fit`` of a 2-layer samba (a Mamba-2 memory layer and SWA with a window of 8 < T) at d_model 16 on
    TEXT, 12 steps, logged to MLflow in folder/runs; returns its last checkpoint."""
    from atlas_lab.lit.cli import run_cli

    corpus = folder / "corpus.txt"
    corpus.write_text(TEXT * 40)
    run_cli(["fit", "-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments/lm.yaml"),
             "--model.preset=samba", "--model.d_model=16", "--model.n_layers=2", "--model.n_heads=2",
             "--model.memory_heads=2", "--model.swa_window=8", "--model.lr=0.01", "--model.warmup_steps=2",
             "--model.eval_piece=0", f"--data.init_args.data_path={corpus}", f"--data.init_args.seq_len={SEQ_LEN}",
             f"--data.init_args.cache_dir={folder / 'cache'}", "--data.init_args.batch_size=8",
             "--trainer.max_steps=12", "--trainer.val_check_interval=12", "--trainer.limit_val_batches=1",
             f"--trainer.default_root_dir={folder / 'runs'}",
             f"--trainer.logger.init_args.tracking_uri=sqlite:///{folder / 'runs' / 'mlflow.db'}",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
             "--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
             "init_args: {save_last: true}}]", *overrides])
    return folder / "runs" / "checkpoints" / "last.ckpt"


def documents(n: int, seed: int = 0) -> list[str]:
    """n documents of 1–12 lines of TEXT, cut at random: about 10–500 bytes each."""
    rng = np.random.default_rng(seed)
    lines = TEXT.splitlines(keepends=True)
    return [f"{i}: " + "".join(rng.choice(lines, size=rng.integers(1, 13))) for i in range(n)]


def fit_shards(folder: Path) -> Path:
    """``atlas-lab data prepare`` of 60 documents (bytes, a fifth held out), then ``atlas-lab fit`` of
    experiments/lm_tiny_shards.yaml on it for 3 steps (deltanet, T = 64) with an MLflow run; its last checkpoint."""
    from atlas_lab.cli import main
    from atlas_lab.lit.cli import run_cli

    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents(60)))
    assert main(["data", "prepare", str(folder / "docs.jsonl"), "--out", str(folder / "corpus"),
                 "--holdout-fraction", "0.2"]) == 0
    run_cli(["fit", "-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments/lm_tiny_shards.yaml"),
             f"--data.init_args.data_dir={folder / 'corpus'}", "--model.preset=deltanet", "--trainer.max_steps=3",
             f"--trainer.default_root_dir={folder / 'runs'}",
             f"--trainer.logger.init_args.tracking_uri=sqlite:///{folder / 'runs' / 'mlflow.db'}",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
             "--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
             "init_args: {save_last: true}}]"])
    return folder / "runs" / "checkpoints" / "last.ckpt"


MULTIPLE_CHOICE = [  # question, choices, the right one
    ("To be, or not to", [" be", " go", " sing"], 0),
    ("that is the", [" question", " answer"], 0),
    ("Whether 'tis nobler in the", [" house", " mind", " field"], 1),
    ("The slings and arrows of outrageous", [" luck", " fortune"], 1),
    ("Or to take arms against a sea of", [" troubles", " boats", " fish", " stars"], 0),
    ("", [" to", " zz"], 0),  # an empty context: conditioned on the prefix token alone
]
DOCUMENTS = [TEXT * 2, "Or to take arms", "The slings and arrows of outrageous fortune, and more words to come.\n"]


def task_yaml(name: str, data: Path, body: str) -> str:
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}metadata:\n  version: 1.0\n")


def write_tasks(folder: Path) -> Path:
    """Writes in folder two harness tasks in its own YAML format: tiny_mc (multiple_choice, acc) and tiny_ppl
    (loglikelihood_rolling: word and byte perplexity, bits per byte), each over a local jsonl file."""
    (folder / "mc.jsonl").write_text("".join(json.dumps({"question": q, "choices": c, "label": a}) + "\n"
                                             for q, c, a in MULTIPLE_CHOICE))
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS))
    (folder / "tiny_mc.yaml").write_text(task_yaml("tiny_mc", folder / "mc.jsonl", (
        "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: label\ntarget_delimiter: \"\"\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")))
    (folder / "tiny_ppl.yaml").write_text(task_yaml("tiny_ppl", folder / "docs.jsonl", (
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
        + "".join(f"  - metric: {m}\n    aggregation: {a}\n    higher_is_better: false\n" for m, a in (
            ("word_perplexity", "weighted_perplexity"), ("byte_perplexity", "weighted_perplexity"),
            ("bits_per_byte", "bits_per_byte"))))))
    return folder


PAD = 256  # the byte tokenizer's <pad>: the prefix token of a text (its data has no end-of-document token)


def direct(model, tokens: list[int], scored: int) -> tuple[float, bool]:
    """Σ log p over the last ``scored`` tokens of one sequence, and whether each is the argmax: one call, no cache."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
    log_probs = logits[0].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    greedy = logits[0].argmax(-1) == ids[0, 1:]
    return log_probs[-scored:].sum().item(), bool(greedy[-scored:].all())


def direct_accuracy(model, questions) -> float:
    """The share of (question, choices, answer) whose answer has the highest Σ log p of its bytes after the question
    (after the prefix token alone for an empty question)."""
    right = []
    for question, choices, answer in questions:
        context = list(question.encode()) or [PAD]
        scores = [direct(model, context + list(c.encode()), len(c.encode()))[0] for c in choices]
        right.append(max(range(len(choices)), key=lambda i: scores[i]) == answer)
    return sum(right) / len(right)


def direct_position_nll(model, tokens, max_length: int, count: int) -> torch.Tensor:
    """Next-token NLL at each position of the first ``count`` sequences of max_length + 1 tokens [count, max_length],
    each scored in one call."""
    rows = []
    for s in range(count):
        ids = torch.as_tensor(tokens[s * (max_length + 1):(s + 1) * (max_length + 1)], dtype=torch.long)[None]
        with torch.no_grad():
            logits, _ = model(ids[:, :-1])
        rows.append(-logits[0].double().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0])
    return torch.stack(rows)
