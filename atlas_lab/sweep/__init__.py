"""Sweeps: YAML ablation grids and searches run as Optuna studies, every trial an MLflow run.

Its names are imported on first use (``atlas_lab.sweep.run_sweep`` imports the driver, Optuna and MLflow), so that
``atlas_lab.sweep.spec`` — the sweep file and its checks — answers a bad file before any of them is imported."""
from ..exports import lazy_exports

_HOMES = {"run_sweep": "driver", "validate_configs": "driver", "summarize": "report", "SweepError": "spec",
          "SweepSpec": "spec", "load_sweep": "spec"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
