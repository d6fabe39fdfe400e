"""Language modelling on Shakespeare (default) or any text file/folder, byte-level or BPE (docs/tasks.md §1)."""
from __future__ import annotations

import numpy as np

from .base import SPLITS, SequenceDataset, TaskDataModule
from .checks import check
from .corpus import TextCorpus, document_pieces
from .tokenizers import check_text_data_state, text_data_state


def lm_windows(ids: np.ndarray, seq_len: int) -> SequenceDataset:
    """Non-overlapping windows of a token stream: input_ids = ids[i·T : i·T+T], labels = ids[i·T+1 : i·T+T+1]."""
    starts = np.arange((len(ids) - 1) // seq_len) * seq_len
    return SequenceDataset(input_ids=_Slices(ids, starts, seq_len), labels=_Slices(ids, starts + 1, seq_len))


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

    def __init__(self, seq_len: int = 256, batch_size: int = 32, seed: int = 0, num_workers: int = 0, **corpus):
        """
        Args:
            seq_len: training context length (tokens).
            batch_size: sequences per batch.
            seed: seeds the data (every split) and the training order.
            num_workers: DataLoader worker processes.
            corpus: the text and its tokenizer (``corpus.TextCorpus``: data_path, tokenizer, bpe_vocab_size,
                holdout_fraction, cache_dir).
        """
        super().__init__(batch_size, seed, num_workers)
        check(seq_len >= 1, "seq_len", f"expected an int >= 1, got {seq_len}")
        self.text = TextCorpus(**corpus)
        self.text.record(self)
        self.seq_len, self.vocab_size = seq_len, self.text.vocab_size
        self.bytes_per_token: float | None = self.text.kind.bytes_per_token
        self.split_bytes_per_token: dict[str, float] = {}
        self.tokenizer = None
        self.tokens: dict[str, np.ndarray] = {}

    def prepare(self) -> None:
        """Read the corpus, build the tokenizer and tokenize every split (once)."""
        if self.tokens:
            return
        corpus = self.text.read()
        self.tokenizer = self.text.build_tokenizer(corpus)
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
        check_text_data_state(state, self.tokenizer, f"data_path: {self.text.data_path!r}")

    def build(self, split: str) -> SequenceDataset:
        self.prepare()
        return lm_windows(self.tokens[split], self.seq_len)
