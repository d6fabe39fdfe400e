"""Perplexity by position against a direct computation: each sequence scored in one call, NLL averaged by bucket."""
import numpy as np
import pytest
from eval_helpers import SEQ_LEN, TEXT, direct_position_nll

from atlas_lab.eval import Checkpoint, EvalError, ppl_by_position
from atlas_lab.eval.position import read_tokens


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
