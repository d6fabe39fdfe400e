"""Perplexity by position against a direct computation: each sequence scored in one call, NLL averaged by bucket;
the documents of a prepared split against their text."""
import json

import numpy as np
import pytest
from eval_helpers import SEQ_LEN, TEXT, direct_position_nll, documents

from atlas_lab.data.shards import held_out, prepare
from atlas_lab.eval import Checkpoint, EvalError, ppl_by_position
from atlas_lab.eval.position import position_curve, read_sequences, read_tokens, split_documents


@pytest.mark.parametrize("max_length,buckets", [(3 * SEQ_LEN + 5, 4), (2 * SEQ_LEN, 32)])
def test_bucket_means_are_those_of_one_call_per_sequence(checkpoint, max_length, buckets):
    """Sequences longer than the training length T, read in windows of T through the streaming state, batched 2 at
    a time; buckets of unequal width (53 positions in 4) and of one position each."""
    ckpt = Checkpoint.load(checkpoint)
    tokens = np.frombuffer((TEXT * 8).encode(), dtype=np.uint8).astype(np.int64)
    curve = ppl_by_position(ckpt.model, tokens, max_length, ckpt.seq_len, buckets, batch_size=2, limit=5)
    nll = direct_position_nll(ckpt.model, tokens, max_length, 5)
    edges = [b * max_length // buckets for b in range(buckets + 1)]
    assert curve.edges == edges and curve.sequences == 5
    assert curve.tokens == [5 * (b - a) for a, b in zip(edges[:-1], edges[1:])]
    want = [nll[:, a:b].mean().item() for a, b in zip(edges[:-1], edges[1:])]
    assert curve.nll == pytest.approx(want, rel=1e-5)
    assert curve.ppl == pytest.approx(np.exp(want).tolist(), rel=1e-5)


def test_a_text_file_and_its_token_array_read_alike(checkpoint, tmp_path):
    tokenizer = Checkpoint.load(checkpoint).tokenizer
    (tmp_path / "held_out.txt").write_text(TEXT)
    np.save(tmp_path / "held_out.npy", np.asarray(tokenizer.encode(TEXT), dtype=np.int32))
    text, array = read_tokens(tmp_path / "held_out.txt", tokenizer), read_tokens(tmp_path / "held_out.npy", tokenizer)
    assert np.array_equal(text, array) and text.tolist() == list(TEXT.encode())
    np.save(tmp_path / "bad.npy", np.array([1, 300]))
    with pytest.raises(EvalError, match=r"ids from 1 to 300; expected ids in \[0, 257\)"):
        read_tokens(tmp_path / "bad.npy", tokenizer)
    with pytest.raises(EvalError, match=r"--max-length: 1000 needs 1001 tokens per sequence; the file holds 172"):
        ppl_by_position(Checkpoint.load(checkpoint).model, text, 1000, SEQ_LEN, 4)


def test_a_prepared_split_is_read_as_its_documents_each_from_its_start(shards_checkpoint, tmp_path):
    """The held-out split of a prepared corpus, read back with litdata, is the held-out documents' bytes, each with
    its <eos>, in order (one chunk, and many chunks of unequal sizes); each document at least max_length + 1 tokens
    long gives its first max_length + 1, and the curve over them is that of one call per document."""
    ckpt = Checkpoint.load(shards_checkpoint)
    corpus = shards_checkpoint.parents[2] / "corpus"
    held = [list(d.encode()) + [257] for d in documents(60) if held_out(d, 0, 0.2)]
    assert [d.tolist() for d in split_documents(corpus / "val", ckpt.tokenizer)] == held
    (tmp_path / "docs.jsonl").write_text((corpus.parent / "docs.jsonl").read_text())
    prepare([str(tmp_path / "docs.jsonl")], str(tmp_path / "small"), holdout_fraction=0.2, chunk_bytes=300)
    assert len(json.loads((tmp_path / "small" / "val" / "index.json").read_text())["chunks"]) > 3
    assert [d.tolist() for d in split_documents(tmp_path / "small" / "val", ckpt.tokenizer)] == held
    max_length, buckets = 200, 5
    rows = read_sequences(corpus / "val", ckpt.tokenizer, max_length, buckets)
    long = [d[:max_length + 1] for d in held if len(d) > max_length]
    assert rows.tolist() == long and 2 <= len(long) < len(held)
    assert read_sequences(corpus / "val", ckpt.tokenizer, max_length, buckets, limit=2).tolist() == long[:2]
    curve = position_curve(ckpt.model, rows, ckpt.seq_len, buckets, batch_size=3)  # T = 64 < max_length
    nll = direct_position_nll(ckpt.model, np.concatenate(long), max_length, len(long))
    edges = [b * max_length // buckets for b in range(buckets + 1)]
    assert curve.sequences == len(long) and curve.nll == pytest.approx(
        [nll[:, a:b].mean().item() for a, b in zip(edges[:-1], edges[1:])], rel=1e-5)


def test_a_split_is_refused_when_it_cannot_be_read_as_the_checkpoint_reads(checkpoint, shards_checkpoint, tmp_path):
    corpus = shards_checkpoint.parents[2] / "corpus"
    bytes_eos, bytes_only = Checkpoint.load(shards_checkpoint).tokenizer, Checkpoint.load(checkpoint).tokenizer
    cases = [
        (corpus, bytes_eos, 10, f"--ppl-by-position: {corpus} is a prepared corpus; expected one of its splits, e.g. "
                                f"{corpus / 'val'}"),
        (tmp_path, bytes_eos, 10, f"--ppl-by-position: {tmp_path} is a folder without corpus.json beside it"),
        (corpus / "test", bytes_eos, 10, f"--ppl-by-position: {corpus} has no split 'test'; its splits: train, val"),
        (corpus / "val", bytes_only, 10, "holds tokens of a ByteEOSTokenizer of 258 tokens (" + str(corpus)
         + "); the checkpoint reads text with a ByteTokenizer of 257 tokens: expected a corpus prepared with"),
        (corpus / "val", bytes_eos, 5000, "--max-length: 5000 needs documents of 5001 tokens (with their <eos>); the "
                                          "longest of the "),
    ]
    (corpus / "test").mkdir(exist_ok=True)
    for path, tokenizer, max_length, message in cases:
        with pytest.raises(EvalError) as e:
            read_sequences(path, tokenizer, max_length, 4)
        assert message in str(e.value) and "\n" not in str(e.value)
    (corpus / "test").rmdir()
