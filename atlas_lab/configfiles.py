"""The config files of ``atlas-lab fit|validate|test`` (``-c FILE``) and the model's values, checked without importing
Lightning: the command checks them before it imports the LightningCLI (``atlas_lab.lit.cli``, ~3.5 s of imports), so a
missing or broken file or a bad model value is one line at once; the CLI's parser checks everything again."""
from __future__ import annotations

import argparse
import ast
import functools
import re
from dataclasses import fields
from pathlib import Path
from typing import Literal, Optional, Union

import yaml


class ConfigError(ValueError):
    """A run configuration that cannot run: one line naming the key, the expectation and the given value."""


def check_config_files(args: list[str]) -> dict:
    """Each ``-c``/``--config`` file exists and is valid YAML (the error names the file, line and column);
    returns {path: its YAML}."""
    trees = {}
    for i, arg in enumerate(args):
        path = args[i + 1] if arg in ("-c", "--config") and i + 1 < len(args) else \
            arg.split("=", 1)[1] if arg.startswith("--config=") else None
        if path is None:
            continue
        if Path(path).is_dir():
            raise ConfigError(f"{path}: a folder; expected a YAML config file")
        if not Path(path).is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            trees[path] = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); expected "
                              "a YAML config file") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    return trees


def _expected(kind: str) -> str:
    """A jsonargparse type as a person writes it: ``typing.Literal['a', 'b']`` -> 'a', 'b'; ``<class 'int'>`` -> int."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", kind)
    if literal:
        return literal.group(1)
    cls = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", kind)
    return {"NoneType": "null"}.get(cls.group(1), cls.group(1)) if cls else kind


# keys of earlier versions -> their name now: each a hidden argument of the parsers (``add_renamed``)
RENAMED = {"model.mixer": "model.preset"}


class Renamed(argparse.ArgumentTypeError, ValueError):
    """A value given to a renamed key: argparse keeps the message of an ArgumentTypeError (a value on the command
    line), jsonargparse that of a ValueError (a value in a config file)."""


def _refuse(new: str, value: str):
    raise Renamed(f"renamed; write {new}: {value}")


def add_renamed(parser) -> None:
    """Each key of ``RENAMED`` as a hidden argument of ``parser`` that refuses any value, saying how to write it now;
    given no value it is not in the parsed config."""
    for old, new in RENAMED.items():
        parser.add_argument(f"--{old}", type=functools.partial(_refuse, new), default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)


def one_line(message: str) -> str:
    """jsonargparse's parse error (often 10–60 lines of nested Union errors) as one line: the dotted key, what
    was expected (every alternative), and the value given.

    The one place that reads jsonargparse's text: jsonargparse 4.53 reports a bad value as an ``ArgumentError``
    whose only content is that text (its causes are ``ValueError``s of text too), with no key, type or value to
    read apart; a bad value inside a typed mapping (``model.memory``) is named by its key only in the text of the
    value given (``NestedArg(key='window', ...)``)."""
    single = re.fullmatch(r'(?:Parser key "([^"]+)"|argument --(\S+)): ([^\n]*)', message)
    if single:  # a message of the project's own (a renamed key): the key and the message
        return f"{single.group(1) or single.group(2)}: {single.group(3)}"
    keys = re.findall(r'Parser key "([^"]+)"', message)
    nested = re.search(r"Given value: NestedArg\(key='((?!class_path|init_args)[\w.]+)'", message)
    key = ".".join(keys[:1] + [k for k in keys[1:] if k != "class_path"] + ([nested.group(1)] if nested else []))
    unexpected = re.search(r"Unexpected keys: (\{[^}]*\})", message)
    if keys and unexpected:  # a typed mapping's unknown key (model.memory: MemoryConfig's fields)
        from .memory.config import MemoryConfig

        names = ", ".join(sorted(ast.literal_eval(unexpected.group(1))))
        valid = ", ".join(f.name for f in fields(MemoryConfig)) if keys[0] == "model.memory" else None
        return f"{keys[0]}.{names}: unknown key" + (f"; valid keys: {valid}" if valid else "")
    missing = re.search(r"Problem with given class_path '([^']+)':\s*\n\s*(.*(?:has no attribute|No module named).*)$",
                        message, re.M)
    if keys and missing:  # a class that cannot be imported: name it, not one of the Union's alternatives
        return f"{key}: class_path '{missing.group(1)}' cannot be imported ({missing.group(2).strip()})"
    causes = [ln.strip()[2:] for ln in message.splitlines() if ln.strip().startswith("- ")]
    causes = [c for c in causes if not c.startswith(("Expected a", "Problem with", "Does not validate"))]
    if "Does not validate against any of the Union subtypes" in message and len(causes) == 1:
        return causes[0]  # a class's own error, e.g. a data module's check, behind a Union of class or null
    expected = re.findall(r"Expected an? (.+?)(?:\. Got value:.*)?$", message, re.M)
    # a value inside model.memory: the last alternative is the mapping's own null (Optional), not the value's
    expected = list(dict.fromkeys(_expected(e.strip().rstrip(".")) for e in expected[:-1 if nested else None]))
    given = re.search(r"(?:Given value|Got value): (.*)$", message, re.M)
    if not keys or not expected:
        lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
        return ". ".join(lines[:1] + [ln for ln in lines[1:] if "File does not exist" in ln])
    return f"{key}: expected {' or '.join(expected)}" + (f"; got {given.group(1).strip()}" if given else "")


# Lightning's Trainer arguments whose types name no Lightning class (Trainer.__init__'s annotations, lightning 2.6;
# tests/test_bad_input.py holds this table to the installed Lightning's signature): checked before it is imported
TRAINER_VALUES = {
    "devices": Union[list[int], str, int], "num_nodes": int,
    "precision": Union[Literal[64, 32, 16], Literal["transformer-engine", "transformer-engine-float16", "16-true",
                                                    "16-mixed", "bf16-true", "bf16-mixed", "32-true", "64-true"],
                       Literal["64", "32", "16", "bf16"], None],
    "fast_dev_run": Union[int, bool], "max_epochs": Optional[int], "min_epochs": Optional[int],
    "max_steps": int, "min_steps": Optional[int], "limit_train_batches": Union[int, float, None],
    "limit_val_batches": Union[int, float, None], "limit_test_batches": Union[int, float, None],
    "limit_predict_batches": Union[int, float, None], "overfit_batches": Union[int, float],
    "check_val_every_n_epoch": Optional[int], "num_sanity_val_steps": Optional[int],
    "log_every_n_steps": Optional[int], "enable_checkpointing": Optional[bool], "enable_progress_bar": Optional[bool],
    "enable_model_summary": Optional[bool], "accumulate_grad_batches": int,
    "gradient_clip_val": Union[int, float, None], "gradient_clip_algorithm": Optional[str],
    "deterministic": Union[bool, Literal["warn"], None], "benchmark": Optional[bool], "inference_mode": bool,
    "use_distributed_sampler": bool, "detect_anomaly": bool, "barebones": bool, "sync_batchnorm": bool,
    "reload_dataloaders_every_n_epochs": int, "enable_autolog_hparams": bool, "model_registry": Optional[str],
}


def section(args: list[str], trees: dict, name: str, keys) -> dict:
    """The ``keys`` of section ``name`` as the run will see them: a config file's ``<name>:`` keys and
    ``--<name>.<key>=value`` (or ``--<name>.<key> value``, a YAML value), in the command line's order; other keys are
    left out."""
    out = {}
    for i, arg in enumerate(args):  # in the command line's order, as the CLI's parser applies them
        key, equals, value = arg.partition("=")
        value = value if equals else args[i + 1] if i + 1 < len(args) else ""
        if key in ("-c", "--config"):
            tree = trees.get(value).get(name) if isinstance(trees.get(value), dict) else None
            out.update({k: v for k, v in tree.items() if k in keys} if isinstance(tree, dict) else {})
        elif key.startswith(f"--{name}.") and key.removeprefix(f"--{name}.") in keys:
            out[key.removeprefix(f"--{name}.")] = yaml.safe_load(value)
        elif key.startswith(f"--{name}.") and key.count(".") == 2 and key.split(".")[1] in keys:
            field, part = key.split(".")[1:]  # --model.memory.window=16: one key of a mapping, merged into it
            out[field] = {**(out[field] if isinstance(out.get(field), dict) else {}), part: yaml.safe_load(value)}
    return out


def check_values(args: list[str], trees: dict) -> None:
    """The model's values (ModelConfig's types and ranges, a renamed key) and the trainer's (``TRAINER_VALUES``)
    through jsonargparse's public parser, before Lightning is imported: each config file's on its own (the line names
    the file), then as the run will see them. A bad preset, size or step count is the line the CLI's parser would
    give, in ~1 s (torch's import) instead of ~4 s; the memory's changes (``model.memory``, ``--model.memory.<key>``)
    are checked by MemoryConfig against the preset's memory, as the model will build it. What this cannot see (other
    keys, a component's options on the command line, a layer pattern's memories) the CLI checks."""
    from jsonargparse import ArgumentError, ArgumentParser

    from .models.lm import MemoryChanges, ModelConfig
    from .models.presets import resolve_preset

    model_keys = {f.name for f in fields(ModelConfig)} | {k.removeprefix("model.") for k in RENAMED}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ModelConfig, "model")
    for key, kind in TRAINER_VALUES.items():
        parser.add_argument(f"--trainer.{key}", type=kind)
    add_renamed(parser)
    for where, given in [*((f" (in {path})", ["-c", path]) for path in trees), ("", args)]:
        model = section(given, trees, "model", model_keys)
        changes = model.get("memory") if isinstance(model.get("memory"), dict) else {}
        changes = {k: v for k, v in changes.items() if k in MemoryChanges.__annotations__}
        try:
            if changes:  # each key of model.memory an argument of its own: a bad value is named by its key
                memory = ArgumentParser(exit_on_error=False)
                for key in changes:
                    memory.add_argument(f"--model.memory.{key}", type=MemoryChanges.__annotations__[key])
                memory.parse_object({"model": {"memory": changes}})
            values = parser.parse_object({"model": model, "trainer": section(given, trees, "trainer", TRAINER_VALUES)})
        except ArgumentError as e:
            raise ConfigError(one_line(str(e)) + where) from None
    try:
        ModelConfig(**vars(values.model))
        memory = values.model.memory
        if memory and resolve_preset(values.model.preset)[1] is not None:  # the memory's values: MemoryConfig's
            resolve_preset(values.model.preset, dict(memory))
    except ValueError as e:
        raise ConfigError(f"model.{e}") from None
