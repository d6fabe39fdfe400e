"""S-NIAH from ``atlas-lab eval --niah 1024,2048,4096``: a checkpoint scored on the test split of the S-NIAH data
module (atlas_lab/data/niah.py) at each length, by the metrics ``atlas-lab test`` computes (``SequenceModel``'s
test step: the mean NLL and the teacher-forced accuracy of the answer tokens, the accuracy per depth bucket, and the
exact match of the greedy answer).

The data module is the checkpoint's own where it was trained on S-NIAH (its recorded arguments, with the lengths and,
given --limit, the number of samples replaced); else S-NIAH-1 (noise haystack, 7-digit numbers) with the module's
byte tokenizer, which the checkpoint must read as it was trained: a model of UTF-8 bytes (the lm task's
``tokenizer: byte``, or a corpus prepared with ``--tokenizer byte``). Each length is a data module of its own
(``lengths=[n]``: the test samples of the same random stream, so the same keys and values at every length, in
haystacks of growing length) scored by one ``Trainer.test``.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass

from ..data.tokenizers import describe
from .checkpoint import EvalError, checkpoint_data, is_data_class, read_checkpoint, text_tokenizer

RESIZED = ("lengths", "train_lengths", "train_size", "batch_size", "num_workers", "_class_path")  # set here
# S-NIAH-1's words, digits and punctuation: a tokenizer that gives their UTF-8 bytes reads the task as it is written
PROBE = ("The grass is green. The sky is blue. One of the special magic numbers for rapid-tiger is: 1234567. \n"
         "What is the special magic number for rapid-tiger mentioned in the provided text?")


@dataclass
class NIAHScores:
    """One length's scores: loss (mean NLL of the answer tokens, nats: test/loss), acc (answer tokens predicted,
    teacher-forced: test/acc), exact_match (the greedy answer is the value: test/exact_match), depth_acc
    {"depth0-20": acc, ...} (test/acc per depth bucket)."""

    length: int
    samples: int
    loss: float
    acc: float
    exact_match: float
    depth_acc: dict[str, float]


def _refuse(path, reads: str) -> EvalError:
    return EvalError(f"--niah: {path} was trained on {reads}, which does not read S-NIAH's UTF-8 bytes as they are "
                     "written; expected a checkpoint trained on bytes (atlas-lab data prepare --tokenizer byte, or the "
                     "lm task's tokenizer: byte) or on S-NIAH")


def check_niah(checkpoint: dict, path) -> tuple[bool, object]:
    """Whether a checkpoint's contents can be scored on S-NIAH, before its data is built: (trained on S-NIAH, the
    tokenizer of its text or None). EvalError (one line) for a model that does not predict the next token, or one
    trained on other text than UTF-8 bytes or on no text."""
    data, hparams = checkpoint_data(checkpoint, path), checkpoint["hyper_parameters"]
    if hparams.get("target", "next_token") != "next_token":
        raise EvalError(f"--ckpt_path: {path} decodes {hparams['target']!r} targets; expected a next-token model")
    if is_data_class(data.get("_class_path", ""), "niah", "NIAHDataModule"):
        return True, None
    try:
        tokenizer = text_tokenizer(checkpoint, path)
    except EvalError:
        raise _refuse(path, f"no text ({data.get('_class_path', 'data of no recorded class')})") from None
    if tokenizer.encode(PROBE) != list(PROBE.encode("utf-8")):
        raise _refuse(path, describe(tokenizer))
    return False, tokenizer


def niah_modules(path: str, lengths: list[int], samples: int | None, batch_size: int) -> list:
    """The S-NIAH data modules a checkpoint is scored on, one per length, their test splits built (module docstring).
    EvalError (one line) for a checkpoint that cannot read the task or a length too short for its texts."""
    from ..data.niah import NIAHDataModule

    contents = read_checkpoint(path)
    own, tokenizer = check_niah(contents, path)
    data, hparams = checkpoint_data(contents, path), contents["hyper_parameters"]
    base = {k: v for k, v in data.items() if k not in RESIZED} if own else {}
    if samples is not None:
        base["eval_size"] = samples
    modules = []
    for n in lengths:
        try:
            dm = NIAHDataModule(**base, lengths=[n], train_lengths=[n], train_size=1, batch_size=batch_size)
            dm.setup("test")
        except ValueError as e:  # "lengths: 40 tokens cannot hold the needle, question and answer ..."
            raise EvalError(f"--niah: {str(e).removeprefix('lengths: ')}") from None
        modules.append(dm)
    ids = modules[0].datasets["test"].input_ids[0]
    if not own and tokenizer.encode(modules[0].decode(ids)) != [int(i) for i in ids]:
        raise _refuse(path, describe(tokenizer))
    top = max(int(x.max()) for dm in modules for x in dm.datasets["test"].input_ids)
    if top >= hparams["vocab_size"]:
        raise EvalError(f"--niah: S-NIAH's texts hold token {top}; {path} has a vocabulary of {hparams['vocab_size']}")
    return modules


def niah_scores(path: str, modules: list) -> list[NIAHScores]:
    """Each module's test split scored by ``Trainer.test`` of the checkpoint's SequenceModel, given the module's
    slice names (length × depth bucket); nothing is logged or written."""
    import lightning as L
    import torch

    from ..lit.module import SequenceModel

    scores = []
    with tempfile.TemporaryDirectory() as root:
        for dm in modules:
            model = SequenceModel.load_from_checkpoint(path, map_location="cpu", weights_only=False,
                                                       slice_names=dm.slice_names, bytes_per_token=None,
                                                       generate_answers=True)
            trainer = L.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=root)
            (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
            prefix = f"test/acc/L{dm.lengths[0]}-"
            scores.append(NIAHScores(dm.lengths[0], len(dm.datasets["test"]), metrics["test/loss"], metrics["test/acc"],
                                     metrics["test/exact_match"],
                                     {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}))
    return scores
