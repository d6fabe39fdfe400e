"""Sweeps: YAML ablation grids and searches run as Optuna studies, every trial an MLflow run."""
from .driver import run_sweep, validate_configs
from .report import summarize
from .spec import SweepError, SweepSpec, load_sweep

__all__ = ["run_sweep", "validate_configs", "summarize", "SweepError", "SweepSpec", "load_sweep"]
