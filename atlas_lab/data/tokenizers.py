"""Tokenizers: bytes (the default) and a byte-level BPE trained offline on a training split and cached on disk.

Both expose: vocab_size, pad_id, eos_id (None: the corpora carry no end-of-document token), encode(text) ->
list[int], encode_batch(texts), encode_documents(pieces) -> int32 array, decode(ids) -> str; and, per kind, before
any data is read: ``trains_on_corpus`` (building one reads the training split), ``bytes_per_token`` (1.0 for bytes;
None where it depends on the text), ``planned_vocab_size(bpe_vocab_size)`` and ``build(bpe_vocab_size,
train_documents, cache_dir)``. The data modules look a kind up in TOKENIZERS and ask it; none compares its name.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .base import check, check_choice

BPE_FORMAT = 1  # bump when the BPE recipe below changes: cached tokenizers are keyed by it


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus special tokens after them: <pad> = 256. vocab_size = 257."""

    specials = ("<pad>",)
    trains_on_corpus = False
    bytes_per_token = 1.0
    eos_id = None

    @classmethod
    def planned_vocab_size(cls, bpe_vocab_size: int) -> int:
        return 256 + len(cls.specials)

    @classmethod
    def build(cls, bpe_vocab_size: int, train_documents, cache_dir: str) -> "ByteTokenizer":
        return cls()

    def __init__(self):
        self.vocab_size = 256 + len(self.specials)
        self.pad_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_documents(self, pieces: list[str]) -> np.ndarray:
        """"".join(pieces) as one int32 array of bytes."""
        return np.frombuffer("".join(pieces).encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: list[int]) -> str:
        """Special tokens are dropped; invalid UTF-8 becomes U+FFFD."""
        return bytes(int(i) for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation) trained with the `tokenizers` package; <pad> = 0.

    Trained on `train_documents` the first time and cached as JSON under cache_dir/bpe, keyed by a hash
    of the documents and vocab_size, so the same corpus always gets the same tokenizer.
    vocab_size is the requested size (the trained vocabulary can only be smaller on a tiny corpus).
    """

    trains_on_corpus = True
    bytes_per_token = None
    eos_id = None

    @classmethod
    def planned_vocab_size(cls, bpe_vocab_size: int) -> int:
        check(bpe_vocab_size > 257, "bpe_vocab_size",
              f"expected an int > 257 (256 bytes + <pad> + merges), got {bpe_vocab_size}")
        return bpe_vocab_size

    @classmethod
    def build(cls, bpe_vocab_size: int, train_documents, cache_dir: str) -> "BPETokenizer":
        """Trained on train_documents() (a callable: only a kind that trains reads the corpus)."""
        return cls(train_documents(), bpe_vocab_size, cache_dir)

    def __init__(self, train_documents: list[str], vocab_size: int, cache_dir: str):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        self.vocab_size, self.pad_id = self.planned_vocab_size(vocab_size), 0
        digest = hashlib.sha1(f"{BPE_FORMAT}/{vocab_size}/".encode())
        for doc in train_documents:
            digest.update(doc.encode("utf-8"))
            digest.update(b"\0")
        self.key = f"bpe-{vocab_size}-{digest.hexdigest()[:16]}"
        self.cache_dir = Path(cache_dir).expanduser() / "bpe"
        path = self.cache_dir / f"{self.key}.json"
        if path.exists():
            self.tokenizer = Tokenizer.from_file(str(path))
            return
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(train_documents, trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tok.save(str(tmp))
        os.replace(tmp, path)  # atomic: concurrent workers never read a half-written file
        self.tokenizer = tok

    def encode_documents(self, pieces: list[str]) -> np.ndarray:
        """"".join(pieces) as one int32 array, pieces encoded separately (in parallel); cached on disk,
        keyed by this tokenizer and the text."""
        digest = hashlib.sha1("\0".join(pieces).encode("utf-8")).hexdigest()[:16]
        path = self.cache_dir / f"{self.key}-tokens-{digest}.npy"
        if path.exists():
            return np.load(path)
        ids = np.concatenate([np.asarray(x, dtype=np.int32) for x in self.encode_batch(pieces)])
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, ids)
        os.replace(tmp, path)
        return ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


TOKENIZERS = {"byte": ByteTokenizer, "bpe": BPETokenizer}


def tokenizer_kind(name: str):
    """The tokenizer class a data module's ``tokenizer`` names (ValueError listing the choices)."""
    check_choice("tokenizer", name, tuple(TOKENIZERS))
    return TOKENIZERS[name]
