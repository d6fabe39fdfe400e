"""Shared pieces of the benchmark scripts (imported as ``common``: the scripts run as ``python benchmarks/<name>.py``,
which puts this folder first on ``sys.path``).

- ``add_common_args``: ``--tiny`` (tiny shapes, 1 repeat, 1 thread unless ``--threads``: a check that the script
  runs, not a measurement), ``--repeats``, ``--threads``, ``--out``; ``apply_tiny`` sets the tiny values.
- ``set_threads``: torch's intra-op threads (None keeps torch's default); returns the count in force.
- ``median_time``: warm-up call(s), then the median of ``repeats`` ``time.perf_counter`` timings.
- ``print_table`` / ``write_json`` / ``out_path`` / ``meta``: the rich table and the JSON under ``runs/bench/``.
- ``peer``: import an optional peer library, or say how to install it and return None (that column is skipped).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent  # the repository: results land in its runs/bench/ from any cwd
BENCH_DIR = ROOT / "runs" / "bench"

# how to get each optional peer: `make .venv/.bench-peers` installs them into .venv with torch pinned to the version
# already there (so pip never replaces it); `make bench` does that first
INSTALL_HINTS = {
    "titans_pytorch": "make .venv/.bench-peers   (titans-pytorch==0.5.5 and fla-core into .venv, torch kept; "
                      "`make bench` does it too)",
    "fla": "make .venv/.bench-peers   (titans-pytorch==0.5.5 and fla-core into .venv, torch kept; "
           "`make bench` does it too)",
}


def add_common_args(ap: argparse.ArgumentParser, repeats: int = 3, out: bool = True) -> argparse.ArgumentParser:
    ap.add_argument("--tiny", action="store_true",
                    help="tiny shapes, 1 repeat, 1 thread unless --threads: checks that the script runs; the times "
                         "are not measurements")
    ap.add_argument("--repeats", type=int, default=repeats, help="timed repeats after the warm-up (median)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice; 1 with --tiny)")
    if out:
        ap.add_argument("--out", default=None, help="JSON path (default runs/bench/<name>.json, "
                                                    "runs/bench/<name>.tiny.json with --tiny)")
    return ap


def apply_tiny(args: argparse.Namespace, tiny: dict) -> argparse.Namespace:
    """With --tiny: the script's tiny settings replace the arguments, and 1 thread unless --threads was given
    (a check that should disturb nothing else running on the machine)."""
    if args.tiny:
        for key, value in tiny.items():
            setattr(args, key, value)
        if not args.threads:
            args.threads = 1
    return args


def default_cap_gib() -> float:
    """Three quarters of the machine's physical memory, in GiB."""
    try:
        return round(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return 0.0


def add_child_args(ap: argparse.ArgumentParser, names: tuple[str, str]) -> argparse.ArgumentParser:
    """The flags of a benchmark that measures each point in a fresh process: ``--max-gib`` (the child's address-space
    cap, so that running out of memory is a row with its error instead of a kill by the out-of-memory killer) and the
    hidden ``--child NAME T`` by which the script re-invokes itself for one point."""
    ap.add_argument("--max-gib", dest="max_gib", type=float, default=default_cap_gib(),
                    help="address-space cap of each measurement's process (GiB; 0: none; default 3/4 of the machine's "
                         "memory): a point that needs more fails as a row instead of calling the out-of-memory killer")
    ap.add_argument("--child", nargs=2, metavar=names, default=None, help=argparse.SUPPRESS)
    return ap


def cap_address_space(gib: float | None) -> None:
    """Limit this process's address space (RLIMIT_AS) to ``gib`` GiB (None or 0: no limit). An allocation past it
    fails with a Python exception (torch: "DefaultCPUAllocator: can't allocate memory"), which a benchmark reports as
    a row, instead of the kernel's out-of-memory killer ending the process (and maybe a neighbour's). CPU only: CUDA
    reserves more address space than any sensible cap."""
    if gib:
        import resource

        cap = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def release_freed_memory(threshold: int) -> None:
    """glibc: serve every allocation of ``threshold`` bytes or more by mmap, and unmap it when freed
    (mallopt M_MMAP_THRESHOLD, which also stops glibc from raising the threshold after large frees). Otherwise
    freed buffers stay on glibc's heap, which fragments: the resident peak becomes the heap's high-water mark
    rather than the live memory (the same as ``MALLOC_MMAP_THRESHOLD_`` set before the process starts)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).mallopt(-3, threshold)  # -3: M_MMAP_THRESHOLD
        except (OSError, AttributeError):  # not glibc
            pass


def child_command(script: str, preset: str, T: int, args, *extra: str) -> list[str]:
    """The command that re-invokes a benchmark ``script`` for one (preset, T) measurement with the model-size,
    address-cap, checkpoint and thread arguments of ``args``; ``extra``: the script's own flags."""
    cmd = [sys.executable, script, "--child", preset, str(T), "--d-model", str(args.d_model), "--n-layers",
           str(args.n_layers), "--n-heads", str(args.n_heads), "--max-gib", str(args.max_gib or 0),
           "--checkpoint" if args.checkpoint else "--no-checkpoint", *extra]
    cmd += ["--memory-heads", str(args.memory_heads)] if getattr(args, "memory_heads", None) else []
    return cmd + (["--threads", str(args.threads)] if args.threads else [])


def child_record(args, rows: list[dict], complete: bool, **extra) -> dict:
    """The JSON of a benchmark measured by ``child_command`` processes: ``meta``, the settings the children got,
    ``extra``, the rows so far and ``complete`` (false while a run is still adding rows)."""
    return meta(args, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, max_gib=args.max_gib,
                checkpoint=args.checkpoint, **extra, complete=complete, rows=rows)


def run_child(cmd: list[str], timeout: float | None = None) -> dict:
    """Run ``cmd`` (a benchmark re-invoking itself for one measurement) in a fresh process; its last stdout line
    is a JSON dict. A failure is ``{"error": why}``: the last stderr line, the signal that killed it (SIGKILL: the
    out-of-memory killer, probably) or the timeout."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout} s")
    if p.returncode == 0:
        try:
            return json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    if p.returncode < 0:
        name = signal.Signals(-p.returncode).name
        return dict(error=f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else ""))
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return dict(error=lines[-1][:200] if lines else f"exit code {p.returncode}")


def set_threads(n: int | None) -> int:
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Seconds: ``warmup`` untimed calls, then the median of ``repeats`` timed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def out_path(name: str, args: argparse.Namespace | None = None) -> Path:
    """``--out`` if given, else runs/bench/<name>.json (``<name>.tiny.json`` for --tiny: a tiny run never
    overwrites a measurement)."""
    if args is not None and getattr(args, "out", None):
        return Path(args.out)
    tiny = args is not None and getattr(args, "tiny", False)
    return BENCH_DIR / f"{name}{'.tiny' if tiny else ''}.json"


def meta(args: argparse.Namespace | None = None, **extra) -> dict:
    """What a result depends on: torch version, threads, machine, the command line, --tiny."""
    import torch

    out = dict(torch=torch.__version__, threads=torch.get_num_threads(), python=platform.python_version(),
               machine=platform.machine(), processor=platform.processor() or None, argv=sys.argv[1:],
               tiny=bool(getattr(args, "tiny", False)), time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    out.update(extra)
    return out


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1,
                caption: str | None = None, left_named: Sequence[str] = ("error", "note")) -> None:
    """A table (``atlas_lab.tables``: nothing cut at any width); the first ``left`` columns and those named in
    ``left_named`` are left-aligned, the others right-aligned; None is shown as "—"."""
    from atlas_lab.tables import print_table as print_any

    right = [c for i, c in enumerate(columns) if i >= left and c not in left_named]
    print_any(console(), title, columns, list(rows), right=right, keys=left, caption=caption)


def write_json(path: Path | str, payload, quiet: bool = False) -> Path:
    """Write ``payload``; ``quiet``: without the "wrote" line (a long benchmark saving each row as it comes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    if quiet:
        return path
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    console().print(f"wrote {shown}", markup=False)
    return path


def console():
    """A rich console; when the output is not a terminal (a log file, `make bench > log`) it is 160 columns wide
    instead of rich's 80, so that the tables are not squeezed."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=160)


def peer(module: str, what: str | None = None):
    """Import an optional peer library; if it is missing, say so and how to install it, and return None."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = INSTALL_HINTS.get(module.split(".")[0], f"pip install {module.split('.')[0]}")
        console().print(f"[yellow]{what or module}: skipped ({module} is not importable: {e}).[/yellow]\n"
                        f"  install it with: {hint}", soft_wrap=True)
        return None


def rel_err(a, b) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def add_checkpoint_arg(ap) -> None:
    ap.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True,
                    help="memory presets recompute each chunk in the backward (MemoryConfig.checkpoint; default on: "
                         "without it the muon presets need several GiB per 1K tokens)")


def preset_model(preset: str, args, vocab_size: int):
    """LanguageModel(vocab_size, preset) at args.d_model / n_layers / n_heads (/ memory_heads), seeded; with
    ``args.checkpoint``
    every preset that has a memory recomputes each chunk in the backward."""
    import torch

    from atlas_lab.models import PRESETS, LanguageModel

    torch.manual_seed(0)
    memory = {"checkpoint": True} if args.checkpoint and PRESETS[preset]["memory"] is not None else None
    return LanguageModel(vocab_size, preset, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                         memory_heads=getattr(args, "memory_heads", None), memory=memory)
