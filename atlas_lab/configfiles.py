"""The config files of ``atlas-lab fit|validate|test`` (``-c FILE``), checked without importing Lightning: the command
checks them before it imports the LightningCLI (``atlas_lab.lit.cli``), so a missing or broken file is one line at
once; the CLI reads them again for the keys renamed since an earlier version."""
from __future__ import annotations

from pathlib import Path

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
