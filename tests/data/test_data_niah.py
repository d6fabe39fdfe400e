"""S-NIAH: the needle, its depth and the answer re-derived from the decoded sequences."""
import re

import numpy as np
import pytest
import torch

from atlas_lab.data.corpus import load_corpus
from atlas_lab.data.niah import NOISE, NIAHDataModule
from atlas_lab.lit.metrics import ExactMatch, exact_matches

NEEDLE = re.compile(r"One of the special magic (numbers|words|uuids) for ([a-z]+-[a-z]+) is: ([^ ]+)\. ")
QUESTION = re.compile(r"\nWhat is the special magic (number|word|uuid) for ([a-z]+-[a-z]+) mentioned in the "
                      r"provided text\? The special magic (number|word|uuid) for ([a-z]+-[a-z]+) mentioned in the "
                      r"provided text is$")
FORMATS = {"numbers": r"[1-9][0-9]{6}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
           "words": r"[a-z]+"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "atlas_cache")


def module(cache, variant=1, seed=0, **kw):
    args = dict(lengths=[384, 640], train_lengths=[512], train_size=12, eval_size=30, batch_size=8)
    args.update(kw)
    return NIAHDataModule(variant=variant, cache_dir=cache, seed=seed, **args)


def check_sample(dm, item, length, depth, value_type):
    """Independent check of one sample from its decoded text."""
    ids = item["input_ids"]
    assert len(ids) == length
    start, n = int(item["answer_start"]), int(item["answer_length"])
    assert start + n == length
    prompt, answer = dm.decode(ids[:start]), dm.decode(ids[start:]).strip()
    needles = list(NEEDLE.finditer(prompt))
    assert len(needles) == 1
    kind, key, value = needles[0].groups()
    assert kind == value_type and re.fullmatch(FORMATS[value_type], value)
    question = QUESTION.search(prompt)
    assert question and question.group(2) == question.group(4) == key
    assert answer == value  # the answer is the needle's value
    # depth: bytes of haystack before the needle / all haystack bytes
    haystack_bytes = len(prompt[:question.start()].encode()) - len(needles[0].group(0).encode())
    before = len(prompt[:needles[0].start()].encode())
    assert abs(before / haystack_bytes - depth) < 1e-9
    assert needles[0].start() == 0 or re.search(r"[.!?]['\")\]]*\s$", prompt[:needles[0].start()])  # at a boundary
    labelled = torch.nonzero(item["labels"] != -100).flatten()
    assert labelled.tolist() == list(range(start - 1, length - 1))  # only the answer tokens
    assert torch.equal(item["labels"][labelled], ids[labelled + 1])
    return prompt, needles[0]


@pytest.mark.parametrize("variant,value_type", [(1, "numbers"), (2, "numbers"), (3, "uuids"), (2, "words")])
def test_needle_depth_and_answer(cache, variant, value_type):
    dm = module(cache, variant, value_type=None if variant == 3 or value_type == "numbers" else value_type)
    dm.setup("fit")
    dm.setup("test")
    for split in ("train", "val", "test"):
        ds = dm.datasets[split]
        lengths = [512] * 12 if split == "train" else [384] * 30 + [640] * 30
        for i, length in enumerate(lengths):
            item = ds[i]
            prompt, needle = check_sample(dm, item, length, ds.meta["depth"][i], value_type)
            name = dm.slice_names[int(item["slice"])]
            lo, hi = (int(v) for v in re.fullmatch(rf"L{length}-depth(\d+)-(\d+)", name).groups())
            assert lo / 100 <= ds.meta["depth"][i] <= hi / 100
            if variant == 1:  # the haystack is the noise line, repeated from a sentence start
                hay = prompt[:needle.start()] + prompt[needle.end():prompt.index("\nWhat is")]
                assert hay in NOISE * (len(hay) // len(NOISE) + 3)
    depths = np.asarray(dm.datasets["test"].meta["depth"])
    assert depths.min() < 0.2 and depths.max() > 0.8  # spread over 0..100 %


def test_prose_haystack_comes_from_the_split(cache):
    dm = module(cache, 2)
    dm.setup(None)
    corpus = {s: "".join(d) for s, d in load_corpus(None, cache).items()}
    for split in ("train", "test"):
        text = dm.decode(dm.datasets[split][0]["input_ids"])
        snippet = NEEDLE.sub("", text)[:80]
        assert snippet in corpus[split] and snippet not in corpus["val"]


def test_batches_exact_match_and_determinism(cache):
    dm = module(cache, 3)
    assert dm.vocab_size == 257 and len(dm.slice_names) == 3 * 5
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        for batch in loader:
            assert set(batch) == {"input_ids", "labels", "slice", "answer_start", "answer_length"}
            assert all(v.dtype == torch.long for v in batch.values())
            B, L = batch["input_ids"].shape
            assert batch["slice"].shape == batch["answer_start"].shape == (B,)
            assert len({dm.slice_names[i].split("-")[0] for i in batch["slice"].tolist()}) == 1  # one length
    batch = next(iter(dm.test_dataloader()))
    truth = torch.stack([ids[s:s + n] for ids, s, n in
                         zip(batch["input_ids"], batch["answer_start"], batch["answer_length"])])
    assert exact_matches(truth, batch).all()
    wrong = truth.clone()
    wrong[0, 3] = ord("z")
    assert exact_matches(wrong, batch).tolist() == [False] + [True] * (len(truth) - 1)
    longer = torch.cat([wrong, torch.full((len(truth), 4), ord("z"))], 1)  # tokens past the answer are ignored
    metric = ExactMatch()
    metric.update(list(longer), batch)
    assert float(metric.compute()) == pytest.approx((len(truth) - 1) / len(truth))
    assert dm.answers(batch) == dm.datasets["test"].meta["answer"][:len(truth)]
    again, other = module(cache, 3), module(cache, 3, seed=1)
    for d in (again, other):
        d.setup("test")
    same = [torch.equal(dm.datasets["test"][i]["input_ids"], again.datasets["test"][i]["input_ids"]) for i in range(5)]
    diff = [torch.equal(dm.datasets["test"][i]["input_ids"], other.datasets["test"][i]["input_ids"]) for i in range(5)]
    assert all(same) and not any(diff)


def test_bad_arguments(cache):
    with pytest.raises(ValueError, match="variant"):
        NIAHDataModule(variant=4)
    with pytest.raises(ValueError, match="value_type"):
        NIAHDataModule(value_type="colours")
    dm = module(cache, 1, lengths=[64])
    with pytest.raises(ValueError, match="lengths"):
        dm.setup("test")
