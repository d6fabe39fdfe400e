"""The tokenizers, one registry for every data module and prepared corpus: ``TOKENIZERS`` maps a name to its kind,

    byte   UTF-8 bytes and <pad> (``ByteTokenizer``); with an end-of-document token, bytes, <pad> and <eos>
           (``ByteEOSTokenizer``, a prepared corpus's);
    bpe    a byte-level BPE trained offline on a training split and cached on disk (``BPETokenizer``), or read from a
           tokenizer.json with <pad> and <eos> (``BPEFileTokenizer``: ``atlas-lab data tokenizer``, a corpus's).

A kind builds its tokenizer from a ``TokenizerSource`` (whether documents end with <eos>, the tokenizer.json, the
training split and the BPE's size): ``build(source)``, and before any data is read ``planned_vocab_size(source)``,
``trains_on_corpus`` (building one reads the training split) and ``bytes_per_token`` (1.0 for bytes; None where it
depends on the text). The text data modules (``corpus.TextCorpus``) and the prepared corpora (``shards``) look a name
up here; none compares it.

Every tokenizer exposes: name (its registry name), vocab_size, pad_id, eos_id (None: the corpora carry no
end-of-document token), encode(text) -> list[int], encode_batch(texts), encode_documents(pieces) -> int32 array,
decode(ids) -> str, and save(folder) (the file a prepared corpus keeps beside its shards, if any).

Every tokenizer here has a state (``tokenizer_state``): its class's name and, for a BPE, its tokenizer.json, which
``tokenizer_from_state`` turns back into the same tokenizer without any file. The text data modules return it from
``state_dict`` (``text_data_state``), so Lightning saves it in every checkpoint: ``atlas-lab eval`` reads text as the
checkpoint's model was trained to, wherever its corpus has gone.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .checks import check, check_choice, first_line

BPE_FORMAT = 1  # bump when the BPE recipe below changes: cached tokenizers are keyed by it
SPECIALS = ("<pad>", "<eos>")  # the specials of a prepared corpus's tokenizers, in this order


@dataclass
class TokenizerSource:
    """What a kind builds its tokenizer from.

    eos: documents end with <eos> (a prepared corpus); path: a tokenizer.json to read (a BPE);
    train_documents: a callable returning the training split's documents (read only by a kind that trains on it);
    bpe_vocab_size: the vocabulary of a BPE trained on them; cache_dir: where a trained BPE is cached.
    """

    eos: bool = False
    path: Optional[str | Path] = None
    train_documents: Optional[Callable[[], list[str]]] = None
    bpe_vocab_size: int = 4096
    cache_dir: str = "~/.cache/atlas_lab"


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus special tokens after them: <pad> = 256. vocab_size = 257."""

    name = "byte"
    specials = ("<pad>",)
    trains_on_corpus = False
    bytes_per_token = 1.0
    eos_id = None

    @classmethod
    def planned_vocab_size(cls, source: TokenizerSource) -> int:
        return cls.build(source).vocab_size

    @classmethod
    def build(cls, source: TokenizerSource) -> "ByteTokenizer":
        """Bytes and <pad>; with ``source.eos`` also <eos> (ByteEOSTokenizer)."""
        return ByteEOSTokenizer() if source.eos else ByteTokenizer()

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

    def save(self, folder: Path) -> None:
        """Nothing: bytes need no file."""

    def state(self) -> dict:
        return {"class": type(self).__name__}

    @classmethod
    def from_state(cls, state: dict) -> "ByteTokenizer":
        return cls()


class ByteEOSTokenizer(ByteTokenizer):
    """UTF-8 bytes 0..255, then <pad> = 256 and <eos> = 257: vocab_size = 258 (the byte tokenizer with an end token;
    ``atlas-lab data prepare --tokenizer byte``)."""

    specials = SPECIALS
    eos_id = 257

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation) trained with the `tokenizers` package; <pad> = 0.

    Trained on `train_documents` the first time and cached as JSON under cache_dir/bpe, keyed by a hash
    of the documents and vocab_size, so the same corpus always gets the same tokenizer.
    vocab_size is the requested size (the trained vocabulary can only be smaller on a tiny corpus).
    """

    name = "bpe"
    trains_on_corpus = True
    bytes_per_token = None
    eos_id = None

    @classmethod
    def planned_vocab_size(cls, source: TokenizerSource) -> int:
        return cls.build(source).vocab_size if source.path is not None else _bpe_vocab_size(source.bpe_vocab_size)

    @classmethod
    def build(cls, source: TokenizerSource):
        """The tokenizer.json at ``source.path`` (BPEFileTokenizer); else a BPE trained on
        ``source.train_documents()`` (only a kind that trains reads the corpus), which has no <eos>."""
        if source.path is not None:
            return BPEFileTokenizer(source.path)
        check(not source.eos and source.train_documents is not None, "tokenizer",
              f"expected 'byte' or the path of a tokenizer.json (atlas-lab data tokenizer), got {cls.name!r}: a "
              "prepared corpus's BPE is read from a tokenizer.json")
        return cls(source.train_documents(), source.bpe_vocab_size, source.cache_dir)

    def __init__(self, train_documents: list[str], vocab_size: int, cache_dir: str):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        self.vocab_size, self.pad_id = _bpe_vocab_size(vocab_size), 0
        digest = hashlib.sha1(f"{BPE_FORMAT}/{vocab_size}/".encode())
        for doc in train_documents:
            digest.update(doc.encode("utf-8"))
            digest.update(b"\0")
        self.key = f"bpe-{vocab_size}-{digest.hexdigest()[:16]}"
        self.cache_dir = Path(cache_dir).expanduser() / "bpe"
        path = self.cache_dir / f"{self.key}.json"
        if path.exists():
            self.json = path.read_text(encoding="utf-8")
            self.tokenizer = Tokenizer.from_str(self.json)
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
        self.json = tmp.read_text(encoding="utf-8")
        os.replace(tmp, path)  # atomic: concurrent workers never read a half-written file
        self.tokenizer = tok

    def state(self) -> dict:
        return {"class": type(self).__name__, "vocab_size": self.vocab_size, "json": self.json}

    @classmethod
    def from_state(cls, state: dict) -> "BPETokenizer":
        """The tokenizer of a state, without its cache: encode_documents then caches nothing."""
        from tokenizers import Tokenizer

        self = cls.__new__(cls)
        self.vocab_size, self.pad_id, self.json = _bpe_vocab_size(state["vocab_size"]), 0, state["json"]
        self.tokenizer = _from_json(Tokenizer, self.json, "the checkpoint's BPE tokenizer")
        self.key, self.cache_dir = f"bpe-{self.vocab_size}-{hashlib.sha1(self.json.encode()).hexdigest()[:16]}", None
        return self

    def encode_documents(self, pieces: list[str]) -> np.ndarray:
        """"".join(pieces) as one int32 array, pieces encoded separately (in parallel); cached on disk,
        keyed by this tokenizer and the text."""
        digest = hashlib.sha1("\0".join(pieces).encode("utf-8")).hexdigest()[:16]
        if self.cache_dir is None:
            return np.concatenate([np.asarray(x, dtype=np.int32) for x in self.encode_batch(pieces)])
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

    def save(self, folder: Path) -> None:
        (Path(folder) / "tokenizer.json").write_text(self.json, encoding="utf-8")


def _bpe_vocab_size(vocab_size: int) -> int:
    check(vocab_size > 257, "bpe_vocab_size", f"expected an int > 257 (256 bytes + <pad> + merges), got {vocab_size}")
    return vocab_size


def _from_json(tokenizer_class, text: str, what: str):
    """A ``tokenizers.Tokenizer`` from its JSON (ValueError naming ``what``, with the library's reason)."""
    try:
        return tokenizer_class.from_str(text)
    except Exception as e:
        raise ValueError(f"tokenizer: {what} does not load as a tokenizer.json ({first_line(e)}); expected 'byte' or a "
                         "file written by atlas-lab data tokenizer") from None


class BPEFileTokenizer:
    """A ``tokenizers`` tokenizer.json with the specials <pad> and <eos>; vocab_size counts the added tokens
    (``atlas-lab data tokenizer``). path: the file it was read from (None when it was rebuilt from a state)."""

    name = "bpe"

    def __init__(self, path: str | Path | None, json: str | None = None):
        """The tokenizer.json at ``path``, or (path None) the JSON text ``json``."""
        from tokenizers import Tokenizer

        what = f"{str(path)!r}" if path is not None else "the checkpoint's tokenizer"
        if json is None:
            try:
                json = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"tokenizer: {what} cannot be read ({first_line(e)}); expected 'byte' or a file "
                                 "written by atlas-lab data tokenizer") from None
        self.tokenizer = _from_json(Tokenizer, json, what)
        ids = {s: self.tokenizer.token_to_id(s) for s in SPECIALS}
        missing = [s for s, i in ids.items() if i is None]
        check(not missing, "tokenizer", f"{what} has no {' or '.join(missing)} token; expected a tokenizer "
                                        f"with the specials {', '.join(SPECIALS)} (atlas-lab data tokenizer)")
        self.tokenizer.encode_special_tokens = True  # "<eos>" written in a document is text, not the end token
        self.path, self.json = (Path(path) if path is not None else None), json
        self.pad_id, self.eos_id = ids["<pad>"], ids["<eos>"]
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """In parallel (the library's threads), without character offsets."""
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, folder: Path) -> None:
        """The tokenizer.json, beside a prepared corpus's shards."""
        (Path(folder) / "tokenizer.json").write_text(self.json, encoding="utf-8")

    def state(self) -> dict:
        return {"class": type(self).__name__, "json": self.json}

    @classmethod
    def from_state(cls, state: dict) -> "BPEFileTokenizer":
        return cls(None, state["json"])


TOKENIZERS = {kind.name: kind for kind in (ByteTokenizer, BPETokenizer)}  # name -> the kind that builds it
# a tokenizer's state names its class (``tokenizer_state``): every class a kind builds
STATES = {cls.__name__: cls for cls in (ByteTokenizer, ByteEOSTokenizer, BPETokenizer, BPEFileTokenizer)}


def tokenizer_kind(name: str):
    """The kind a ``tokenizer`` argument names (ValueError listing the choices)."""
    check_choice("tokenizer", name, tuple(TOKENIZERS))
    return TOKENIZERS[name]


def tokenizer_state(tokenizer) -> dict:
    """What rebuilds ``tokenizer`` without any file (``tokenizer_from_state``): {"class": its class's name} for bytes,
    with "json" (the tokenizer.json's text) for a BPE, and "vocab_size" for the LM data's BPE."""
    return tokenizer.state()


def tokenizer_from_state(state: dict):
    """The tokenizer of a ``tokenizer_state`` (ValueError for a state of no tokenizer of this module)."""
    name = state.get("class") if isinstance(state, dict) else None
    check(name in STATES, "tokenizer", f"a state of class {name!r}; expected one of: {', '.join(STATES)}")
    return STATES[name].from_state(state)


def describe(tokenizer) -> str:
    """"a ByteEOSTokenizer of 258 tokens": a tokenizer (or its state) as a message names it."""
    if isinstance(tokenizer, dict):
        tokenizer = tokenizer_from_state(tokenizer)
    return f"a {type(tokenizer).__name__} of {tokenizer.vocab_size} tokens"


def text_data_state(tokenizer) -> dict:
    """``state_dict`` of a text data module: {"tokenizer": its tokenizer's state}. Lightning saves it in every
    checkpoint, under the data module's class name."""
    return {"tokenizer": tokenizer_state(tokenizer)}


def check_text_data_state(state: dict, tokenizer, data: str) -> None:
    """``load_state_dict`` of a text data module: a checkpoint (``state``: its ``text_data_state``) continues or
    scores only data read with its own tokenizer. ValueError naming ``data`` (e.g. "data_dir: 'corpus'") otherwise."""
    recorded = state.get("tokenizer") if isinstance(state, dict) else None
    if recorded is not None and recorded != tokenizer_state(tokenizer):
        raise ValueError(f"{data} is tokenised by {describe(tokenizer)}; the checkpoint was trained on text read by "
                         f"{describe(recorded)}: expected data tokenised as the checkpoint's")
