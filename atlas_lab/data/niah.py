"""S-NIAH: single needle in a haystack, RULER's S-NIAH-1/2/3 (Hsieh et al. 2024; docs/tasks.md §3)."""
from __future__ import annotations

import uuid
from functools import lru_cache
from importlib import resources

import numpy as np

from .base import AnswerMixin, SequenceDataset, TaskDataModule, qa_sequence, split_rng
from .checks import check, check_choice
from .corpus import Haystack, TextCorpus, document_pieces

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
VARIANTS = {1: ("noise", "numbers"), 2: ("prose", "numbers"), 3: ("prose", "uuids")}  # haystack, value type
VALUE_TYPES = {"numbers": "number", "words": "word", "uuids": "uuid"}  # plural (needle) -> singular (question)


@lru_cache(maxsize=1)
def word_lists() -> tuple[list[str], list[str]]:
    """(adjectives, nouns): lowercase alphabetic words of the `wonderwords` lists, profanity removed."""
    assets = resources.files("wonderwords") / "assets"

    def read(name):
        return [w.strip() for w in (assets / name).read_text(encoding="utf-8").splitlines()]

    banned = set(read("profanitylist.txt"))
    return tuple([w for w in read(f) if w.isalpha() and w.islower() and w not in banned]
                 for f in ("adjectivelist.txt", "nounlist.txt"))


def needle_texts(value_type: str, key: str, value: str) -> tuple[str, str, str]:
    """(needle, question + answer prefix, answer) — the strings of one NIAH sample."""
    one = VALUE_TYPES[value_type]
    needle = f"One of the special magic {value_type} for {key} is: {value}. "
    question = (f"\nWhat is the special magic {one} for {key} mentioned in the provided text? "
                f"The special magic {one} for {key} mentioned in the provided text is")
    return needle, question, f" {value}"


def random_value(rng: np.random.Generator, value_type: str) -> str:
    if value_type == "numbers":
        return str(rng.integers(1_000_000, 10_000_000))  # 7 digits
    if value_type == "words":
        nouns = word_lists()[1]
        return nouns[rng.integers(len(nouns))]
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


class NIAHDataModule(AnswerMixin, TaskDataModule):
    """S-NIAH sequences: haystack with the needle inserted at a sentence boundary, then the question.

    Layout (one sequence of exactly `length` tokens):
        haystack[:d] + "One of the special magic numbers for {key} is: {value}. " + haystack[d:]
        + "\\nWhat is the special magic number for {key} mentioned in the provided text? The special magic
        number for {key} mentioned in the provided text is" + " {value}"
    Batch: input_ids, labels [B, length] (labels only on the answer tokens), slice [B] (length × depth bucket:
    "L1024-depth0-20", …), answer_start [B], answer_length [B]; one length per batch. Depth = needle offset /
    haystack tokens, drawn uniform over [0, 1] then moved to the nearest sentence boundary; the dataset's
    meta["depth"] holds the exact value, meta["answer"] the value string.
    Haystack: S-NIAH-1 the noise line repeated; S-NIAH-2/3 prose from the corpus split of the same name
    (test samples read the test plays, training samples the training plays).
    """

    def __init__(self, variant: int = 1, value_type: str | None = None,
                 lengths: list[int] = [1024, 2048, 4096, 8192, 16384], train_lengths: list[int] = [1024],
                 train_size: int = 2000, eval_size: int = 100, depth_buckets: int = 5,
                 batch_size: int = 8, seed: int = 0, num_workers: int = 0, **corpus):
        """
        Args:
            variant: 1 (noise haystack, numbers) | 2 (prose, numbers) | 3 (prose, UUIDs).
            value_type: None (the variant's) | "numbers" (7 digits) | "words" | "uuids".
            lengths: total sequence lengths (tokens) of the val and test sets.
            train_lengths: total sequence lengths of the training set.
            train_size: training sequences per train length.
            eval_size: val and test sequences per length.
            depth_buckets: number of equal depth ranges reported as slices.
            batch_size: sequences per batch.
            seed: seeds the data (every split) and the training order.
            num_workers: DataLoader worker processes.
            corpus: the prose and its tokenizer (``corpus.TextCorpus``: data_path, tokenizer, bpe_vocab_size,
                holdout_fraction, cache_dir).
        """
        super().__init__(batch_size, seed, num_workers)
        check_choice("variant", variant, tuple(VARIANTS))
        check(value_type is None or value_type in VALUE_TYPES, "value_type",
              f"expected None or one of {', '.join(VALUE_TYPES)}, got {value_type!r}")
        check(len(lengths) > 0 and len(train_lengths) > 0, "lengths", "expected non-empty lengths and train_lengths")
        check(train_size >= 1 and eval_size >= 1, "train_size", f"expected train_size and eval_size >= 1, got "
              f"{train_size}, {eval_size}")
        check(depth_buckets >= 1, "depth_buckets", f"expected an int >= 1, got {depth_buckets}")
        self.variant, self.haystack_kind = variant, VARIANTS[variant][0]
        self.value_type = value_type or VARIANTS[variant][1]
        self.lengths, self.train_lengths = list(lengths), list(train_lengths)
        self.train_size, self.eval_size, self.depth_buckets = train_size, eval_size, depth_buckets
        self.text = TextCorpus(**corpus)
        self.text.record(self)
        self.vocab_size = self.text.vocab_size
        edges = np.linspace(0, 100, depth_buckets + 1).round().astype(int)
        self.all_lengths = list(dict.fromkeys(self.train_lengths + self.lengths))
        self.slice_names = [f"L{n}-depth{edges[b]}-{edges[b + 1]}" for n in self.all_lengths
                            for b in range(depth_buckets)]
        self.tokenizer, self.corpus = None, None

    def prepare(self) -> None:
        if self.tokenizer is not None:
            return
        if self.haystack_kind == "prose" or self.text.kind.trains_on_corpus:
            self.corpus = self.text.read()
        self.tokenizer = self.text.build_tokenizer(self.corpus)
        self.pad_id = self.tokenizer.pad_id

    def build(self, split: str) -> SequenceDataset:
        self.prepare()
        text = NOISE if self.haystack_kind == "noise" else "".join(document_pieces(self.corpus[split]))
        haystack = Haystack(text, self.tokenizer)
        adjectives, nouns = word_lists()
        lengths, count = (self.train_lengths, self.train_size) if split == "train" else (self.lengths, self.eval_size)
        inputs, labels = [], []
        fields = {"slice": [], "answer_start": [], "answer_length": []}
        meta = {"depth": [], "answer": []}
        for i, length in enumerate(lengths):
            rng = split_rng(self.seed, split, i)
            for _ in range(count):
                key = f"{adjectives[rng.integers(len(adjectives))]}-{nouns[rng.integers(len(nouns))]}"
                value = random_value(rng, self.value_type)
                needle, question, answer = (np.asarray(self.tokenizer.encode(t), dtype=np.int32)
                                            for t in needle_texts(self.value_type, key, value))
                n_hay = length - len(needle) - len(question) - len(answer)
                check(n_hay >= 0, "lengths", f"{length} tokens cannot hold the needle, question and answer "
                      f"({length - n_hay} tokens); expected lengths >= {length - n_hay}")
                hay, bounds = haystack.window(rng, n_hay)
                at = bounds[np.abs(bounds - rng.random() * n_hay).argmin()]
                depth = at / max(n_hay, 1)
                x, y = qa_sequence(np.concatenate([hay[:at], needle, hay[at:], question]), answer)
                bucket = min(int(depth * self.depth_buckets), self.depth_buckets - 1)
                inputs.append(x)
                labels.append(y)
                fields["slice"].append(self.all_lengths.index(length) * self.depth_buckets + bucket)
                fields["answer_start"].append(length - len(answer))
                fields["answer_length"].append(len(answer))
                meta["depth"].append(float(depth))
                meta["answer"].append(value)
        fields = {k: np.asarray(v) for k, v in fields.items()}
        group = np.repeat(np.arange(len(lengths)), count)
        return SequenceDataset(inputs, labels, fields, group=group, meta=meta)
