"""BABILong: every answer re-derived by simulating the facts found in the decoded sequence."""
import re

import pytest
import torch

from atlas_lab.data.babilong import BABILongDataModule
from atlas_lab.lit.metrics import exact_matches

MOVE = re.compile(r"^(\w+) (?:moved to|went to|went back to|journeyed to|travelled to) the (\w+)\.$")
GET = re.compile(r"^(\w+) (?:got|picked up|grabbed|took) the (\w+) there\.$")
DROP = re.compile(r"^(\w+) (?:dropped|put down|discarded|left) the (\w+)\.$")
GIVE = re.compile(r"^(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\.$")
RELATION = re.compile(r"^The (\w+) is (north|south|east|west) of the (\w+)\.$")
FACT = re.compile(r"(?:[A-Z][a-z]+ (?:moved to|went to|went back to|journeyed to|travelled to) the \w+\."
                  r"|[A-Z][a-z]+ (?:got|picked up|grabbed|took) the \w+ there\."
                  r"|[A-Z][a-z]+ (?:dropped|put down|discarded|left) the (?:apple|football|milk)\."
                  r"|[A-Z][a-z]+ (?:gave|handed|passed) the \w+ to [A-Z][a-z]+\."
                  r"|The \w+ is (?:north|south|east|west) of the \w+\.) ")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def solve(facts, question):
    """Answer a bAbI question by replaying the facts (written independently of the generator)."""
    where, carrier, dropped_at, path, gives, relations = {}, {}, {}, {}, [], set()
    for fact in facts:
        if m := MOVE.match(fact):
            where[m[1]] = m[2]
            for obj, who in carrier.items():
                if who == m[1] and path[obj][-1] != m[2]:
                    path[obj].append(m[2])
        elif m := GET.match(fact):
            assert m[2] not in carrier and dropped_at.get(m[2], where[m[1]]) == where[m[1]]
            carrier[m[2]] = m[1]
            dropped_at.pop(m[2], None)
            if not path.get(m[2]) or path[m[2]][-1] != where[m[1]]:
                path.setdefault(m[2], []).append(where[m[1]])
        elif m := DROP.match(fact):
            assert carrier.pop(m[2]) == m[1]
            dropped_at[m[2]] = where[m[1]]
        elif m := GIVE.match(fact):
            assert carrier[m[2]] == m[1] and where[m[1]] == where[m[3]]
            carrier[m[2]] = m[3]
            gives.append((m[1], m[2], m[3]))
        elif m := RELATION.match(fact):
            relations |= {(m[1], m[2], m[3]), (m[3], OPPOSITE[m[2]], m[1])}
        else:
            raise AssertionError(f"not a bAbI fact: {fact!r}")
    if m := re.fullmatch(r"Where is (\w+)\?", question):
        return where[m[1]]
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        return where[carrier[m[1]]] if m[1] in carrier else dropped_at[m[1]]
    if m := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question):
        assert path[m[1]].count(m[2]) == 1
        return path[m[1]][path[m[1]].index(m[2]) - 1]
    if m := re.fullmatch(r"What is (\w+) of the (\w+)\?", question):
        (answer,) = {x for x, d, y in relations if (d, y) == (m[1], m[2])}
        return answer
    if m := re.fullmatch(r"What is the (\w+) (\w+) of\?", question):
        (answer,) = {y for x, d, y in relations if (x, d) == (m[1], m[2])}
        return answer
    if m := re.fullmatch(r"What did (\w+) give to (\w+)\?", question):
        return [o for g, o, r in gives if (g, r) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"Who gave the (\w+) to (\w+)\?", question):
        return [g for g, o, r in gives if (o, r) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"Who did (\w+) give the (\w+) to\?", question):
        return [r for g, o, r in gives if (g, o) == (m[1], m[2])][-1]
    if m := re.fullmatch(r"Who received the (\w+)\?", question):
        return [r for g, o, r in gives if o == m[1]][-1]
    raise AssertionError(f"unknown question {question!r}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "atlas_cache")


@pytest.fixture(scope="module")
def dm(cache):
    dm = BABILongDataModule(lengths=[0, 1200], train_lengths=[0], train_size=40, eval_size=40, batch_size=16,
                            cache_dir=cache)
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.mark.parametrize("split", ["train", "test"])
def test_answers_follow_from_the_inserted_facts(dm, split):
    ds = dm.datasets[split]
    seen_questions = set()
    for i in range(len(ds)):
        item = ds[i]
        task, length = re.fullmatch(r"(qa\d)-L(\d+)", dm.slice_names[int(item["slice"])]).groups()
        start, n = int(item["answer_start"]), int(item["answer_length"])
        prompt, answer = dm.decode(item["input_ids"][:start]), dm.decode(item["input_ids"][start:]).strip()
        context, question = re.fullmatch(r"(.*)\nQuestion: (.*)\nAnswer:", prompt, re.S).groups()
        facts = [m.group(0)[:-1] for m in FACT.finditer(context)]
        assert facts == ds.meta["facts"][i]  # all facts present, in order
        assert answer == ds.meta["answer"][i] == solve(facts, question)
        seen_questions.add((task, question.split()[0], question.split()[1]))
        if length == "0":
            assert context == "".join(f + " " for f in facts)  # no background text
        else:  # facts sit at sentence boundaries of the background text; length exact when the story fits
            for m in FACT.finditer(context):
                assert m.start() == 0 or re.search(r"(?:[.!?]['\")\]]*\s|\. )$", context[:m.start()])
            alone = context == "".join(f + " " for f in facts)  # a story too long for the length keeps its own
            assert len(item["input_ids"]) == int(length) or (len(item["input_ids"]) > int(length) and alone)
        labelled = torch.nonzero(item["labels"] != -100).flatten()
        assert labelled.tolist() == list(range(start - 1, start + n - 1))
        assert torch.equal(item["labels"][labelled], item["input_ids"][labelled + 1])
    assert {t for t, _, _ in seen_questions} == {"qa1", "qa2", "qa3", "qa4", "qa5"}
    assert {(w1, w2) for t, w1, w2 in seen_questions if t == "qa5"} >= {("What", "did"), ("Who", "gave"),
                                                                       ("Who", "received")}


def test_batches_padding_and_exact_match(dm):
    assert dm.vocab_size == 257 and dm.pad_id == 256
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        for batch in loader:
            assert set(batch) == {"input_ids", "labels", "slice", "answer_start", "answer_length"}
            assert len(set(batch["slice"].tolist())) == 1
            ends = batch["answer_start"] + batch["answer_length"]
            for row, lab, end in zip(batch["input_ids"], batch["labels"], ends.tolist()):
                assert (row[end:] == dm.pad_id).all() and (lab[end - 1:] == -100).all()  # right padding
                assert (row[:end] != dm.pad_id).all()
    batch = next(iter(dm.test_dataloader()))
    A = int(batch["answer_length"].max())
    truth = torch.stack([torch.nn.functional.pad(ids[s:s + n], (0, A - n), value=dm.pad_id) for ids, s, n in
                         zip(batch["input_ids"], batch["answer_start"], batch["answer_length"])])
    assert exact_matches(truth, batch).all()  # the padding past each answer is ignored
    assert not exact_matches(torch.roll(truth, 1, dims=0), batch).all()


def test_determinism(cache):
    def texts(seed):
        d = BABILongDataModule(tasks=["qa2", "qa5"], lengths=[600], train_lengths=[0], eval_size=6, seed=seed,
                               cache_dir=cache)
        d.setup("test")
        return [d.decode(d.datasets["test"][i]["input_ids"]) for i in range(12)]

    assert texts(0) == texts(0) and texts(0) != texts(1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="tasks"):
        BABILongDataModule(tasks=["qa6"])
    with pytest.raises(ValueError, match="lengths"):
        BABILongDataModule(lengths=[-1])
