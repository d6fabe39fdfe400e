"""A checkpoint of ``atlas-lab fit`` read for evaluation: its language model, tokenizer, training length and MLflow run.

What a checkpoint holds (written by LightningCLI through Lightning): ``hyper_parameters`` (the model's, with the
values linked from the data), ``datamodule_hyper_parameters`` (the data module's arguments and ``_class_path``:
``TaskDataModule`` saves them) and ``mlflow_run`` ({tracking_uri, experiment_id, run_id} of the fit:
``SequenceModel.on_save_checkpoint``; absent without an MLflow logger).
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.lm import LMDataModule, lm_tokenizer
from ..data.tokenizers import tokenizer_kind
from ..lit.module import SequenceModel
from ..models import LanguageModel

SHARDS = "atlas_lab.data.shards"  # token shards whose tokenizer is saved beside them: load_tokenizer(data_dir)


class EvalError(ValueError):
    """Bad input to an evaluation: one line naming the argument or file, what was expected and what was given."""


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint's contents (tensors memory-mapped, on the CPU). EvalError for a missing or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"--ckpt_path: no such checkpoint file: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as e:  # not a torch zip file, truncated, ...: whatever torch says, as one line
        raise EvalError(f"--ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise EvalError(f"--ckpt_path: {path} is not a checkpoint of atlas-lab fit (no state_dict and "
                        "hyper_parameters)")
    return checkpoint


def checkpoint_data(checkpoint: dict, path: str | Path) -> dict:
    """The data module's arguments recorded in a checkpoint (``_class_path`` among them when LightningCLI built it)."""
    data = checkpoint.get("datamodule_hyper_parameters")
    if not data:
        raise EvalError(f"--ckpt_path: {path} records no data module (a checkpoint of atlas-lab fit records its data's "
                        "arguments since the data modules save them; fit it again, or save it with "
                        "Trainer.fit(datamodule=...))")
    return dict(data)


def checkpoint_tokenizer(checkpoint: str | Path):
    """The tokenizer of the data a checkpoint was trained on: vocab_size, eos_id (None where the data has none),
    pad_id, encode(text) -> list[int], decode(ids) -> str. Rebuilt from the data module's arguments in the checkpoint;
    EvalError where the data is not text (MQAR, NIAH, ...) or the checkpoint records none."""
    data = checkpoint_data(read_checkpoint(checkpoint), checkpoint)
    if "data_dir" in data and importlib.util.find_spec(SHARDS) is not None:
        # token shards (atlas_lab.data.shards): the tokenizer saved beside the shards in data_dir
        return importlib.import_module("atlas_lab.data.shards").load_tokenizer(data["data_dir"])
    class_path = data.get("_class_path", "")
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, LMDataModule)):
        raise EvalError(f"--ckpt_path: {checkpoint} was trained on {class_path or 'data of no recorded class'}, "
                        "which has no text tokenizer; expected a language model (atlas_lab.data.LMDataModule)")
    return lm_tokenizer(tokenizer_kind(data["tokenizer"]), data["bpe_vocab_size"], data["data_path"],
                        data["cache_dir"], data["holdout_fraction"])


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
        path = Path(path)
        contents = read_checkpoint(path)
        data = checkpoint_data(contents, path)
        tokenizer = checkpoint_tokenizer(path)
        hparams = contents["hyper_parameters"]
        if hparams.get("target", "next_token") != "next_token":
            raise EvalError(f"--ckpt_path: {path} decodes {hparams['target']!r} targets; expected a next-token model")
        if tokenizer.vocab_size > hparams["vocab_size"]:
            raise EvalError(f"--ckpt_path: {path} has a vocabulary of {hparams['vocab_size']} tokens, fewer than its "
                            f"tokenizer's {tokenizer.vocab_size}")
        if not isinstance(data.get("seq_len"), int):
            raise EvalError(f"--ckpt_path: {path} records no training length (the data's seq_len)")
        module = SequenceModel.load_from_checkpoint(path, map_location=device, weights_only=False)
        return cls(path, module.model.eval(), tokenizer, data["seq_len"], contents.get("mlflow_run"))
