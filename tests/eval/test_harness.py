"""The harness's model "atlas-lab" against a direct computation from the model's logits (one call over a whole
sequence): multiple-choice accuracy, rolling perplexity, reading past the training window, stop strings."""
import math
import re

import pytest
import torch
from eval_helpers import DOCUMENTS, MULTIPLE_CHOICE, PAD, SEQ_LEN, TEXT, direct, direct_accuracy
from lm_eval.api.instance import Instance

import atlas_lab.eval  # noqa: F401  (registers "atlas-lab")
from atlas_lab.eval import AtlasLM, Checkpoint, EvalError, checkpoint_tokenizer


def evaluate(checkpoint, tasks_dir, names, **kwargs):
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    return lm_eval.simple_evaluate(model="atlas-lab", model_args=f"checkpoint={checkpoint}", tasks=names,
                                   task_manager=manager, log_samples=False, **kwargs)["results"]


def test_multiple_choice_accuracy_is_that_of_the_logits(checkpoint, tasks):
    results = evaluate(checkpoint, tasks, ["tiny_mc"], batch_size=3)["tiny_mc"]
    assert results["acc,none"] == pytest.approx(direct_accuracy(Checkpoint.load(checkpoint).model, MULTIPLE_CHOICE))


def test_loglikelihood_batched_and_right_padded_equals_one_sequence_at_a_time(checkpoint):
    lm = AtlasLM(str(checkpoint), batch_size=4)
    # (a context ending in whitespace would move it into the continuation, as the harness splits text)
    pairs = [(q or "", c) for q, choices, _ in MULTIPLE_CHOICE for c in choices] + [(TEXT.rstrip() * 2, " The end")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests)
    for (context, continuation), (log_prob, greedy) in zip(pairs, got):
        tokens = (list(context.encode()) or [PAD]) + list(continuation.encode())
        want, want_greedy = direct(lm.model, tokens, len(continuation.encode()))
        assert log_prob == pytest.approx(want, rel=1e-5, abs=1e-4) and greedy == want_greedy


def test_rolling_perplexity_is_that_of_the_logits(checkpoint, tasks):
    results = evaluate(checkpoint, tasks, ["tiny_ppl"], batch_size=2)["tiny_ppl"]
    model = Checkpoint.load(checkpoint).model
    total = sum(direct(model, [PAD] + list(d.encode()), len(d.encode()))[0] for d in DOCUMENTS)
    words = sum(len(re.split(r"\s+", d)) for d in DOCUMENTS)
    n_bytes = sum(len(d.encode()) for d in DOCUMENTS)
    assert results["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-5)
    assert results["byte_perplexity,none"] == pytest.approx(math.exp(-total / n_bytes), rel=1e-5)
    assert results["bits_per_byte,none"] == pytest.approx(-total / n_bytes / math.log(2), rel=1e-5)


@pytest.mark.parametrize("window", [SEQ_LEN, 5])
def test_rolling_loglikelihood_past_the_window_is_the_one_call_loglikelihood(checkpoint, window):
    """A document of 21 training windows, read window by window through the streaming state (SWA ring and Mamba-2
    memory carried over), scores every token once, exactly as one call over the whole document."""
    lm = AtlasLM(str(checkpoint), max_length=window)
    document = TEXT * 2
    assert len(document.encode()) > 20 * SEQ_LEN
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (document,), 0)])
    want, _ = direct(lm.model, [PAD] + list(document.encode()), len(document.encode()))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)
    assert got < 0


def test_generate_until_stops_at_the_stop_string(checkpoint):
    lm = AtlasLM(str(checkpoint))
    prompt = "To be, or not to be: that"
    ids = torch.tensor([list(prompt.encode())])
    full = lm.tokenizer.decode(lm.model.generate(ids, 60)[0][0].tolist())  # greedy, one call
    stop = full[20:22]  # a string the greedy text reaches after at least 20 characters
    first = full.index(stop)
    requests = [Instance("generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 60}), 0),
                Instance("generate_until", {}, (prompt, {"until": ["\u00a7"], "max_gen_toks": 37}), 1)]
    stopped, unstopped = lm.generate_until(requests)
    assert stopped == full[:first] and stop not in stopped
    assert unstopped == lm.tokenizer.decode(lm.model.generate(ids, 37)[0][0].tolist())  # max_gen_toks, no stop
    with pytest.raises(EvalError, match=r"unknown generation options \['top_k'\]"):
        lm.generate_until([Instance("generate_until", {}, (prompt, {"until": ["x"], "top_k": 5}), 0)])


def test_checkpoint_tokenizer_is_the_data_modules(checkpoint):
    tokenizer = checkpoint_tokenizer(checkpoint)
    assert (tokenizer.vocab_size, tokenizer.pad_id, tokenizer.eos_id) == (257, PAD, None)
    assert tokenizer.encode("to be") == list(b"to be") and tokenizer.decode(list(b"to be")) == "to be"
