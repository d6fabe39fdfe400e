"""Language-modelling data: the Shakespeare conversion, splits, windows, user corpora and tokenizers."""
import numpy as np
import pytest
import torch

from atlas_lab.data.corpus import TEST_PLAYS, VAL_PLAYS, load_corpus, markdown_to_text, shakespeare_plays
from atlas_lab.data.lm import LMDataModule
from atlas_lab.data.tokenizers import BPETokenizer


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "atlas_cache")  # shared by the data test modules of a session


PLAY = """# A Play

## ACT I

### SCENE I. A room.

_Enter ANNE, and
BOB_

**ANNE**  
Good morrow, sir.  
_\\[Aside]_  
How now? he'll __\\[ ]_  
Twice being _\\[by the people chosen]_  

_Exit BOB_

And so farewell.

**BOB**  
[Within]_  
Who calls\\--me?

*Sound a horn.*

## ACT II

Alas—poor wit.
"""


def test_markdown_conversion():
    assert markdown_to_text(PLAY) == (
        "ANNE:\nGood morrow, sir.\nHow now? he'll\nTwice being by the people chosen\nAnd so farewell.\n\n"
        "BOB:\nWho calls--me?\n\nAlas--poor wit.\n")


def test_shakespeare_corpus(cache):
    plays = shakespeare_plays(cache)
    assert len(plays) == 38 and list(plays) == sorted(plays)
    text = "".join(plays.values())
    assert 4_600_000 < len(text) < 5_000_000  # docs/tasks.md: about 4.8 MB
    assert text.isascii() and not set(text) & set("*_#[]\\")
    assert all(line == line.rstrip() for line in text.splitlines())
    assert plays["tragedies/hamlet"].count("HAMLET:") > 300
    assert "Enter" not in plays["tragedies/macbeth"].split("\n")[0]  # stage directions dropped
    corpus = load_corpus(None, cache)
    assert corpus["val"] == [plays[p] for p in VAL_PLAYS] and corpus["test"] == [plays[p] for p in TEST_PLAYS]
    assert len(corpus["train"]) == 34 and not set(corpus["train"]) & set(corpus["val"] + corpus["test"])


def test_lm_windows_and_batches(cache):
    dm = LMDataModule(seq_len=64, batch_size=4, cache_dir=cache)
    assert dm.vocab_size == 257 and dm.bytes_per_token == 1.0  # before setup
    dm.setup("fit")
    dm.setup("test")
    ds = dm.datasets["val"]
    x0, x1 = ds[0], ds[1]
    assert torch.equal(x0["labels"][:-1], x0["input_ids"][1:])  # labels[t] = input_ids[t+1]
    assert x0["labels"][-1] == x1["input_ids"][0]  # windows tile the stream
    text = dm.decode(torch.cat([x0["input_ids"], x0["labels"][-1:]]))
    assert text == "".join(load_corpus(None, cache)["val"])[:65]
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        batch = next(iter(loader))
        assert set(batch) == {"input_ids", "labels"}
        assert batch["input_ids"].shape == batch["labels"].shape == (4, 64)
        assert batch["input_ids"].dtype == torch.long and int(batch["input_ids"].max()) < 256
    assert len(dm.datasets["train"]) == (len(dm.tokens["train"]) - 1) // 64


def test_training_order_is_seeded(cache):
    def first_batch(seed):
        dm = LMDataModule(seq_len=32, batch_size=2, seed=seed, cache_dir=cache)
        return next(iter(dm.train_dataloader()))["input_ids"]

    assert torch.equal(first_batch(0), first_batch(0)) and not torch.equal(first_batch(0), first_batch(1))


def test_user_file_and_folder(tmp_path):
    lines = [f"line {i} of the user corpus." for i in range(400)]
    (tmp_path / "one.txt").write_text("\n".join(lines) + "\n")
    corpus = load_corpus(str(tmp_path / "one.txt"), str(tmp_path / "c"), holdout_fraction=0.1)
    assert "".join(corpus["train"] + corpus["val"] + corpus["test"]) == "\n".join(lines) + "\n"
    assert corpus["val"][0].startswith("line ") and corpus["test"][0].startswith("line ")  # cut at lines
    assert 0.08 < len(corpus["test"][0]) / len("\n".join(lines)) < 0.12
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("beta\n" * 50)
    (folder / "sub" / "a.txt").write_text("alpha\n" * 50)
    (folder / ".hidden").write_text("secret")
    corpus = load_corpus(str(folder), str(tmp_path / "c"))
    text = "".join(corpus["train"] + corpus["val"] + corpus["test"])
    assert text.startswith("beta") and "alpha" in text and "secret" not in text  # b.txt < sub/a.txt
    dm = LMDataModule(data_path=str(folder), seq_len=16, batch_size=2, cache_dir=str(tmp_path / "c"))
    assert next(iter(dm.train_dataloader()))["input_ids"].shape == (2, 16)
    with pytest.raises(ValueError, match="data_path"):
        load_corpus(str(tmp_path / "missing.txt"), str(tmp_path / "c"))


def test_bpe_tokenizer_trained_offline_and_cached(tmp_path):
    words = ["the", "king", "queen", "crown", "sword", "night", "day", "love", "death", "honour"]
    rng = np.random.default_rng(0)
    text = "\n".join(" ".join(rng.choice(words, 12)) + "." for _ in range(600)) + "\n"
    (tmp_path / "corpus.txt").write_text(text)
    cache = str(tmp_path / "cache")
    dm = LMDataModule(data_path=str(tmp_path / "corpus.txt"), tokenizer="bpe", bpe_vocab_size=300, seq_len=16,
                      batch_size=2, cache_dir=cache)
    assert dm.vocab_size == 300 and dm.bytes_per_token is None
    dm.setup("fit")
    tok = dm.tokenizer
    assert len(list((tmp_path / "cache" / "bpe").glob("*.json"))) == 1
    assert tok.decode(tok.encode("the king's sword, at night")) == "the king's sword, at night"
    assert len(tok.encode(" honour")) == 1  # a merged word
    assert dm.bytes_per_token > 2.0 and max(int(dm.tokens[s].max()) for s in dm.tokens) < 300
    again = BPETokenizer(load_corpus(str(tmp_path / "corpus.txt"), cache)["train"], 300, cache)
    assert again.encode(text[:200]) == tok.encode(text[:200])
    batch = next(iter(dm.val_dataloader()))
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])


def test_bad_arguments(cache):
    with pytest.raises(ValueError, match="tokenizer"):
        LMDataModule(tokenizer="words")
    with pytest.raises(ValueError, match="bpe_vocab_size"):
        LMDataModule(tokenizer="bpe", bpe_vocab_size=100)
    with pytest.raises(ValueError, match="seq_len"):
        LMDataModule(seq_len=0)


@pytest.mark.parametrize("name", ["LMDataModule", "NIAHDataModule", "BABILongDataModule"])
def test_every_text_task_takes_the_corpus_arguments_of_text_corpus(name, tmp_path):
    """The corpus arguments, written once (TextCorpus), are each text task's options on the command line
    (data.init_args.<field>) and its recorded hyper-parameters (data_path and cache_dir absolute)."""
    import dataclasses

    from jsonargparse import ArgumentParser

    import atlas_lab.data
    from atlas_lab.data.corpus import TextCorpus

    cls = getattr(atlas_lab.data, name)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "data")
    fields = {f.name: f.default for f in dataclasses.fields(TextCorpus)}
    defaults = parser.get_defaults()["data"]
    assert {k: defaults[k] for k in fields} == fields
    (tmp_path / "text.txt").write_text("To be, or not to be.\n" * 200)
    args = parser.parse_args(["--data.data_path=text.txt", "--data.holdout_fraction=0.1", "--data.cache_dir=c"])
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        dm = cls(**args["data"].as_dict())
    assert {k: dm.hparams[k] for k in fields} == {**fields, "data_path": str(tmp_path / "text.txt"),
                                                   "holdout_fraction": 0.1, "cache_dir": str(tmp_path / "c")}
    assert dm.vocab_size == 257 and dm.text.kind.name == "byte"
