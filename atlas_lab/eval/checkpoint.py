"""A checkpoint of ``atlas-lab fit`` read for evaluation: its language model, tokenizer, training length and MLflow run.

What a checkpoint holds (written by LightningCLI through Lightning): ``hyper_parameters`` (the model's, with the
values linked from the data), ``datamodule_hyper_parameters`` (the data module's arguments and ``_class_path``:
``TaskDataModule`` saves them, paths absolute), the text data module's state under its class's name (its tokenizer:
``tokenizers.text_data_state``) and ``mlflow_run`` ({tracking_uri, experiment_id, run_id} of the fit:
``SequenceModel.on_save_checkpoint``; absent without an MLflow logger). The checkpoint alone gives the tokenizer: its
corpus may have moved or gone. A checkpoint written before checkpoints carried their tokenizer gets it from its corpus
(the tokenizer saved beside token shards, or the LM data's tokenizer rebuilt from its arguments) where that is still
there.

Reading a checkpoint needs torch alone; Lightning is imported when its model is loaded (``Checkpoint.load``). What
``atlas-lab eval`` checks in a checkpoint (its data, tokenizer, target and training length) is read without torch
first (``peek_checkpoint``), so a checkpoint that cannot be evaluated is refused at once.
"""
from __future__ import annotations

import importlib
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.checks import first_line
from ..data.tokenizers import tokenizer_from_state
from .arguments import EvalError, check_checkpoint_file

if TYPE_CHECKING:
    import torch

    from ..models import LanguageModel

__all__ = ["Checkpoint", "EvalError", "checkpoint_data", "checkpoint_tokenizer", "peek_checkpoint", "read_checkpoint",
           "text_tokenizer"]

# what a checkpoint's plain data is made of; anything else (a tensor, a class of another package) is left unread
PLAIN = {("builtins", name) for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str",
                                          "bytes", "bytearray", "bool", "slice", "range")} | {
    ("collections", "OrderedDict"), ("collections", "defaultdict")}


class Opaque:
    """A part of a checkpoint that ``peek_checkpoint`` leaves unread: a tensor, or an object of another package's
    class. It takes whatever unpickling gives it and keeps nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Peek(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return super().find_class(module, name) if (module, name) in PLAIN else Opaque

    def persistent_load(self, saved_id):  # a tensor's storage: a file of the archive, not read
        return Opaque()


def peek_checkpoint(path: str | Path) -> dict:
    """A checkpoint's contents without torch (which takes a second to import): its plain data (the hyper-parameters,
    the data module's arguments and state, the MLflow run, ...), every tensor and object of another class an
    ``Opaque``. Only builtin containers and values are built, so nothing of the file runs. EvalError where the file is
    not a checkpoint of torch.save; ``read_checkpoint`` reads it whole."""
    path = check_checkpoint_file(path)
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None:
                raise ValueError("no data.pkl in the archive")
            contents = _Peek(archive.open(name)).load()
    except Exception as e:  # a zip of something else, truncated, ...: whatever the reader says, as one line
        raise EvalError(f"--ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    return of_fit(contents, path)


def of_fit(contents, path: str | Path) -> dict:
    """``contents`` of a file read as a checkpoint, if it is one of atlas-lab fit (a dict with state_dict and
    hyper_parameters); else EvalError."""
    if not isinstance(contents, dict) or "state_dict" not in contents or "hyper_parameters" not in contents:
        raise EvalError(f"--ckpt_path: {path} is not a checkpoint of atlas-lab fit (no state_dict and "
                        "hyper_parameters)")
    return contents


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint's contents (tensors memory-mapped, on the CPU). EvalError for a missing or unreadable file."""
    import torch

    path = check_checkpoint_file(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as e:  # not a torch zip file, truncated, ...: whatever torch says, as one line
        raise EvalError(f"--ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    return of_fit(checkpoint, path)


def checkpoint_data(checkpoint: dict, path: str | Path) -> dict:
    """The data module's arguments recorded in a checkpoint (``_class_path`` among them when LightningCLI built it)."""
    data = checkpoint.get("datamodule_hyper_parameters")
    if not data:
        raise EvalError(f"--ckpt_path: {path} records no data module (a checkpoint of atlas-lab fit records its data's "
                        "arguments since the data modules save them; fit it again, or save it with "
                        "Trainer.fit(datamodule=...))")
    return dict(data)


def is_data_class(class_path: str, module: str, name: str) -> bool:
    """Whether ``class_path`` names the data module ``atlas_lab.data.<module>.<name>`` or a subclass of it. atlas-lab's
    own data modules are told by their path without being imported (they import Lightning); another class is
    imported and asked."""
    if class_path in (f"atlas_lab.data.{name}", f"atlas_lab.data.{module}.{name}"):
        return True
    if class_path.startswith("atlas_lab.data."):
        return False
    owner, _, attribute = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(owner), attribute, None) if owner else None
    except ImportError:
        return False
    base = getattr(importlib.import_module(f"atlas_lab.data.{module}"), name)
    return isinstance(cls, type) and issubclass(cls, base)


def tokenizer_state(checkpoint: dict, data: dict) -> dict | None:
    """The tokenizer's state a checkpoint carries: the data module's ``state_dict``, saved by Lightning under the name
    of the class (the recorded ``_class_path``'s; any, where none is recorded), holds it as {"tokenizer": ...}; None
    where there is none (a checkpoint of data without text, or one written before checkpoints carried their
    tokenizer)."""
    name = data.get("_class_path", "").rpartition(".")[2]
    states = [checkpoint.get(name)] if name else list(checkpoint.values())
    return next((s["tokenizer"] for s in states if isinstance(s, dict) and isinstance(s.get("tokenizer"), dict)), None)


def text_tokenizer(checkpoint: dict, path: str | Path):
    """The tokenizer of the data a checkpoint's contents were trained on (``checkpoint_tokenizer``); EvalError where the
    data is not text (MQAR, NIAH, ...), the checkpoint records none, or an older checkpoint's corpus is gone."""
    data = checkpoint_data(checkpoint, path)
    state = tokenizer_state(checkpoint, data)
    try:
        if state is not None:
            return tokenizer_from_state(state)
        class_path = data.get("_class_path", "")
        if "data_dir" in data:  # token shards of a checkpoint that carries no tokenizer: the one saved beside them
            from ..data.shards import load_tokenizer

            return load_tokenizer(data["data_dir"])
        if is_data_class(class_path, "lm", "LMDataModule"):  # rebuilt from the arguments (BPE: its cache or corpus)
            from dataclasses import fields

            from ..data.corpus import TextCorpus

            return TextCorpus(**{f.name: data[f.name] for f in fields(TextCorpus) if f.name in data}).build_tokenizer()
    except ValueError as e:  # the corpus of an older checkpoint moved or gone, a state that does not load, ...
        raise EvalError(f"--ckpt_path: {path} carries no tokenizer that can be read ({first_line(e)}); a checkpoint of "
                        "atlas-lab fit carries its tokenizer since this version: fit it again") from None
    raise EvalError(f"--ckpt_path: {path} was trained on {class_path or 'data of no recorded class'}, which has no "
                    "text tokenizer; expected a language model (atlas_lab.data.LMDataModule or "
                    "StreamingLMDataModule)")


def checkpoint_tokenizer(checkpoint: str | Path):
    """The tokenizer of the data a checkpoint was trained on: vocab_size, eos_id (None where the data has none),
    pad_id, encode(text) -> list[int], decode(ids) -> str. The one the checkpoint carries (the data module's state);
    for an older checkpoint, the one saved beside its token shards or rebuilt from its data's arguments. EvalError
    where the data is not text (MQAR, NIAH, ...) or the checkpoint records none."""
    return text_tokenizer(read_checkpoint(checkpoint), checkpoint)


def check_language_model(checkpoint: dict, path: str | Path):
    """(tokenizer, training length T) of a checkpoint of a language model of text, checked before its model is loaded:
    EvalError where the data is not text, the model does not predict the next token or its vocabulary is too small."""
    data = checkpoint_data(checkpoint, path)
    tokenizer = text_tokenizer(checkpoint, path)
    hparams = checkpoint["hyper_parameters"]
    if hparams.get("target", "next_token") != "next_token":
        raise EvalError(f"--ckpt_path: {path} decodes {hparams['target']!r} targets; expected a next-token model")
    if tokenizer.vocab_size > hparams["vocab_size"]:
        raise EvalError(f"--ckpt_path: {path} has a vocabulary of {hparams['vocab_size']} tokens, fewer than its "
                        f"tokenizer's {tokenizer.vocab_size}")
    if not isinstance(data.get("seq_len"), int):
        raise EvalError(f"--ckpt_path: {path} records no training length (the data's seq_len)")
    return tokenizer, data["seq_len"]


@dataclass
class Checkpoint:
    """A language model of ``atlas-lab fit`` ready to evaluate.

    path: the file; model: its LanguageModel in eval mode on ``device``; tokenizer: ``checkpoint_tokenizer``;
    seq_len: the training length T (the data's ``seq_len``); run: the fit's MLflow run ({tracking_uri,
    experiment_id, run_id}) or None where the checkpoint records none.
    """

    path: Path
    model: LanguageModel
    tokenizer: object
    seq_len: int
    run: dict | None

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "Checkpoint":
        """Read ``path``; EvalError (one line) for a missing or unreadable file, data that is not text, or a model that
        does not predict the next token."""
        from ..lit.module import SequenceModel

        path = Path(path)
        contents = read_checkpoint(path)
        tokenizer, seq_len = check_language_model(contents, path)
        module = SequenceModel.load_from_checkpoint(path, map_location=device, weights_only=False)
        return cls(path, module.model.eval(), tokenizer, seq_len, contents.get("mlflow_run"))
