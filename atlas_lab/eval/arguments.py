"""The checks of ``atlas-lab eval``'s arguments and files that need nothing heavy: the command runs them before it
imports torch, Lightning, litdata or the harness, so that a bad argument or a missing file is one line at once."""
from __future__ import annotations

import zipfile
from pathlib import Path


class EvalError(ValueError):
    """Bad input to an evaluation: one line naming the argument or file, what was expected and what was given."""


def check_checkpoint_file(path: str | Path) -> Path:
    """The checkpoint's path; EvalError where it is not a file, or not the zip archive torch.save writes."""
    path = Path(path)
    if path.is_dir():
        raise EvalError(f"--ckpt_path: {path} is a folder; expected a checkpoint file of atlas-lab fit, e.g. "
                        "runs/checkpoints/last.ckpt")
    if not path.is_file():
        raise EvalError(f"--ckpt_path: no such checkpoint file: {path}")
    if not zipfile.is_zipfile(path):
        raise EvalError(f"--ckpt_path: {path} is not a readable checkpoint (not the zip archive torch.save writes); "
                        "expected a checkpoint file of atlas-lab fit, e.g. runs/checkpoints/last.ckpt")
    return path


def check_position_file(path: str | Path) -> None:
    """--ppl-by-position names a file or a folder (a split of a prepared corpus: what is in it is checked later)."""
    if not Path(path).exists():
        raise EvalError(f"--ppl-by-position: no such file: {path}")


def check_buckets(buckets: int, max_length: int) -> None:
    if not 1 <= buckets <= max_length:
        raise EvalError(f"--buckets: expected an int in [1, --max-length = {max_length}], got {buckets}")


def check_arguments(ckpt_path: str, tasks: list[str] | None, include_path: str | None, position_file: str | None,
                    max_length: int | None, buckets: int | None, niah: list[int] | None) -> None:
    """What ``atlas-lab eval`` can check without reading a file: the modes asked for and their options, and that the
    checkpoint, the task folder and the position file exist. EvalError (one line) otherwise."""
    if not tasks and position_file is None and not niah:
        raise EvalError("eval: give --tasks a,b (lm-evaluation-harness tasks), --ppl-by-position FILE, --niah "
                        "LENGTHS, or several")
    for name, value in (("--max-length", max_length), ("--buckets", buckets)):
        if position_file is None and value is not None:
            raise EvalError(f"{name}: used by --ppl-by-position FILE only")
    if include_path is not None and not tasks:
        raise EvalError("--include-path: used by --tasks a,b only")
    if position_file is not None and max_length is None:
        raise EvalError("--max-length: required with --ppl-by-position FILE: the tokens each sequence reads (e.g. 4 "
                        "times the training length)")
    check_checkpoint_file(ckpt_path)
    if include_path is not None and not Path(include_path).is_dir():
        raise EvalError(f"--include-path: no such folder: {include_path}")
    if position_file is not None:
        check_position_file(position_file)
        if buckets is not None:
            check_buckets(buckets, max_length)
