"""Sweeps: YAML ablation grids and searches run as Optuna studies, every trial an MLflow run.

Its names are imported on first use (``atlas_lab.sweep.run_sweep`` imports the driver, Optuna and MLflow), so that
``atlas_lab.sweep.spec`` — the sweep file and its checks — answers a bad file before any of them is imported."""
import importlib

_HOMES = {"run_sweep": "driver", "validate_configs": "driver", "summarize": "report", "SweepError": "spec",
          "SweepSpec": "spec", "load_sweep": "spec"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
