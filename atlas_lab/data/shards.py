"""A tokenised corpus as litdata shards: ``atlas-lab data prepare`` and ``atlas-lab data tokenizer`` (docs/tasks.md §7).

Input: local text files or glob patterns, read in the order given (a pattern's matches sorted by path):
  ``.txt``      one file = one document (UTF-8);
  ``.jsonl``    one JSON object per line, the document in ``text_field`` (blank lines skipped);
  ``.parquet``  the string column ``text_field``, one row = one document (read with pyarrow).
Documents whose text is empty are skipped. Each document is tokenised and followed by the end token <eos>.

Split: a document is held out for validation when h(seed, text) < holdout_fraction, h a 64-bit BLAKE2b hash of the
seed and the text scaled to [0, 1): whole documents, the same split whatever the order or the other files, and
equal documents always on the same side.

Output (``out_dir``):
  train/, val/    litdata shards in the token stream format (``litdata.streaming.item_loader.TokensLoader``): each
                  chunk holds its documents' tokens back to back, uint16 when the vocabulary fits, else int32;
  corpus.json     tokenizer kind, vocab_size, eos_id, pad_id, the token dtype, documents / tokens / UTF-8 bytes per
                  split, the inputs and the files read;
  tokenizer.json  a copy of the BPE tokenizer used (none for bytes).
Everything is written into a temporary folder next to out_dir (.<name>.tmp-*), renamed to out_dir at the end: a
failure leaves nothing behind. (Ctrl-C while litdata writes the shards ends the process at once, as litdata's
handler does, and leaves that folder.)

Tokenizers (``load_tokenizer(data_dir)`` returns the one a corpus was written with): ``byte`` = UTF-8 bytes 0..255,
<pad> = 256, <eos> = 257, vocab 258 (``ByteEOSTokenizer``; the in-memory LM task's ``ByteTokenizer`` has no <eos>);
or a tokenizer.json (``BPEFileTokenizer``, trained by ``train_tokenizer``: byte-level BPE, <pad> = 0, <eos> = 1).
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .checks import check, first_line
from .tokenizers import SPECIALS, TOKENIZERS, BPEFileTokenizer, TokenizerSource, tokenizer_kind

FORMATS = (".txt", ".jsonl", ".parquet")
FORMAT_VERSION = 1
BATCH_BYTES = 1 << 23  # text tokenised per encode_batch call


def build_tokenizer(tokenizer: str):
    """The tokenizer ``prepare`` writes a corpus with, its documents ending with <eos>: a name of the registry
    (``tokenizers.TOKENIZERS``: byte), or the path of a tokenizer.json, a BPE (ValueError naming the choices)."""
    if tokenizer in TOKENIZERS:
        return TOKENIZERS[tokenizer].build(TokenizerSource(eos=True))
    check(Path(tokenizer).is_file(), "tokenizer",
          f"expected 'byte' or the path of a tokenizer.json (atlas-lab data tokenizer), got {tokenizer!r}")
    return TOKENIZERS["bpe"].build(TokenizerSource(eos=True, path=tokenizer))


def load_tokenizer(data_dir: str | Path):
    """The tokenizer a prepared corpus was written with: the kind its corpus.json names, with <eos>, reading the
    tokenizer.json beside the shards where it has one: vocab_size, eos_id, pad_id, encode(text) -> list[int],
    decode(ids) -> str."""
    kind = tokenizer_kind(read_corpus(data_dir)["tokenizer"])
    return kind.build(TokenizerSource(eos=True, path=Path(data_dir).expanduser() / "tokenizer.json"))


def read_corpus(data_dir: str | Path) -> dict:
    """data_dir/corpus.json (ValueError if data_dir is not a prepared corpus)."""
    path = Path(data_dir).expanduser() / "corpus.json"
    check(path.is_file(), "data_dir", f"{str(data_dir)!r} has no corpus.json; expected a folder written by "
                                      "atlas-lab data prepare")
    corpus = json.loads(path.read_text())
    check(corpus.get("format") == FORMAT_VERSION, "data_dir", f"{str(path)!r} has format {corpus.get('format')!r}; "
                                                              f"expected {FORMAT_VERSION} (prepare the corpus again)")
    return corpus


# ---------------------------------------------------------------------------------------------------------- reading

def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files and glob patterns -> the files, in the order given (a pattern's matches sorted), each once."""
    check(len(inputs) > 0, "inputs", "expected at least one file or glob pattern")
    files: dict[Path, None] = {}
    for pattern in inputs:
        path = Path(pattern).expanduser()
        if glob.has_magic(pattern):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            check(bool(matches), "inputs", f"no file matches {pattern!r}")
        else:
            check(not path.is_dir(), "inputs", f"{pattern!r} is a folder; expected a file or a glob pattern such as "
                                               f"'{pattern.rstrip('/')}/*.txt'")
            check(path.is_file(), "inputs", f"no such file: {pattern!r}")
            matches = [path]
        for p in matches:
            check(p.suffix in FORMATS, "inputs", f"{str(p)!r} has the suffix {p.suffix!r}; expected one of: "
                                                 f"{', '.join(FORMATS)}")
            files[p] = None
    return list(files)


def _parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("inputs: reading .parquet needs pyarrow (pip install pyarrow); expected .txt or .jsonl "
                         "without it") from None
    return pq


def _read_utf8(path: Path, raw: bytes, where: str = "") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"inputs: {str(path)!r}{where} is not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                         f"{e.start}); expected UTF-8") from None


def read_documents(path: Path, text_field: str):
    """Yield (document text or None for an empty one, input bytes read since the last yield) for one file;
    ValueError on bad input."""
    try:
        size = path.stat().st_size
        if path.suffix != ".parquet":
            handle = path.open("rb")
    except OSError as e:
        raise ValueError(f"inputs: {str(path)!r} cannot be read ({e.strerror})") from None
    check(size > 0, "inputs", f"{str(path)!r} is empty; expected at least one document")
    found = False
    if path.suffix == ".txt":
        with handle:
            text = _read_utf8(path, handle.read())
        found = bool(text)
        yield text or None, size
    elif path.suffix == ".jsonl":
        with handle:
            for n, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(_read_utf8(path, line, f" line {n}"))
                except json.JSONDecodeError as e:
                    raise ValueError(f"inputs: {str(path)!r} line {n} is not valid JSON ({e.msg}); expected one JSON "
                                     "object per line") from None
                check(isinstance(record, dict) and text_field in record, "text_field",
                      f"{str(path)!r} line {n} has no key {text_field!r}; expected an object with the text in "
                      f"{text_field!r}" + (f" (its keys: {', '.join(map(str, record))})"
                                           if isinstance(record, dict) else ""))
                text = record[text_field]
                check(isinstance(text, str), "text_field", f"{str(path)!r} line {n}: {text_field!r} is "
                                                           f"{type(text).__name__}; expected a string")
                found = True
                yield text or None, len(line)
    else:
        pq = _parquet()
        try:
            parquet = pq.ParquetFile(path)
        except Exception as e:
            raise ValueError(f"inputs: {str(path)!r} is not a readable parquet file ({first_line(e)})") from None
        names = parquet.schema_arrow.names
        check(text_field in names, "text_field", f"{str(path)!r} has no column {text_field!r}; its columns: "
                                                 f"{', '.join(names)}")
        kind = parquet.schema_arrow.field(text_field).type
        check(str(kind) in ("string", "large_string"), "text_field",
              f"{str(path)!r}: the column {text_field!r} holds {kind}; expected strings")
        rows = max(parquet.metadata.num_rows, 1)
        for batch in parquet.iter_batches(columns=[text_field]):
            texts = batch.column(0).to_pylist()
            found = found or len(texts) > 0
            step = size * len(texts) // rows
            for text in texts:
                yield text or None, 0
            yield None, step
    check(found, "inputs", f"{str(path)!r} holds no document; expected at least one")


def held_out(text: str, seed: int, fraction: float) -> bool:
    """Whether a document belongs to the validation split: BLAKE2b-64(seed, text) / 2^64 < fraction."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") / 2.0**64 < fraction


# ------------------------------------------------------------------------------------------------------- tokenizing

@dataclass
class _Split:
    """One split's token stream, written as raw ids to a file while the corpus is read."""

    path: Path
    dtype: np.dtype
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    pending: list[str] = field(default_factory=list)
    pending_bytes: int = 0

    def __post_init__(self):
        self.handle = self.path.open("wb")

    def add(self, text: str, tokenizer) -> int:
        """Queue a document; returns the tokens written (when the queue is flushed)."""
        self.pending.append(text)
        self.pending_bytes += len(text)
        return self.flush(tokenizer) if self.pending_bytes >= BATCH_BYTES else 0

    def flush(self, tokenizer) -> int:
        if not self.pending:
            return 0
        ids = tokenizer.encode_batch(self.pending)
        eos = np.array([tokenizer.eos_id], dtype=self.dtype)
        stream = np.concatenate([part for x in ids for part in (np.asarray(x, dtype=self.dtype), eos)])
        stream.tofile(self.handle)
        self.documents += len(self.pending)
        self.bytes += sum(len(t.encode("utf-8")) for t in self.pending)
        self.tokens += len(stream)
        self.pending, self.pending_bytes = [], 0
        return len(stream)

    def close(self, tokenizer) -> int:
        written = self.flush(tokenizer)
        self.handle.close()
        return written


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest of uint16 / int32 that holds every id."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def read_token_slice(item: tuple[str, str, int, int]):
    """A litdata item: tokens [start, start + count) of a raw token file (path, dtype, start, count) as a 1-D array."""
    path, dtype, start, count = item
    dtype = np.dtype(dtype)
    return np.fromfile(path, dtype=dtype, count=count, offset=start * dtype.itemsize)


def _progress(counts: str) -> Progress:
    """A rich progress bar over the input bytes, with counts (a format of the task's fields) beside it."""
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                    TextColumn(counts), TimeElapsedColumn())


@contextlib.contextmanager
def _optimizing(folder: Path):
    """litdata.optimize's side effects kept to its calls: its scratch folders (by default <tmp>/chunks and
    <tmp>/data, emptied by every optimize call, shared by every user of the machine) under folder, and the SIGINT
    handler it installs for good (os._exit(0) on Ctrl-C) replaced by the one before."""
    names = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
    saved = {name: os.environ.get(name) for name in names}
    handler = signal.getsignal(signal.SIGINT)
    os.environ.update({names[0]: str(folder / "chunks"), names[1]: str(folder / "data")})
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def _check_out_dir(out_dir: str) -> Path:
    out = Path(out_dir).expanduser()
    check(out.parent.is_dir(), "out_dir", f"the folder {str(out.parent)!r} does not exist; expected out_dir inside "
                                          "an existing folder")
    check(not out.exists() or (out.is_dir() and not any(out.iterdir())), "out_dir",
          f"{out_dir!r} exists and is not empty; expected a new or empty folder")
    return out


def prepare(inputs: list[str], out_dir: str, tokenizer: str = "byte", text_field: str = "text",
            holdout_fraction: float = 0.01, seed: int = 0, num_workers: int = 1,
            chunk_bytes: int = 1 << 26) -> dict:
    """Tokenise local text into litdata shards (module docstring); returns corpus.json's content.

    Args:
        inputs: files and glob patterns (.txt, .jsonl, .parquet).
        out_dir: the corpus folder to create (new, or empty).
        tokenizer: "byte" or the path of a tokenizer.json (``train_tokenizer``).
        text_field: the key (.jsonl) or column (.parquet) that holds a document's text.
        holdout_fraction: the expected fraction of documents held out for validation, in (0, 1).
        seed: the held-out documents' hash key.
        num_workers: litdata writer processes.
        chunk_bytes: the size of a litdata chunk (the unit of shuffling; the last < seq_len + 1 tokens of a chunk
            are never read as a window).
    """
    if importlib.util.find_spec("litdata") is None:  # before anything is read; imported once the input is known good
        raise ModuleNotFoundError("prepare writes litdata shards: pip install 'atlas-lab[lm]'", name="litdata")
    check(0 < holdout_fraction < 1, "holdout_fraction", f"expected a number in (0, 1), got {holdout_fraction}")
    check(isinstance(seed, int) and 0 <= seed < 2**64, "seed", f"expected an int in [0, 2^64), got {seed!r}")
    check(num_workers >= 1, "num_workers", f"expected an int >= 1, got {num_workers}")
    out = _check_out_dir(out_dir)
    tok = build_tokenizer(tokenizer)
    files = expand_inputs(inputs)
    dtype = token_dtype(tok.vocab_size)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        splits = {s: _Split(tmp / f"{s}.tokens", dtype) for s in ("train", "val")}
        total = sum(p.stat().st_size for p in files)
        with _progress("{task.fields[documents]:,} documents, {task.fields[tokens]:,} tokens") as progress:
            task = progress.add_task("tokenising", total=total, documents=0, tokens=0)
            documents = tokens = 0
            for path in files:
                for text, size in read_documents(path, text_field):
                    if text is not None:
                        tokens += splits["val" if held_out(text, seed, holdout_fraction) else "train"].add(text, tok)
                        documents += 1
                    progress.update(task, advance=size, documents=documents, tokens=tokens)
            for split in splits.values():
                tokens += split.close(tok)
            progress.update(task, completed=total, tokens=tokens)
        for name, split in splits.items():
            check(split.documents > 0, "holdout_fraction", f"{holdout_fraction} leaves the {name} split empty "
                                                          f"({documents} documents); expected a fraction that "
                                                          "leaves documents on both sides")
        from litdata import optimize
        from litdata.streaming.item_loader import TokensLoader

        step = max(1, chunk_bytes // 32 // dtype.itemsize)  # tokens per litdata item: ~32 items (whole) per chunk
        with _optimizing(tmp / "cache"):
            for name, split in splits.items():
                items = [(str(split.path), dtype.name, start, min(step, split.tokens - start))
                         for start in range(0, split.tokens, step)]
                optimize(read_token_slice, items, str(tmp / name), chunk_bytes=chunk_bytes,
                         item_loader=TokensLoader(), num_workers=min(num_workers, len(items)), reorder_files=False,
                         keep_data_ordered=True, start_method=multiprocessing.get_start_method(), verbose=False)
                split.path.unlink()
        shutil.rmtree(tmp / "cache")
        corpus = {"format": FORMAT_VERSION, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
                  "eos_id": tok.eos_id, "pad_id": tok.pad_id, "dtype": dtype.name, "text_field": text_field,
                  "holdout_fraction": holdout_fraction, "seed": seed,
                  "splits": {name: {"documents": s.documents, "tokens": s.tokens, "bytes": s.bytes}
                             for name, s in splits.items()},
                  "inputs": list(inputs), "files": [str(p) for p in files]}
        tok.save(tmp)  # a BPE's tokenizer.json
        (tmp / "corpus.json").write_text(json.dumps(corpus, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return corpus


def train_tokenizer(inputs: list[str], out_path: str, vocab_size: int, text_field: str = "text") -> BPEFileTokenizer:
    """Train a byte-level BPE (GPT-2 pre-tokenisation, specials <pad> = 0 and <eos> = 1) on every document of the
    inputs and save it as a tokenizer.json at out_path (a new file). vocab_size: the size including the 256 bytes
    and the two specials (the trained vocabulary can only be smaller on a tiny corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check(isinstance(vocab_size, int) and vocab_size > 258, "vocab_size",
          f"expected an int > 258 (256 bytes + <pad> + <eos> + merges), got {vocab_size!r}")
    out = Path(out_path).expanduser()
    check(out.parent.is_dir(), "out_path", f"the folder {str(out.parent)!r} does not exist")
    check(not out.exists(), "out_path", f"{out_path!r} exists; expected the path of a new file")
    files = expand_inputs(inputs)
    total = sum(p.stat().st_size for p in files)

    def documents(progress, task):
        count = 0
        for path in files:
            for text, size in read_documents(path, text_field):
                if text is not None:
                    count += 1
                    yield text
                progress.update(task, advance=size, documents=count)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with _progress("{task.fields[documents]:,} documents") as progress:
        task = progress.add_task("reading", total=total, documents=0)
        tok.train_from_iterator(documents(progress, task), trainer)
        progress.update(task, completed=total)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tok.save(str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return BPEFileTokenizer(out)
