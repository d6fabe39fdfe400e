"""The ``atlas-lab`` command."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

GATE_SYMBOLS = {"alpha": "α", "eta": "η", "theta": "θ", "gamma": "γ"}


def gates_text(config) -> str:
    """Learned gates by symbol, constants as symbol=value (θ only where the optimiser uses it)."""
    parts = []
    for g, sym in GATE_SYMBOLS.items():
        if g == "theta" and config.optimizer == "gd":
            continue
        value = getattr(config, g)
        parts.append(f"{sym}_t" if value == "learned" else f"{sym}={value:g}")
    return " ".join(parts)


def presets_table(d_model: int, n_layers: int, n_heads: int, vocab_size: int, swa_window: int) -> Table:
    from .models import PRESETS, LanguageModel

    table = Table(title=f"atlas-lab presets (parameters and state at d_model={d_model}, {n_layers} layers, "
                        f"{n_heads} heads, vocab {vocab_size}, SWA window {swa_window}; float32, batch 1)")
    for col in ("preset", "layers", "memory", "feature map", "objective", "window", "optimizer", "gates",
                "parameters", "state (bytes)", "+bytes/token"):
        table.add_column(col, justify="right" if col in ("parameters", "state (bytes)", "+bytes/token") else "left")
    for name in PRESETS:
        model = LanguageModel(vocab_size, name, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                              swa_window=swa_window)
        c = model.memory_config
        if c is None:
            components = ["—"] * 6
        else:
            memory = c.memory if c.memory == "linear" else f"{c.memory}(L={c.depth},E={c.expansion})"
            fmap = c.feature_map if c.feature_map == "identity" else f"{c.feature_map}(p={c.degree})"
            opt = c.optimizer if c.optimizer != "muon" else f"muon(k={c.ns_steps},{c.ns_coefficients})"
            components = [memory, fmap, c.objective, "global" if c.window is None else str(c.window), opt,
                          gates_text(c)]
        layers = "+".join(dict.fromkeys(model.layer_kinds))
        table.add_row(name, layers, *components, f"{model.num_parameters():,}", f"{model.state_bytes():,}",
                      f"{model.cache_bytes_per_token():,}")
    return table


RUN_COMMANDS = ("fit", "validate", "test")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in RUN_COMMANDS:  # one run through LightningCLI
        from .lit.cli import run_cli

        run_cli(argv)
        return 0
    parser = argparse.ArgumentParser(prog="atlas-lab", description="Test-time-memory models: experiments and ablations.",
                                     epilog="atlas-lab fit|validate|test -c lightning_config.yaml -c experiments/<x>.yaml "
                                            "[--dotted.key=value]: one run (see atlas-lab fit --help)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("presets", help="every named model with its five components and sizes")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--swa-window", type=int, default=64)
    args = parser.parse_args(argv)
    if args.command == "presets":
        Console().print(presets_table(args.d_model, args.n_layers, args.n_heads, args.vocab_size, args.swa_window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
