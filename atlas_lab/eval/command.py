"""``atlas-lab eval``: a checkpoint scored on lm-evaluation-harness tasks, by position and on S-NIAH, printed and
logged to MLflow.

Everything is checked first, the cheapest first: the arguments and that their files exist (``arguments.py``), the
checkpoint's data, tokenizer and model (its plain data, read without torch: ``peek_checkpoint``), the task names (the
harness's index), the position file or split and its length, the S-NIAH data; nothing of Lightning or litdata is
imported before a split or the model is read. The scores are computed next, and only then is anything written: the
results go to the MLflow run that trained the checkpoint where the checkpoint records it (``mlflow_run``) and the
store holds it, else to a new run ``eval-<checkpoint name>`` in the experiment ``atlas-lab``, tagged
``atlas_lab.checkpoint`` with the checkpoint's path.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ..tables import print_table
from .arguments import EvalError, check_arguments

if TYPE_CHECKING:
    from .niah import NIAHScores
    from .position import PositionCurve

EXPERIMENT = "atlas-lab"  # the experiment of lightning_config.yaml's fits
DEFAULT_BUCKETS = 8


def harness_task_folder() -> Path:
    """The folder of lm-evaluation-harness's own task YAML files, found without importing lm_eval."""
    import importlib.util

    return Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks"


def absent_tasks(tasks: list[str], include_path: str | None) -> list[str]:
    """The task names that appear as no word of any task YAML file (under ``include_path``, else the harness's own,
    14,000 files): names the harness cannot know, found in under a second (its index parses every file: seconds).
    A task, group or tag is named literally in the YAML that defines it, so a name absent here is certainly unknown;
    a name present may still be unknown (``task_manager`` decides). Patterns (``*``, ``?``, ``[``) are left to the
    index."""
    import re

    wanted = {t for t in tasks if not re.search(r"[*?\[]", t)}
    folder = Path(include_path) if include_path else harness_task_folder()
    for path in folder.rglob("*.y*ml"):
        if not wanted:
            break
        with contextlib.suppress(OSError, UnicodeDecodeError):
            wanted -= set(re.findall(r"[\w.\-:]+", path.read_text(encoding="utf-8")))
    return [t for t in tasks if t in wanted]


def task_manager(tasks: list[str], include_path: str | None):
    """The harness's task index: the YAML files under ``include_path`` (alone: nothing is indexed or downloaded from
    elsewhere; a folder: ``check_arguments``), or the harness's own tasks without it. EvalError for an unknown task
    name: first for a name no task file holds (``absent_tasks``), before the index is built."""
    absent = [] if include_path else absent_tasks(tasks, None)  # a folder of the user's is indexed in no time
    if absent:
        raise EvalError(f"--tasks: unknown task {', '.join(map(repr, absent))}; no task of lm-evaluation-harness has "
                        "that name; --include-path DIR reads task YAML files from DIR")
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=include_path is None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = (f"the tasks under {include_path}: {', '.join(manager.all_tasks) or 'none'}" if include_path else
                 f"{len(manager.all_tasks)} tasks of lm-evaluation-harness; --include-path DIR reads task YAML files "
                 "from DIR")
        raise EvalError(f"--tasks: unknown task {', '.join(map(repr, unknown))}; {where}")
    return manager


def harness_metrics(results: dict) -> list[tuple[str, str, float, float | None, int | None]]:
    """(task, metric, value, stderr, samples) per metric of lm_eval's results; a metric under a filter other than
    ``none`` is named metric/filter."""
    rows = []
    for task, values in results["results"].items():
        samples = results.get("n-samples", {}).get(task, {}).get("effective")
        for key, value in values.items():
            metric, _, kind = key.partition(",")
            if not kind or "_stderr" in metric or not isinstance(value, (int, float)):
                continue
            stderr = values.get(f"{metric}_stderr,{kind}")
            name = metric if kind == "none" else f"{metric}/{kind}"
            rows.append((task, name, float(value), float(stderr) if isinstance(stderr, (int, float)) else None,
                         samples))
    return rows


def tracking_run(path: Path, tracking_uri: str | None):
    """(client, run id, how it was found) of the run the evaluation of the checkpoint ``path`` logs to (module
    docstring). The store is ``tracking_uri``, else the one the checkpoint records, else the project's default."""
    from mlflow.tracking import MlflowClient

    from ..store import init_store, resolve_uri, run_exists
    from ..sweep.tracking import experiment_id
    from .checkpoint import read_checkpoint

    recorded = read_checkpoint(path).get("mlflow_run") or {}
    uri = resolve_uri(tracking_uri or recorded.get("tracking_uri"))
    init_store(uri)
    client = MlflowClient(uri)
    if recorded and run_exists(client, recorded["run_id"]):
        return client, recorded["run_id"], "the run that trained the checkpoint"
    run = client.create_run(experiment_id(client, EXPERIMENT), run_name=f"eval-{path.stem}",
                            tags={"atlas_lab.checkpoint": str(path.resolve())})
    why = "the checkpoint records no run" if not recorded else f"the store holds no run {recorded['run_id']}"
    return client, run.info.run_id, f"a new run ({why})"


def print_curve(console: Console, curve: PositionCurve, checkpoint, source: str) -> None:
    rows = [[f"{a}–{b - 1}", f"{n:,}", f"{nll:.4f}", f"{ppl:.3f}"]
            for a, b, n, nll, ppl in zip(curve.edges[:-1], curve.edges[1:], curve.tokens, curve.nll, curve.ppl)]
    what = (f"the first {curve.edges[-1]} positions of {curve.sequences} documents of {source}" if Path(source).is_dir()
            else f"{curve.sequences} sequences of {curve.edges[-1]} tokens")
    print_table(console, f"{checkpoint.path.name}: next-token NLL by position ({what}, read in windows of the training "
                         f"length T = {curve.train_length})", ("positions", "tokens", "mean NLL (nats)", "perplexity"),
                rows, right=("tokens", "mean NLL (nats)", "perplexity"))


def print_niah(console: Console, scores: list[NIAHScores], path: Path, variant: int) -> None:
    depths = list(scores[0].depth_acc)
    rows = [[f"{s.length:,}", s.samples, f"{s.loss:.4f}", f"{s.acc:.3f}", f"{s.exact_match:.3f}",
             *(None if d not in s.depth_acc else f"{s.depth_acc[d]:.3f}" for d in depths)] for s in scores]
    columns = ("length", "samples", "answer NLL", "answer acc", "exact match", *(f"acc {d}" for d in depths))
    print_table(console, f"{path.name}: S-NIAH-{variant} (answer NLL and acc: the answer tokens, teacher-forced; "
                         "exact match: the greedy answer is the value)", columns, rows, right=columns[1:])


def _git_hash() -> str | None:
    """lm_eval's ``get_git_commit_hash`` (``git describe --always`` in the working directory, else the hash of its
    .git folder) without git's complaint on stderr outside a repository ("fatal: not a git repository")."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_git():
    """``lm_eval.simple_evaluate`` records the git commit of the working directory with ``_git_hash``: quietly."""
    import lm_eval.evaluator

    saved = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = _git_hash
    try:
        yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = saved


def evaluate(ckpt_path: str, tasks: list[str] | None = None, include_path: str | None = None,
             limit: int | None = None, batch_size: int = 8, tracking_uri: str | None = None,
             position_file: str | None = None, max_length: int | None = None, buckets: int | None = None,
             niah: list[int] | None = None, console: Console | None = None) -> int:
    """``atlas-lab eval``: the harness's scores of ``tasks``, the NLL by position of ``position_file`` (a text file, a
    .npy array or a prepared split) up to ``max_length`` tokens, and/or S-NIAH at the lengths ``niah``, as tables
    and in MLflow. Raises EvalError (one line) before writing anything (module docstring: the order of the checks)."""
    console = console or Console()
    check_arguments(ckpt_path, tasks, include_path, position_file, max_length, buckets, niah)
    buckets = buckets or DEFAULT_BUCKETS
    from .checkpoint import check_language_model, peek_checkpoint

    path = Path(ckpt_path)
    contents = peek_checkpoint(path)  # its plain data, without torch
    if tasks or position_file is not None:
        tokenizer, _ = check_language_model(contents, path)
    if niah:
        from .niah import check_niah

        check_niah(contents, path)
    del contents
    manager = task_manager(tasks, include_path) if tasks else None
    if position_file is not None:  # checked before any score is computed
        from .position import read_sequences

        position_rows = read_sequences(position_file, tokenizer, max_length, buckets, limit)
    if niah:
        from .niah import niah_modules

        modules = niah_modules(ckpt_path, niah, limit, batch_size)
    if tasks or position_file is not None:
        from .harness import AtlasLM

        lm = AtlasLM(ckpt_path, batch_size=batch_size)

    metrics, steps, artifacts = {}, {}, {}
    if tasks:
        import lm_eval

        with quiet_git():
            results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                                              log_samples=False)
        harness_rows = harness_metrics(results)
        print_table(console, f"{path.name}: lm-evaluation-harness", ("task", "metric", "value", "stderr", "samples"),
                    [[t, m, f"{v:.4f}", None if s is None else f"{s:.4f}", n] for t, m, v, s, n in harness_rows],
                    right=("value", "stderr", "samples"))
        metrics.update({f"lm_eval/{t}/{m}": v for t, m, v, _, _ in harness_rows})
        artifacts["lm_eval_results.json"] = json.dumps({k: results[k] for k in ("results", "n-samples", "versions")
                                                        if k in results}, indent=2, default=str)
    if position_file is not None:
        from .position import position_curve

        curve = position_curve(lm.checkpoint.model, position_rows, lm.checkpoint.seq_len, buckets, batch_size)
        print_curve(console, curve, lm.checkpoint, position_file)
        steps = {"position/nll": list(zip(curve.edges[:-1], curve.nll)),
                 "position/ppl": list(zip(curve.edges[:-1], curve.ppl))}
    if niah:
        from .niah import niah_scores

        scores = niah_scores(ckpt_path, modules)
        print_niah(console, scores, path, modules[0].variant)
        steps["niah/loss"] = [(s.length, s.loss) for s in scores]
        steps["niah/acc"] = [(s.length, s.acc) for s in scores]
        steps["niah/exact_match"] = [(s.length, s.exact_match) for s in scores]
        for depth in scores[0].depth_acc:
            steps[f"niah/acc/{depth}"] = [(s.length, s.depth_acc[depth]) for s in scores if depth in s.depth_acc]
        artifacts["niah.json"] = json.dumps({"variant": modules[0].variant, "scores": [asdict(s) for s in scores]},
                                            indent=2)

    client, run_id, how = tracking_run(path, tracking_uri)
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, 0) for k, v in metrics.items()]
    batch += [Metric(k, v, now, step) for k, points in steps.items() for step, v in points]
    for i in range(0, len(batch), 500):
        client.log_batch(run_id, metrics=batch[i:i + 500])
    for name, text in artifacts.items():
        client.log_text(run_id, text, f"eval/{name}")
    if position_file is not None:
        from .position import plot_curve

        with tempfile.TemporaryDirectory() as folder:
            png = Path(folder) / "ppl_by_position.png"
            plot_curve(curve, png, f"{path.name} on {Path(position_file).name}: perplexity by position")
            client.log_artifact(run_id, str(png), "eval")
    if how.startswith("a new run"):
        client.set_terminated(run_id)
    console.print(f"logged to MLflow run {run_id} in {client.tracking_uri}: {how}"
                  + (f"; plot: {client.get_run(run_id).info.artifact_uri}/eval/ppl_by_position.png"
                     if position_file is not None else ""), highlight=False, soft_wrap=True)
    return 0
