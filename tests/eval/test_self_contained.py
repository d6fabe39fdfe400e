"""A checkpoint is self-contained: it carries its tokenizer (the data module's state) and its data's arguments with
their paths absolute, so evaluation, generation, perplexity by position and ``atlas-lab test`` work from any folder
after the corpus folder has moved (and the tokenizer.json it was prepared with, or the BPE cache, has gone); and
``atlas-lab eval`` outside a git repository writes nothing of git's on stderr."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from eval_helpers import MULTIPLE_CHOICE, ROOT, TEXT, documents, fit, write_tasks
from lm_eval.api.instance import Instance
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.data.shards import load_tokenizer
from atlas_lab.data.tokenizers import BPEFileTokenizer, BPETokenizer
from atlas_lab.eval import AtlasLM, Checkpoint, checkpoint_tokenizer

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
         "init_args: {save_last: true}}]"]


@pytest.fixture(scope="module")
def bpe_fit(tmp_path_factory):
    """(the folder, the checkpoint, the documents, the corpus's tokenizer): a BPE trained with ``atlas-lab data
    tokenizer``, a corpus prepared with it by ``atlas-lab data prepare`` and fitted on for 2 steps, every path given
    relative to the folder the commands ran in; the corpus has since moved to "moved" beside that folder, and the
    tokenizer.json is gone."""
    from atlas_lab.lit.cli import run_cli

    root = tmp_path_factory.mktemp("bpe")
    work = root / "work"
    work.mkdir()
    docs = documents(60)
    (work / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert main(["data", "tokenizer", "docs.jsonl", "--out", "tok.json", "--vocab-size", "300"]) == 0
        assert main(["data", "prepare", "docs.jsonl", "--out", "corpus", "--tokenizer", "tok.json",
                     "--holdout-fraction", "0.2"]) == 0
        run_cli(["fit", "-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments/lm_tiny_shards.yaml"),
                 "--data.init_args.data_dir=corpus", "--data.init_args.seq_len=32", "--model.preset=deltanet",
                 "--trainer.max_steps=2", *QUIET])
        tokenizer = load_tokenizer("corpus")
    checkpoint = work / "runs" / "checkpoints" / "last.ckpt"
    contents = torch.load(checkpoint, map_location="cpu", weights_only=True)  # plain data: safe to load
    assert contents["datamodule_hyper_parameters"]["data_dir"] == str((work / "corpus").resolve())
    assert contents["StreamingLMDataModule"] == {"tokenizer": {"class": "BPEFileTokenizer",
                                                               "json": (work / "tok.json").read_text()}}
    shutil.move(work / "corpus", root / "moved")
    (work / "tok.json").unlink()
    return root, checkpoint, docs, tokenizer


def test_a_checkpoint_of_a_prepared_corpus_is_evaluated_after_the_corpus_and_its_tokenizer_have_gone(
        bpe_fit, tmp_path, monkeypatch, capfd):
    """From another folder, with the corpus moved and tokenizer.json deleted: the checkpoint's tokenizer is the
    corpus's (the same ids for every document), and eval's harness tasks and perplexity by position run and log to
    the fit's run; outside a git repository, nothing of git's reaches stderr (lm_eval records the working
    directory's commit)."""
    root, checkpoint, docs, written = bpe_fit
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git finds no repository from here
    assert subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True).returncode != 0
    tokenizer = checkpoint_tokenizer(checkpoint)
    assert type(tokenizer) is BPEFileTokenizer and tokenizer.vocab_size == written.vocab_size
    assert [tokenizer.encode(d) for d in docs] == [written.encode(d) for d in docs]
    assert [d for d in docs if len(written.encode(d)) < len(d.encode())]  # merges: not bytes in disguise
    (tmp_path / "tasks").mkdir()
    write_tasks(tmp_path / "tasks")
    (tmp_path / "held_out.txt").write_text(TEXT * 2)
    capfd.readouterr()
    assert main(["eval", "--ckpt_path", str(checkpoint), "--tasks", "tiny_mc", "--include-path", "tasks", "--limit",
                 "4", "--ppl-by-position", "held_out.txt", "--max-length", "40", "--buckets", "4"]) == 0
    out, err = capfd.readouterr()
    assert "the run that trained the checkpoint" in out
    assert "fatal" not in err and "not a git repository" not in err, err
    ckpt = Checkpoint.load(checkpoint)
    run = MlflowClient(ckpt.run["tracking_uri"]).get_run(ckpt.run["run_id"])
    assert "position/nll" in run.data.metrics and "lm_eval/tiny_mc/acc" in run.data.metrics
    assert main(["eval", "--ckpt_path", str(checkpoint), "--ppl-by-position", str(root / "moved" / "val"),
                 "--max-length", "24", "--buckets", "2"]) == 0  # its held-out documents, where they are now


def test_generation_reads_and_writes_text_with_the_checkpoints_tokenizer(bpe_fit, tmp_path, monkeypatch):
    _, checkpoint, docs, written = bpe_fit
    monkeypatch.chdir(tmp_path)
    lm = AtlasLM(str(checkpoint))
    prompt = docs[0][:20]
    (text,) = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": ["\u00a7"], "max_gen_toks": 12}),
                                          0)])
    ids = torch.tensor([written.encode(prompt)])
    tokens = lm.model.generate(ids, 12)[0][0].tolist()  # greedy, one call
    if written.eos_id in tokens:
        tokens = tokens[:tokens.index(written.eos_id)]
    assert text == written.decode(tokens)


def test_atlas_lab_test_scores_the_checkpoint_on_the_moved_corpus_from_another_folder(bpe_fit, tmp_path, monkeypatch,
                                                                                      capsys):
    """The checkpoint's tokenizer is checked against the corpus's (``load_state_dict``): the moved corpus is the same;
    a corpus of bytes is refused, naming both tokenizers."""
    from atlas_lab.data.stream import StreamingLMDataModule

    root, checkpoint, _, _ = bpe_fit
    monkeypatch.chdir(tmp_path)
    assert main(["test", "-c", str(ROOT / "lightning_config.yaml"), "-c", str(ROOT / "experiments/lm_tiny_shards.yaml"),
                 f"--data.init_args.data_dir={root / 'moved'}", "--data.init_args.seq_len=32",
                 f"--ckpt_path={checkpoint}", *QUIET]) == 0
    assert "test/loss" in capsys.readouterr().out
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["StreamingLMDataModule"]
    StreamingLMDataModule(str(root / "moved")).load_state_dict(state)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents(20)))
    assert main(["data", "prepare", "docs.jsonl", "--out", "bytes", "--holdout-fraction", "0.3"]) == 0
    with pytest.raises(ValueError, match=r"data_dir: 'bytes' is tokenised by a ByteEOSTokenizer of 258 tokens; the "
                                         r"checkpoint was trained on text read by a BPEFileTokenizer of \d+ tokens"):
        StreamingLMDataModule("bytes").load_state_dict(state)


def test_a_checkpoint_of_the_lm_data_carries_its_bpe_and_absolute_paths(tmp_path, monkeypatch, capsys):
    """LMDataModule with a BPE trained on the corpus: data_path and cache_dir, given relative, are recorded absolute,
    and with the corpus and the BPE's cache deleted, the tokenizer is the one trained and eval scores the checkpoint
    from another folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    checkpoint = fit(work, "--data.init_args.tokenizer=bpe", "--data.init_args.bpe_vocab_size=300",
                     "--data.init_args.data_path=corpus.txt", "--data.init_args.cache_dir=cache")
    data = torch.load(checkpoint, map_location="cpu", weights_only=True)["datamodule_hyper_parameters"]
    assert (data["data_path"], data["cache_dir"]) == (str(work / "corpus.txt"), str(work / "cache"))
    trained = checkpoint_tokenizer(checkpoint)
    shutil.rmtree(work / "cache")
    (work / "corpus.txt").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    tokenizer = checkpoint_tokenizer(checkpoint)
    assert type(tokenizer) is BPETokenizer and tokenizer.vocab_size == trained.vocab_size == 300
    assert tokenizer.encode(TEXT) == trained.encode(TEXT) and len(tokenizer.encode(TEXT)) < len(TEXT)
    (elsewhere / "tasks").mkdir()
    write_tasks(elsewhere / "tasks")
    assert main(["eval", "--ckpt_path", str(checkpoint), "--tasks", "tiny_mc", "--include-path", "tasks"]) == 0
    ckpt = Checkpoint.load(checkpoint)
    run = MlflowClient(ckpt.run["tracking_uri"]).get_run(ckpt.run["run_id"])
    assert run.data.metrics["lm_eval/tiny_mc/acc"] == pytest.approx(direct_accuracy_bpe(ckpt.model, tokenizer))


def direct_accuracy_bpe(model, tokenizer) -> float:
    """direct_accuracy of eval_helpers for a tokenizer of any kind: Σ log p of each choice's tokens after the
    question's, from one call's logits."""
    right = []
    for question, choices, answer in MULTIPLE_CHOICE:
        context = tokenizer.encode(question) or [tokenizer.pad_id]
        scores = []
        for choice in choices:
            whole = tokenizer.encode(question + choice) if question else context + tokenizer.encode(choice)
            ids = torch.tensor([whole])
            with torch.no_grad():
                logits, _ = model(ids[:, :-1])
            log_probs = logits[0].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
            scores.append(log_probs[len(context) - 1:].sum().item())
        right.append(max(range(len(choices)), key=lambda i: scores[i]) == answer)
    return sum(right) / len(right)


def test_an_older_checkpoint_whose_corpus_has_gone_is_one_line(shards_checkpoint, tmp_path, monkeypatch):
    """A checkpoint written before checkpoints carried their tokenizer, whose data_dir (recorded relative, as typed)
    is not there from the folder the command runs in: one line naming the corpus, exit code 2 (not a traceback)."""
    monkeypatch.chdir(tmp_path)
    contents = torch.load(shards_checkpoint, map_location="cpu", weights_only=False)
    del contents["StreamingLMDataModule"]
    contents["datamodule_hyper_parameters"]["data_dir"] = "corpus"
    torch.save(contents, tmp_path / "old.ckpt")
    (tmp_path / "held_out.txt").write_text(TEXT)
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "eval", "--ckpt_path", "old.ckpt",
                           "--ppl-by-position", "held_out.txt", "--max-length", "8"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: --ckpt_path: old.ckpt carries no tokenizer that can be read (data_dir: "
                               "'corpus' has no corpus.json")
