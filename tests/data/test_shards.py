"""Tokenised corpora as litdata shards: what prepare writes, the held-out split, the tokenizers, and bad input."""
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import chunk_tokens

from atlas_lab.cli import main
from atlas_lab.data.shards import load_tokenizer, prepare
from atlas_lab.data.tokenizers import BPEFileTokenizer, ByteEOSTokenizer

WORDS = ["alpha", "beta", "gamma", "naïve", "δέλτα", "日本語", "end.", "\n", "<eos>"]  # "<eos>" as text, not a token


def documents(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"doc {i}: " + " ".join(rng.choice(WORDS, size=rng.integers(1, 40))) for i in range(n)]


def write_corpus(folder: Path, docs: list[str]) -> list[str]:
    """docs[:4] as a.txt … d.txt, the rest as e.jsonl (with another key, a blank line and an empty document,
    which is skipped); returns the inputs [glob of the .txt files, the .jsonl file]."""
    folder.mkdir(exist_ok=True)
    for name, doc in zip("abcd", docs[:4]):
        (folder / f"{name}.txt").write_text(doc, encoding="utf-8")
    lines = [json.dumps({"id": i, "text": doc}) for i, doc in enumerate(docs[4:])]
    lines[2:2] = ["", json.dumps({"text": ""})]
    (folder / "e.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [str(folder / "*.txt"), str(folder / "e.jsonl")]


def split_documents(out: Path, split: str, tokenizer) -> list[str]:
    """The documents of a split, decoded from its chunks: the token stream cut after every <eos>."""
    stream = np.concatenate(chunk_tokens(out / split)).astype(np.int64)
    assert stream[-1] == tokenizer.eos_id
    ends = np.flatnonzero(stream == tokenizer.eos_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokenizer.decode(stream[a:b].tolist()) for a, b in zip(starts, ends)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    docs = documents(200)
    inputs = write_corpus(root / "in", docs)
    info = prepare(inputs, str(root / "out"), holdout_fraction=0.2, chunk_bytes=512, num_workers=2)
    return root, docs, inputs, info


def test_prepare_writes_every_document_once_with_its_end_token(corpus):
    """Each split's shards decode back to its documents, in input order, each followed by <eos>; together the
    splits hold every document once; corpus.json counts them."""
    root, docs, inputs, info = corpus
    tok = load_tokenizer(root / "out")
    assert isinstance(tok, ByteEOSTokenizer) and (tok.vocab_size, tok.pad_id, tok.eos_id) == (258, 256, 257)
    train, val = (split_documents(root / "out", s, tok) for s in ("train", "val"))
    assert sorted(train + val) == sorted(docs) and not set(train) & set(val)
    assert train == [d for d in docs if d not in set(val)] and val == [d for d in docs if d in set(val)]
    assert 20 < len(val) < 60  # 200 documents, holdout_fraction 0.2
    assert len(json.loads((root / "out" / "train" / "index.json").read_text())["chunks"]) > 10
    for split, texts in (("train", train), ("val", val)):
        counts = info["splits"][split]
        assert counts == {"documents": len(texts), "bytes": sum(len(t.encode()) for t in texts),
                          "tokens": sum(len(t.encode()) + 1 for t in texts)}
    assert info["tokenizer"] == "byte" and info["dtype"] == "uint16" and info["inputs"] == inputs
    assert info["files"] == [str(root / "in" / f) for f in ("a.txt", "b.txt", "c.txt", "d.txt", "e.jsonl")]
    assert json.loads((root / "out" / "corpus.json").read_text()) == info
    assert sorted(p.name for p in (root / "out").iterdir()) == ["corpus.json", "train", "val"]


def test_held_out_split_is_stable(corpus, tmp_path):
    """The held-out documents depend on the documents and the seed only: the same set from the inputs in another
    order (one worker), another set with another seed."""
    root, docs, inputs, _ = corpus
    tok = ByteEOSTokenizer()
    val = set(split_documents(root / "out", "val", tok))
    prepare(inputs[::-1], str(tmp_path / "reordered"), holdout_fraction=0.2, chunk_bytes=512)
    assert set(split_documents(tmp_path / "reordered", "val", tok)) == val
    prepare(inputs, str(tmp_path / "seed1"), holdout_fraction=0.2, seed=1, chunk_bytes=512)
    assert set(split_documents(tmp_path / "seed1", "val", tok)) != val


def test_byte_tokenizer_round_trips_text():
    tok = ByteEOSTokenizer()
    text = "naïve δέλτα 日本語\n"
    assert tok.encode(text) == list(text.encode("utf-8")) and tok.decode(tok.encode(text)) == text
    assert tok.decode([*tok.encode("ab"), tok.eos_id, tok.pad_id, *tok.encode("c")]) == "abc"


def test_bpe_tokenizer_trains_round_trips_and_prepares(corpus, tmp_path, monkeypatch, capsys):
    """`atlas-lab data tokenizer` trains a BPE with <pad> = 0 and <eos> = 1 that round-trips text; `atlas-lab data
    prepare --tokenizer` writes shards that decode back to the documents, with a copy of the tokenizer."""
    root, docs, inputs, _ = corpus
    monkeypatch.chdir(tmp_path)
    assert main(["data", "tokenizer", *inputs, "--out", "tok.json", "--vocab-size", "300"]) == 0
    tok = BPEFileTokenizer("tok.json")
    assert (tok.pad_id, tok.eos_id) == (0, 1) and 258 < tok.vocab_size <= 300
    for text in docs[:20] + ["unseen words: zebra Ω\n", "<pad><eos>"]:
        assert tok.decode(tok.encode(text)) == text and tok.eos_id not in tok.encode(text)
    assert len(tok.encode(docs[5])) < len(docs[5].encode("utf-8"))  # merges were learned
    assert main(["data", "prepare", *inputs, "--out", "bpe", "--tokenizer", "tok.json", "--holdout-fraction", "0.2",
                 "--workers", "2"]) == 0
    assert "bpe: train" in capsys.readouterr().out
    info = json.loads(Path("bpe/corpus.json").read_text())
    assert (info["tokenizer"], info["vocab_size"], info["eos_id"], info["pad_id"]) == ("bpe", tok.vocab_size, 1, 0)
    assert Path("bpe/tokenizer.json").read_bytes() == Path("tok.json").read_bytes()
    loaded = load_tokenizer("bpe")
    train, val = (split_documents(Path("bpe"), s, loaded) for s in ("train", "val"))
    assert sorted(train + val) == sorted(docs)
    assert set(val) == set(split_documents(root / "out", "val", ByteEOSTokenizer()))  # the split ignores tokens
    assert info["splits"]["train"]["tokens"] == sum(len(tok.encode(d)) + 1 for d in train)


def test_parquet_documents_are_read_from_their_column(tmp_path):
    """And prepare leaves nothing but out_dir, and the process as it was (litdata.optimize's scratch folders and
    SIGINT handler)."""
    import os
    import signal

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents(30, seed=1)
    pq.write_table(pa.table({"body": docs + [None, ""], "n": list(range(32))}), tmp_path / "a.parquet")
    handler = signal.getsignal(signal.SIGINT)
    prepare([str(tmp_path / "a.parquet")], str(tmp_path / "out"), text_field="body", holdout_fraction=0.3)
    assert signal.getsignal(signal.SIGINT) is handler and "DATA_OPTIMIZER_CACHE_FOLDER" not in os.environ
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "out"]
    tok = ByteEOSTokenizer()
    assert sorted(split_documents(tmp_path / "out", "train", tok) + split_documents(tmp_path / "out", "val", tok)) \
        == sorted(docs)


def _tokenizer_without_eos(path: Path) -> None:
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE())
    tok.add_special_tokens(["<pad>"])
    tok.save(str(path))


BAD = {  # case: (arguments of `atlas-lab data ...`, the message)
    "no match": (["prepare", "nothing/*.txt", "--out", "o"], "INPUT: no file matches 'nothing/*.txt'"),
    "missing file": (["prepare", "absent.txt", "--out", "o"], "INPUT: no such file: 'absent.txt'"),
    "folder": (["prepare", "in", "--out", "o"], "INPUT: 'in' is a folder; expected a file or a glob pattern"),
    "suffix": (["prepare", "in/*.txt", "table.csv", "--out", "o"],
               "INPUT: 'table.csv' has the suffix '.csv'; expected one of: .txt, .jsonl, .parquet"),
    "empty file": (["prepare", "in/*", "empty.txt", "--out", "o"], "INPUT: 'empty.txt' is empty"),
    "not UTF-8": (["prepare", "in/*", "binary.txt", "--out", "o"], "INPUT: 'binary.txt' is not UTF-8 text"),
    "missing key": (["prepare", "in/*", "nokey.jsonl", "--out", "o"],
                    "--text-field: 'nokey.jsonl' line 2 has no key 'text'; expected an object with the text in "
                    "'text' (its keys: body)"),
    "other field": (["prepare", "in/*", "--out", "o", "--text-field", "body"], "line 2 has no key 'body'"),
    "not JSON": (["prepare", "in/*", "broken.jsonl", "--out", "o"], "INPUT: 'broken.jsonl' line 2 is not valid JSON"),
    "not a string": (["prepare", "in/*", "number.jsonl", "--out", "o"],
                     "--text-field: 'number.jsonl' line 1: 'text' is int; expected a string"),
    "no column": (["prepare", "in/*", "table.parquet", "--out", "o"],
                  "--text-field: 'table.parquet' has no column 'text'; its columns: body"),
    "tokenizer file": (["prepare", "in/*", "--out", "o", "--tokenizer", "garbage.json"],
                       "--tokenizer: 'garbage.json' does not load as a tokenizer.json"),
    "tokenizer name": (["prepare", "in/*", "--out", "o", "--tokenizer", "bpe"],
                       "--tokenizer: expected 'byte' or the path of a tokenizer.json"),
    "tokenizer specials": (["prepare", "in/*", "--out", "o", "--tokenizer", "noeos.json"],
                           "--tokenizer: 'noeos.json' has no <eos> token"),
    "out not empty": (["prepare", "in/*", "--out", "full"], "--out: 'full' exists and is not empty"),
    "out parent": (["prepare", "in/*", "--out", "no/such/dir"], "--out: the folder 'no/such' does not exist"),
    "no validation": (["prepare", "in/*", "--out", "o", "--holdout-fraction", "0.000001"],
                      "--holdout-fraction: 1e-06 leaves the val split empty (3 documents)"),
    "fraction range": (["prepare", "in/*", "--out", "o", "--holdout-fraction", "1"],
                       "--holdout-fraction: expected a number in (0, 1), got '1'"),
    "workers": (["prepare", "in/*", "--out", "o", "--workers", "0"], "--workers: expected an int >= 1, got '0'"),
    "no output": (["prepare", "in/*"], "the following arguments are required: --out"),
    "vocab size": (["tokenizer", "in/*", "--out", "t.json", "--vocab-size", "100"],
                   "--vocab-size: expected an int >= 259, got '100'"),
    "tokenizer exists": (["tokenizer", "in/*", "--out", "garbage.json", "--vocab-size", "300"],
                         "--out: 'garbage.json' exists; expected the path of a new file"),
    "tokenizer input": (["tokenizer", "in/*", "nokey.jsonl", "--out", "t.json", "--vocab-size", "300"],
                        "--text-field: 'nokey.jsonl' line 2 has no key 'text'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, tmp_path, monkeypatch, capsys):
    """Every bad input of `atlas-lab data`: one line naming the file or flag, what was expected and the choices,
    exit code 2, and the folder as it was (the bad file comes after good documents were tokenised)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    args, message = BAD[case]
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("in"), documents(3))
    Path("empty.txt").write_text("")
    Path("binary.txt").write_bytes(bytes(range(256)))
    Path("nokey.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    Path("broken.jsonl").write_text('{"text": "a"}\n{"text": \n')
    Path("number.jsonl").write_text('{"text": 5}\n')
    Path("table.csv").write_text("text\na\n")
    Path("garbage.json").write_text("{not a tokenizer")
    _tokenizer_without_eos(Path("noeos.json"))
    pq.write_table(pa.table({"body": ["a"]}), "table.parquet")
    Path("full").mkdir()
    Path("full/x").write_text("x")
    before = sorted(Path(".").rglob("*"))
    assert main(["data", *args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    assert sorted(Path(".").rglob("*")) == before


def test_prepare_without_litdata_names_the_extra(corpus, tmp_path, monkeypatch, capsys):
    """Where litdata is not installed (here: hidden from import), `atlas-lab data prepare` is one line naming the
    extra that brings it, exit code 2, and writes nothing."""
    import sys

    _, _, inputs, _ = corpus
    monkeypatch.setitem(sys.modules, "litdata", None)
    assert main(["data", "prepare", *inputs, "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pip install 'atlas-lab[lm]'" in lines[0]
    assert list(tmp_path.iterdir()) == []
