"""The config files of ``atlas-lab fit|validate|test`` (``-c FILE``) and the model's values, checked without importing
Lightning: the command checks them before it imports the LightningCLI (``atlas_lab.lit.cli``, ~3.5 s of imports), so a
missing or broken file or a bad model value is one line at once; the CLI's parser checks everything again."""
from __future__ import annotations

import argparse
import functools
from dataclasses import fields
from pathlib import Path
from typing import Literal, Optional, Union, get_type_hints

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


def check_value(key: str, value, kind) -> None:
    """ConfigError ``<key>: expected <kind>; got <value>`` unless ``value`` conforms to ``kind`` (the components'
    checker, ``memory.components.check_value``: one line for a run's value and a component's option alike)."""
    from .memory.components import check_value as check_option

    try:
        check_option(key, value, kind)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_class(key: str, value) -> type | None:
    """A class given by ``value`` (a dotted path, or a mapping with a class_path): ConfigError naming ``key`` where it
    cannot be imported; the class where it is imported, None where no dotted path is given (a bare name is the
    parser's to resolve)."""
    from .memory.components import import_class

    path = value.get("class_path") if isinstance(value, dict) else value
    if not isinstance(path, str) or "." not in path:
        return None
    try:
        return import_class(path, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


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
    ``--<name>.<key>=value`` (or ``--<name>.<key> value``, a YAML value; ``--<name>.<key>+=value`` appends to a list),
    in the command line's order; a class's ``init_args`` merged, other keys replaced; other keys are left out."""
    out = {}

    def put(key, value):
        merge = key == "init_args" and isinstance(out.get(key), dict) and isinstance(value, dict)
        out[key] = {**out[key], **value} if merge else value

    for i, arg in enumerate(args):  # in the command line's order, as the CLI's parser applies them
        key, equals, value = arg.partition("=")
        value = value if equals else args[i + 1] if i + 1 < len(args) else ""
        if key in ("-c", "--config"):
            tree = trees.get(value).get(name) if isinstance(trees.get(value), dict) else None
            for k, v in (tree.items() if isinstance(tree, dict) else ()):
                if k in keys:
                    put(k, v)
        elif key.endswith("+") and key.startswith(f"--{name}.") and key[:-1].removeprefix(f"--{name}.") in keys:
            field = key[:-1].removeprefix(f"--{name}.")  # --trainer.callbacks+=X: one more item
            before = out.get(field)
            out[field] = [*(before if isinstance(before, list) else [] if before is None else [before]),
                          yaml.safe_load(value)]
        elif key.startswith(f"--{name}.") and key.removeprefix(f"--{name}.") in keys:
            put(key.removeprefix(f"--{name}."), yaml.safe_load(value))
        elif key.startswith(f"--{name}.") and key.count(".") == 2 and key.split(".")[1] in keys:
            field, part = key.split(".")[1:]  # --model.memory.window=16: one key of a mapping, merged into it
            out[field] = {**(out[field] if isinstance(out.get(field), dict) else {}), part: yaml.safe_load(value)}
    return out


def check_values(args: list[str], trees: dict) -> None:
    """The model's values (ModelConfig's types and ranges, a renamed key) and the trainer's (``TRAINER_VALUES``),
    checked by their annotations (``check_value``) before Lightning is imported: each config file's on its own (the
    line names the file), then as the run will see them. A bad preset, size or step count is one line in ~1 s (torch's
    import) instead of ~4 s; the memory's changes (``model.memory``, ``--model.memory.<key>``) are checked by
    MemoryConfig against the preset's memory, as the model will build it. What this cannot see (a component's options
    on the command line, a layer pattern's memories) the model checks as it is built; the classes of a run and their
    arguments are ``check_classes``'s."""
    from .memory.config import MemoryConfig
    from .models.lm import MemoryChanges, ModelConfig
    from .models.presets import resolve_preset

    model_types = get_type_hints(ModelConfig)
    memory_keys = MemoryChanges.__annotations__
    for where, given in [*((f" (in {path})", ["-c", path]) for path in trees), ("", args)]:
        model = section(given, trees, "model", {*model_types, *(k.removeprefix("model.") for k in RENAMED)})
        try:
            for old, new in RENAMED.items():
                if old.removeprefix("model.") in model:
                    raise ConfigError(f"{old}: renamed; write {new}: {model[old.removeprefix('model.')]}")
            memory = model.get("memory")
            if isinstance(memory, dict):  # each key of model.memory on its own: a bad one is named by its key
                unknown = sorted(k for k in memory if k not in memory_keys)
                if unknown:
                    raise ConfigError(f"model.memory.{', '.join(unknown)}: unknown key; valid keys: "
                                      f"{', '.join(f.name for f in fields(MemoryConfig))}")
                for key, value in memory.items():
                    check_value(f"model.memory.{key}", value, memory_keys[key])
            for key, value in model.items():
                check_value(f"model.{key}", value, model_types[key])
            for key, value in section(given, trees, "trainer", TRAINER_VALUES).items():
                check_value(f"trainer.{key}", value, TRAINER_VALUES[key])
        except ConfigError as e:
            raise ConfigError(f"{e}{where}") from None
    try:
        config = ModelConfig(**model)
        if config.memory and resolve_preset(config.preset)[1] is not None:  # the memory's values: MemoryConfig's
            resolve_preset(config.preset, dict(config.memory))
    except ValueError as e:
        raise ConfigError(f"model.{e}") from None


def check_classes(args: list[str], trees: dict, model) -> None:
    """The run's classes and their arguments, by their annotations (``check_value``): the arguments of ``model`` (the
    LightningModule) that ModelConfig does not hold, the data module's class (importable) and its ``init_args``, and
    the trainer's callbacks and logger (importable); each config file's on its own (the line names the file), then as
    the run will see them. Called where Lightning is imported."""
    from .memory.components import argument_types

    model_types = argument_types(model)
    try:  # the run's data module, whose arguments a file's init_args are checked against
        cls = check_class("data", section(args, trees, "data", ("class_path",)))
    except ConfigError:  # named below, with the file that gives it
        cls = None
    init_types = argument_types(cls) if cls is not None else {}
    for where, given in [*((f" (in {path})", ["-c", path]) for path in trees), ("", args)]:
        try:
            for key, value in section(given, trees, "model", model_types).items():
                check_value(f"model.{key}", value, model_types[key])
            data = section(given, trees, "data", ("class_path", "init_args"))
            check_class("data", data)
            for key, value in (data["init_args"].items() if isinstance(data.get("init_args"), dict) else ()):
                if key in init_types:
                    check_value(f"data.init_args.{key}", value, init_types[key])
            for key, value in section(given, trees, "trainer", ("callbacks", "logger")).items():
                for item in value if isinstance(value, list) else [value]:
                    check_class(f"trainer.{key}", item)
        except ConfigError as e:
            raise ConfigError(f"{e}{where}") from None
