"""The ``atlas-lab`` command."""
from __future__ import annotations

import argparse
import math
import sys

from rich.console import Console

from .tables import print_table

def gates_text(config) -> str:
    """The learning rule's gates: learned ones by symbol (``_t,c``: one per channel, ``_t,m``: one per weight
    matrix), constants as symbol=value (θ only where the optimiser uses it; a gate that is 1 by default, gdn2's erase
    and write, only where it is not 1), then what the rule adds (n_h: DeltaProduct's steps per token; R: the tokens
    between resets)."""
    parts = []
    rule = config.rule()
    for spec in rule.gates(config, config.components()[3]).values():
        value = spec.value
        if not spec.used or value == spec.neutral:
            continue
        per = {"head": "", "matrix": ",m"}.get(spec.axis, ",c")
        parts.append(f"{spec.symbol}_t{per}" if value == "learned" else f"{spec.symbol}_h" if value == "head_decay"
                     else f"{spec.symbol}={value:g}")
    return " ".join(parts + [rule.describe()] if rule.describe() else parts)


PRESET_COLUMNS = ("preset", "layers", "architecture", "feature map", "attentional bias", "window", "chunk",
                  "optimizer", "gates", "path (CUDA bf16 / fp32 / CPU)", "CUDA fp32 predicted (others)",
                  "parameters", "state (bytes)",
                  "+bytes/token", "memory FLOPs/token",
                  "attention FLOPs/token")


# the shape each memory call's path is planned at: sweeps/mqar_gpu.yaml's (batch 64, its longest length, 8 memory
# heads of 16 channels: d_model 128)
STUDY_SHAPES = (64, 256, 8, 16, 16)


def predicted_text(how) -> str:
    """A CUDA plan's chosen path with its predicted time of one call (forward and backward), then the other paths
    that compute it: "triton 2.17 ms (chunked 14.5 ms)"; "—" without a prediction."""
    from .memory.predict import ms

    times = dict(how.predictions)
    if times.get(how.path) is None:
        return "—"
    others = ", ".join(f"{p} {'no formula' if t is None else ms(t)}" for p, t in how.predictions if p != how.path)
    return f"{how.path} {ms(times[how.path])}" + (f" ({others})" if others else "")


def print_presets(console: Console, d_model: int, n_layers: int, n_heads: int, vocab_size: int,
                  swa_window: int, T: int = 4096) -> None:
    """Every preset with its components and sizes (``atlas-lab presets``), readable at any width."""
    import torch

    from .memory.cost import flops_text
    from .memory.plan import Shapes, plan
    from .models import PRESETS, LanguageModel

    study = Shapes(*STUDY_SHAPES)

    rows = []
    for name in PRESETS:
        model = LanguageModel(vocab_size, name, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                              swa_window=swa_window)
        c = model.memory_config
        if c is None:
            components = ["—"] * 9
        else:
            memory, fmap, bias, opt = map(repr, c.components())
            paths = [plan(c, study, dtype, device) for dtype, device in (
                (torch.bfloat16, "cuda"), (torch.float32, "cuda"), (torch.float32, "cpu"))]
            components = [memory, fmap, bias, "global" if c.window is None else str(c.window),
                          str(c.chunk_size), opt, gates_text(c),
                          " / ".join(p.op and f"fla {p.op}" or p.path for p in paths), predicted_text(paths[1])]
        layers = "+".join(dict.fromkeys(model.layer_labels))
        flops = model.flops_per_token(T)
        rows.append([name, layers, *components, f"{model.num_parameters():,}", f"{model.state_bytes():,}",
                     f"{model.cache_bytes_per_token():,}", flops_text(flops["memory"]), flops_text(flops["attention"])])
    print_table(console, f"atlas-lab presets (parameters and state at d_model={d_model}, {n_layers} layers, "
                         f"{n_heads} heads, vocab {vocab_size}, SWA window {swa_window}; float32, batch 1; forward "
                         f"FLOPs per token of the memory and attention cores at T = {T}, all layers: "
                         f"docs/performance.md; the path of the first memory layer at sweeps/mqar_gpu.yaml's shape "
                         f"(B {study.B}, T {study.T}, {study.H} memory heads of {study.d_k}) and its predicted time "
                         f"of one call, forward and backward, on the GPU model: memory/plan.py, memory/predict.py)",
                PRESET_COLUMNS,
                rows, right=PRESET_COLUMNS[-5:])


RUN_COMMANDS = ("fit", "validate", "test")


class UsageError(ValueError):
    """A bad command line: one line naming the argument, what was expected and what was given."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are a UsageError (``main`` prints one line and returns 2) instead of usage text."""

    def error(self, message):
        raise UsageError(f"{message.removeprefix('argument ')}  ({self.prog} --help lists the options)")


def _int_in(low: int, high: int | None = None):
    """An argparse type: an int in [low, high] (no upper bound without high)."""
    expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


POSITIVE, PORT = _int_in(1), _int_in(1, 65535)


def _positive_number(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _names(text: str) -> list[str]:
    """An argparse type: comma-separated names (at least one)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _lengths(text: str) -> list[int]:
    """An argparse type: comma-separated ints >= 1 (at least one)."""
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 1 (sequence lengths), got {text!r}")
    return values


def _fraction(text: str) -> float:
    """An argparse type: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    from .noise import quiet

    quiet()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in RUN_COMMANDS:  # one run through LightningCLI
        from .configfiles import ConfigError, check_config_files, check_values

        try:  # before Lightning is imported: a missing or broken file, a bad model or trainer value is one line at once
            check_values(argv[1:], check_config_files(argv[1:]))
            from .lit.cli import run_cli

            run_cli(argv)
        except ConfigError as e:
            print(f"error: {e}  (atlas-lab {argv[0]} --help lists the options)", file=sys.stderr)
            return 2
        return 0
    parser = _Parser(
        prog="atlas-lab", description="Test-time-memory models: experiments and ablations.",
        epilog="atlas-lab fit|validate|test -c lightning_config.yaml -c experiments/<x>.yaml [--dotted.key=value]: "
               "one run (see atlas-lab fit --help)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("presets", help="every named model with its five components and sizes")
    p.add_argument("--d-model", type=POSITIVE, default=256)
    p.add_argument("--n-layers", type=POSITIVE, default=4)
    p.add_argument("--n-heads", type=POSITIVE, default=16)
    p.add_argument("--vocab-size", type=POSITIVE, default=256)
    p.add_argument("--swa-window", type=POSITIVE, default=64)
    p.add_argument("--seq-len", type=POSITIVE, default=4096, help="T of the FLOPs-per-token columns")
    p = sub.add_parser("sweep", help="run (or resume) the study of a sweep file")
    p.add_argument("file", help="a sweep YAML file, e.g. sweeps/demo.yaml")
    p.add_argument("--workers", type=POSITIVE, default=1, help="local worker processes")
    p.add_argument("--storage", default=None, help="Optuna storage: a journal file path (default "
                                                   "runs/optuna/<study>.journal) or postgresql://user@host/db "
                                                   "(shares a study across machines; pip install "
                                                   "'atlas-lab[postgres]')")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///runs/mlflow.db)")
    p.add_argument("--retry-failed", action="store_true", help="run failed trials again")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                   help="change a key of the sweep file, checked as the file's own keys are (repeatable): "
                        "--set fixed.trainer.max_steps=40 --set repeats=2; a change to what the trials run needs "
                        "--study")
    p.add_argument("--study", default=None, metavar="NAME",
                   help="the study's name instead of the file's (required when --set changes what the trials run, "
                        "so a shortened study never joins the file's)")
    p.add_argument("--estimate", type=POSITIVE, nargs="?", const=20, default=None, metavar="STEPS",
                   help="run nothing of the study: time a short fit of each distinct configuration on this machine "
                        "(STEPS training batches of each sequence length, default 20, and one short validation) and "
                        "print the projected hours per configuration and in all; keeps them in "
                        "runs/sweeps/<study>/estimate.json, for the study's report to check against what it took")
    p = sub.add_parser("report", help="a study's results table and plots, in the terminal and as files")
    p.add_argument("study")
    p.add_argument("--storage", default=None)
    p.add_argument("--power", type=_positive_number, default=None, metavar="DELTA",
                   help="add each seed's value, each comparison's escapes (Fisher's test), its power against a "
                        "difference of DELTA in the metric at its pairs and the seeds that give power 0.8 (a paired t "
                        "test at the level Holm's method holds the comparison to, at its observed spread)")
    p.add_argument("--sweep", default=None, metavar="FILE",
                   help="the study's sweep file, for a study run before its escape threshold, margin, setting, "
                        "claims or marks were declared: the report words its verdicts with them")
    p.add_argument("--cost", action="store_true",
                   help="add the study's cost from its journal: trial-hours, wall time, minutes per trial of each "
                        "point, and the hours of the design that would resolve each open comparison (sized for "
                        "--power DELTA, else the study's margin; written to cost.md)")
    p = sub.add_parser("results-doc", help="write every generated block of a results document (and a sweep file's "
                                           "cost line) again from the committed journals")
    p.add_argument("files", nargs="+", help="markdown or YAML files with generated blocks, e.g. docs/results.md")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each file whose blocks differ from what the journals give")
    p = sub.add_parser("capacity", help="recall of N pairs by memory component combinations, without training "
                                        "(accuracy against state size)")
    p.add_argument("file", help="a capacity YAML file, e.g. sweeps/capacity/memories.yaml")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///runs/mlflow.db)")
    p = sub.add_parser("eval", help="score a checkpoint: lm-evaluation-harness tasks, perplexity by position, S-NIAH "
                                    "(docs/evaluation.md)")
    p.add_argument("--ckpt_path", required=True, help="a checkpoint of atlas-lab fit, e.g. runs/checkpoints/last.ckpt")
    p.add_argument("--tasks", type=_names, default=None, help="harness tasks, comma-separated")
    p.add_argument("--include-path", default=None, metavar="DIR",
                   help="a folder of task YAML files: the only tasks indexed (without it, the harness's own)")
    p.add_argument("--limit", type=POSITIVE, default=None, help="at most N examples per task / N sequences by position "
                                                                "/ N S-NIAH samples per length")
    p.add_argument("--batch-size", type=POSITIVE, default=8)
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the one the checkpoint's fit "
                                                        "logged to, else sqlite:///runs/mlflow.db)")
    p.add_argument("--ppl-by-position", default=None, metavar="FILE",
                   help="a UTF-8 text file, a .npy array of token ids, or a split of atlas-lab data prepare "
                        "(DATA_DIR/val: its documents, each from its start): mean NLL by position bucket")
    p.add_argument("--max-length", type=POSITIVE, default=None,
                   help="with --ppl-by-position: tokens per sequence (e.g. 4 times the training length)")
    p.add_argument("--buckets", type=POSITIVE, default=None, help="with --ppl-by-position: position buckets (8)")
    p.add_argument("--niah", type=_lengths, default=None, metavar="LENGTHS",
                   help="S-NIAH at these lengths (e.g. 1024,2048,4096): the S-NIAH data module's test split scored "
                        "as atlas-lab test scores it")
    p = sub.add_parser("data", help="a tokenised corpus as litdata shards (docs/tasks.md §7)")
    data = p.add_subparsers(dest="data_command", metavar="prepare|tokenizer", required=True)
    p = data.add_parser("prepare", help="tokenise .txt/.jsonl/.parquet files into litdata shards (train/, val/)")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or glob patterns")
    p.add_argument("--out", required=True, help="the corpus folder to create (new or empty)")
    p.add_argument("--tokenizer", default="byte", help="byte, or the path of a tokenizer.json (atlas-lab data "
                                                       "tokenizer)")
    p.add_argument("--text-field", default="text", help="the key (.jsonl) or column (.parquet) holding the text")
    p.add_argument("--holdout-fraction", type=_fraction, default=0.01, help="documents held out for validation")
    p.add_argument("--seed", type=_int_in(0), default=0, help="the held-out documents' hash key")
    p.add_argument("--workers", type=POSITIVE, default=1, help="litdata writer processes")
    p = data.add_parser("tokenizer", help="train a byte-level BPE (specials <pad>, <eos>) on text files")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or glob patterns")
    p.add_argument("--out", required=True, help="the tokenizer.json to write (a new file)")
    p.add_argument("--vocab-size", type=_int_in(259), required=True)
    p.add_argument("--text-field", default="text", help="the key (.jsonl) or column (.parquet) holding the text")
    p = sub.add_parser("ui", help="the MLflow UI on the project's tracking store")
    p.add_argument("--port", type=PORT, default=5000)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--study", default=None, help="print the URL of this study's runs")
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return command(args)
    except (ValueError, FileNotFoundError) as e:  # bad input met past the parser, under any subcommand: one line
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2


def error_line(e: Exception) -> str:
    """A ValueError or FileNotFoundError as the one line the command prints: the file and the reason for a file not
    found, else the message's lines joined."""
    if isinstance(e, FileNotFoundError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or 'no such file or folder'}"
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def command(args) -> int:
    """Run the subcommand ``main`` parsed (all but fit, validate and test)."""
    if args.command == "presets":
        try:
            print_presets(Console(), args.d_model, args.n_layers, args.n_heads, args.vocab_size, args.swa_window,
                          args.seq_len)
        except ValueError as e:  # sizes the models refuse together; the message starts with the argument's name
            name, reason = str(e).split(": ", 1)
            print(f"error: --{name.replace('_', '-')}: {reason}", file=sys.stderr)
            return 2
        return 0
    if args.command == "ui":
        return ui(args.port, args.tracking_uri, args.study)
    if args.command == "eval":  # arguments and files are checked before torch, Lightning or the harness is imported
        from .eval.command import evaluate

        return evaluate(args.ckpt_path, args.tasks, args.include_path, args.limit, args.batch_size, args.tracking_uri,
                        args.ppl_by_position, args.max_length, args.buckets, args.niah)  # EvalError: one line
    if args.command == "data":
        return data_command(args)
    from .store import NotWritable, ServerError, check_writable
    from .sweep.spec import SweepError  # the sweep file's checks: no Optuna, MLflow or Lightning imported yet

    try:
        if args.command == "sweep":
            from .sweep.spec import load_sweep

            spec = load_sweep(args.file, args.sets, args.study)  # the file and its --set, before the driver's imports
            if args.estimate is not None:
                from .sweep.estimate import print_estimate

                rows = print_estimate(spec, args.estimate)
                return 1 if any("error" in r for r in rows) else 0
            from .sweep.driver import run_sweep

            return run_sweep(args.file, args.workers, args.storage, args.tracking_uri, args.retry_failed,
                             sets=args.sets, study=args.study)
        if args.command == "results-doc":
            from .sweep.results_doc import write_docs

            changed = write_docs(args.files, check=args.check)
            for path in changed:
                print(f"{path}: {'differs from' if args.check else 'written again from'} its journals")
            return 1 if args.check and changed else 0
        if args.command == "capacity":
            from .sweep.capacity import capacity_study

            capacity_study(args.file, args.tracking_uri)
            return 0
        from .sweep.spec import default_storage, require_storage

        storage = args.storage or default_storage(args.study)
        require_storage(storage, args.study)  # before Optuna is imported
        from .sweep.report import summarize
        from .sweep.study import load_existing

        study = load_existing(storage, args.study)
        check_writable(f"runs/sweeps/{args.study}")  # where the report's files go
        summarize(study, power=args.power, sweep=args.sweep, cost=args.cost)
        return 0
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NotWritable as e:  # checked before anything is written
        print(f"error: {e.filename}: {e.strerror}; atlas-lab {args.command} writes there (nothing was written)",
              file=sys.stderr)
        return 1
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a store that fails during the sweep (a full disk, a server that went away)
        if isinstance(e, FileNotFoundError):
            raise  # bad input: one line and exit 2 (main)
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


def data_command(args) -> int:
    """``atlas-lab data prepare|tokenizer``: a bad input is one line and exit code 2, with nothing written."""
    from .data import shards

    try:
        if args.data_command == "prepare":
            corpus = shards.prepare(args.inputs, args.out, args.tokenizer, args.text_field, args.holdout_fraction,
                                    args.seed, args.workers)
            counts = ", ".join(f"{name} {s['documents']:,} documents / {s['tokens']:,} tokens"
                               for name, s in corpus["splits"].items())
            print(f"{args.out}: {counts} ({corpus['tokenizer']}, vocab {corpus['vocab_size']:,})")
        else:
            tok = shards.train_tokenizer(args.inputs, args.out, args.vocab_size, args.text_field)
            print(f"{args.out}: byte-level BPE, vocab {tok.vocab_size:,}")
    except ModuleNotFoundError as e:
        if e.name != "litdata":
            raise
        print("error: atlas-lab data prepare writes litdata shards and needs litdata, which comes with the lm extra: "
              "pip install 'atlas-lab[lm]'", file=sys.stderr)
        return 2
    except ValueError as e:  # the message starts with the argument's name in shards.py: as the flag here
        name, _, reason = str(e).partition(": ")
        flag = {"inputs": "INPUT", "out_dir": "--out", "out_path": "--out"}.get(name, f"--{name.replace('_', '-')}")
        print(f"error: {flag}: {reason}" if reason else f"error: {e}", file=sys.stderr)
        return 2
    return 0


def ui(port: int, tracking_uri: str | None, study: str | None = None) -> int:
    """Serve the MLflow UI on loopback for the project's tracking store (foreground; Ctrl-C stops it). Once the
    server answers, every experiment opens in model-training mode and the URL printed is the sweeps' runs view
    (one study's runs with ``--study``). A port in use, or a server that does not start, is one line and exit code
    2, and nothing is written (the server's log is a temporary file)."""
    import os
    import signal
    import socket
    import tempfile
    from pathlib import Path

    from .sweep.locks import store_file
    from .sweep.tracking import resolve_uri, runs_view, start_server, stop_server

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            print(f"error: --port: {port} is in use on 127.0.0.1 (another server answers there); choose another port",
                  file=sys.stderr)
            return 2
    uri = resolve_uri(tracking_uri, create=False)
    store = store_file(uri)
    if store is not None and not store.is_file():
        print(f"error: --tracking-uri: no tracking store at {store} yet; atlas-lab fit or atlas-lab sweep creates it "
              "(or give --tracking-uri)", file=sys.stderr)
        return 2
    fd, log = tempfile.mkstemp(prefix="atlas-lab-ui-", suffix=".log")
    os.close(fd)
    try:
        server, url = start_server(uri, port=port, log_path=log, create=False)
    except RuntimeError as e:
        lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
        os.unlink(log)
        print(f"error: ui: {e}" + (f": {lines[-1].strip()}" if lines else ""), file=sys.stderr)
        return 2
    try:
        view = runs_view(url, study)
    except KeyError:
        stop_server(server)
        os.unlink(log)
        print(f"error: --study: no study named {study!r} in {uri}", file=sys.stderr)
        return 2
    except BaseException:
        stop_server(server)
        raise
    print(f"MLflow UI for {uri}: {view}  (Ctrl-C to stop; server log: {log})", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the server as Ctrl-C does
    try:
        return server.wait()
    except KeyboardInterrupt:
        print("MLflow UI stopped", flush=True)
        return 0
    finally:
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
