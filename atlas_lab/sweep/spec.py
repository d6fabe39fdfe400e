"""The sweep file: an ablation grid or a hyperparameter search in YAML, checked before anything runs.

```yaml
study: mqar-ablation            # Optuna study name = MLflow parent run name
base: [experiments/mqar.yaml]   # configs the trials start from (after lightning_config.yaml)
metric: val/acc                 # what is optimised
direction: maximize             # the way the metric improves
summary: final                  # its learning curve as one number: final | best | mean | {steps_to: 0.9}
sampler: grid                   # grid | tpe | random
trials: null                    # grid: every point; tpe/random: a count
repeats: 1                      # seeds per point (repeat r: r added to both seeds, see below)
pruner: {type: median, warmup_epochs: 2}   # or none / hyperband; warmup in validations
grid:                           # dotted config paths -> a list of values, or {label: value}
  model.preset: [titans, omeganet, atlas]
search:                         # tpe/random: {low, high, log, int} or {choices: [...]}
  model.lr: {low: 1.0e-4, high: 1.0e-2, log: true}
fixed: {trainer.max_epochs: 4}
baseline: {model.preset: atlas}  # grid: the point every other point is compared with, seed by seed
tune:                           # grid: per point, the candidate with the best median pilot-seed summary is reported
  grid: {model.lr: [1.0e-3, 3.0e-3], model.memory.eta_max: [0.01, 0.1]}   # every combination is a candidate
  seeds: 3                      # pilot seeds per candidate, at least 3 (repeats 1000, 1001, …: never reported)
marks: {chance: 0.03125, 1/N plateau: 0.25}   # reference values of the metric, drawn in the report's plot
escape: 0.5                     # a seed whose value is beyond this left the plateau (above the task's plateau)
margin: 0.05                    # the smallest difference that matters: within ±margin is "equivalent" (TOST)
setting: MQAR V 64, N 4, L 32; 2 layers of width 64; 600 steps   # what the study runs, named in every verdict
paper_setting: false            # true only where task, scale and metric are the paper's own
claims:                         # per compared point: the paper's claim and the side it puts the point on
  omeganet: {claim: "Table 6 (760M LMs, ppl and acc): without Muon is worse", paper: worse}
```

A trial logs every summary of the metric's validations: ``<metric>.final`` (the last), ``.best`` (the highest, or
the lowest for direction minimize), ``.mean`` (over the validations) and, with ``summary: {steps_to: x}``,
``.steps_to_<x>`` (the global step of the first validation at or above x, or at or below for minimize; censored
where never reached: then the steps trained, and ``.censored_<x>`` is 1). The study optimises the summary named
(fewer steps are better for steps_to).

Repeat r adds r to the resolved ``seed_everything`` and to the data module's ``seed``: repeat r of every point
sees the same data and initial draw, so points are compared in pairs.
"""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..store import store_file

TOP_KEYS = ("study", "base", "metric", "direction", "summary", "sampler", "trials", "repeats", "pruner", "grid",
            "search", "fixed", "baseline", "tune", "marks", "escape", "margin", "setting", "paper_setting", "claims")
SUMMARIES = ("final", "best", "mean", "steps_to")
TUNE_KEYS = ("grid", "seeds")
TUNE_REPEAT = 1000  # pilot seed s of a tune candidate runs as repeat TUNE_REPEAT + s
TUNE_SEEDS = 3  # the fewest pilot seeds a candidate runs on (a choice on one seed follows its noise)
SIDES = ("better", "worse")  # the side of the baseline a claim puts a point on
SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "median", "hyperband")
DIRECTIONS = ("maximize", "minimize")
DEFAULT_BASE = "lightning_config.yaml"


class SweepError(ValueError):
    """A bad sweep file: the message names the file, the key, what was expected and the valid choices. ``key`` and
    ``detail``: the sweep file's key and what is wrong with it, where one key is at fault."""

    def __init__(self, message: str, key: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.key, self.detail = key, detail


@dataclass
class SweepSpec:
    path: Path
    study: str
    base: list[Path]
    metric: str
    direction: str = "maximize"
    sampler: str = "grid"
    trials: int | None = None
    repeats: int = 1
    pruner: dict = field(default_factory=lambda: {"type": "none", "warmup_epochs": 0})
    grid: dict[str, dict[Any, Any]] = field(default_factory=dict)  # key -> {label (an Optuna choice): value}
    search: dict[str, dict] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None  # grid key -> label: the point the report compares every point with
    summary: str = "final"  # one of SUMMARIES
    threshold: float | None = None  # summary steps_to: the value to reach
    tune: dict[str, list] = field(default_factory=dict)  # key -> candidate values, every combination a candidate
    tune_seeds: int = TUNE_SEEDS
    marks: dict[str, float] = field(default_factory=dict)  # label -> a reference value of the metric (chance, ...)
    escape: float | None = None  # a value beyond it left the plateau (the report's escape counts)
    margin: float | None = None  # the smallest difference that matters, in the metric's units (equivalence)
    setting: str | None = None  # what the study runs, named in every verdict
    paper_setting: bool = False  # whether task, scale and metric are the paper's (only then "agrees with the paper")
    claims: dict[str, dict] = field(default_factory=dict)  # point label -> {claim: text, paper: better | worse}
    sets: list[tuple[str, str, Any]] = field(default_factory=list)  # the --set overrides: (KEY=VALUE, KEY, value)
    named: str | None = None  # --study: the name given on the command line, instead of the file's

    def set_for(self, key: str) -> str | None:
        """The ``--set KEY=VALUE`` that gave the sweep key ``key`` (``fixed.trainer.max_steps``, ``grid.model.lr``),
        itself or a mapping holding it (``--set fixed={...}``); None where the file gave it. A --set of a key below
        it is a key of its own (``--set fixed.model.memory.learning_rule.init_args.p=0.5`` beside the file's
        ``model.memory.learning_rule``: the file gave the class, the --set its option)."""
        return next((text for text, set_key, _ in self.sets if key == set_key or key.startswith(set_key + ".")),
                    None)

    def argv(self) -> list[str]:
        """The sweep file and its command-line changes, as a worker or a trial's job is given them."""
        out = [str(self.path)]
        for text, _, _ in self.sets:
            out += ["--set", text]
        return out + (["--study", self.named] if self.named is not None else [])

    @property
    def objective(self) -> str:
        """The name of the value a trial reports: the metric for ``final``, else ``<metric>.<summary>``."""
        if self.summary == "final":
            return self.metric
        return f"{self.metric}.{curve_key(self.summary, self.threshold)}"

    @property
    def objective_direction(self) -> str:
        """The way the objective improves: the metric's, but fewer steps for steps_to."""
        return "minimize" if self.summary == "steps_to" else self.direction

    def tune_candidates(self) -> list[dict[str, Any]]:
        """Every combination of the tune values, in file order: [{key: value}] ([] without a tune block)."""
        keys = list(self.tune)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.tune[k] for k in keys))] if keys else []

    def grid_points(self) -> list[dict[str, str]]:
        """Every combination of grid labels, in file order: [{key: label}]."""
        keys = list(self.grid)
        return [dict(zip(keys, labels)) for labels in itertools.product(*(list(self.grid[k]) for k in keys))]

    def overrides(self, labels: dict[str, str], sampled: dict[str, Any]) -> dict[str, Any]:
        """The dotted config overrides of one trial: fixed, then grid values, then sampled values."""
        out = dict(self.fixed)
        out.update({k: self.grid[k][label] for k, label in labels.items()})
        out.update(sampled)
        return out

    def run_name(self, labels: dict[str, str], sampled: dict[str, Any], seed: int, trial_number: int,
                 tune: dict[str, Any] | None = None, pilot: bool = False) -> str:
        """A trial's MLflow run name: its grid labels (``preset=atlas architecture=gated_mlp seed=1``), or for a
        search its number and sampled values (``trial-3 lr=0.0012 seed=0``); a tuned setting follows the labels,
        and a tune trial's name starts with ``tune``."""
        keys = list(labels) or list(sampled)
        values = [labels[k] for k in labels] or [_shown(v) for v in sampled.values()]
        parts = ["tune"] if pilot else [] if labels else [f"trial-{trial_number}"]
        parts += [f"{name}={value}" for name, value in zip(short_names(keys), values)]
        tune = tune or {}
        parts += [f"{name}={_shown(value)}" for name, value in zip(short_names(list(tune)), tune.values())]
        return " ".join(parts + [f"seed={seed}"])


def _shown(value):
    """A sampled or tuned value in a run name: floats to 3 significant digits."""
    return f"{value:.3g}" if isinstance(value, float) else value


def curve_key(summary: str, threshold: float | None = None) -> str:
    """A summary's metric suffix: final, best, mean or steps_to_<x> (``<metric>.<suffix>``)."""
    return f"steps_to_{threshold:g}" if summary == "steps_to" else summary


def short_names(keys: list[str]) -> list[str]:
    """The shortest dotted suffix of each key that is still unique (model.memory.optimizer -> optimizer)."""
    out = []
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if sum(k == suffix or k.endswith("." + suffix) for k in keys) == 1:
                break
        out.append(suffix)
    return out


def label_of(value: Any):
    """The Optuna choice for a grid value given as a list item: the value itself when it is a scalar, else its JSON."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)


def cli_args(base: list[Path], overrides: dict[str, Any]) -> list[str]:
    """LightningCLI arguments: the config files, then each override as --dotted.key=value (JSON but for strings)."""
    args = []
    for path in base:
        args += ["--config", str(path)]
    return args + [f"--{key}={value if isinstance(value, str) else json.dumps(value)}"
                   for key, value in overrides.items()]


def _fail(path, key, message):
    raise SweepError(f"{path}: {key}: {message}", key=key, detail=message)


def _related(a: str, b: str | None) -> bool:
    """Whether two dotted sweep keys name the same setting or one holds the other (pruner, pruner.type)."""
    return b is not None and (a == b or a.startswith(b + ".") or b.startswith(a + "."))


def _check_keys(path, where, mapping, valid):
    unknown = [k for k in mapping if k not in valid]
    if unknown:
        _fail(path, where, f"unknown key(s) {unknown}; valid keys: {', '.join(valid)}")


def _is_dotted(key) -> bool:
    return isinstance(key, str) and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key) is not None


def read_mapping(path: Path, kind: str, keys: tuple[str, ...]) -> dict:
    """A YAML file of ``kind`` (a sweep file, a capacity file) holding a mapping of some of ``keys``; anything else
    is a SweepError naming the file."""
    if not path.is_file():
        raise SweepError(f"{path}: no such {kind} file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: expected a mapping with keys {', '.join(keys)}")
    _check_keys(path, "(top level)", raw, keys)
    return raw


DOTTED_MAPS = ("fixed", "grid", "search", "baseline", "marks", "claims")  # mappings keyed by dotted paths or labels
# what the report compares, draws
REPORT_ONLY = ("baseline", "marks", "escape", "margin", "setting", "paper_setting", "claims")
# and words: no part of what the trials run
STUDY_NAME = r"[\w.\-]+"


def parse_set(text: str) -> tuple[str, str, Any]:
    """``--set KEY=VALUE`` as (the text, KEY, VALUE read as YAML: 40, 1.0e-3, [1, 2], {type: none}, none)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SweepError(f"--set {text}: expected KEY=VALUE, a key of the sweep file (dotted) and its value, e.g. "
                         "--set fixed.trainer.max_steps=40 or --set repeats=2")
    try:
        return text, key, yaml.safe_load(value)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SweepError(f"--set {text}: expected a YAML value after '=', got {value!r} ({problem})") from None


def apply_set(raw: dict, text: str, key: str, value: Any) -> None:
    """Put one --set into the sweep file's mapping: a top-level key (``repeats``), a key of a mapping of dotted
    paths (``fixed.trainer.max_steps``, ``grid.model.lr``, ``search.model.lr``, ``baseline.model.preset``), of
    the pruner (``pruner.type``), of the tune block (``tune.seeds``, ``tune.grid.model.lr``) or ``summary.steps_to``.
    What the value must be is checked afterwards, as the file's own values are."""
    head, _, rest = key.partition(".")
    if head == "study":
        raise SweepError(f"--set {text}: a study is named with --study NAME, not --set")
    if head not in TOP_KEYS:
        valid = ", ".join(k for k in TOP_KEYS if k != "study")
        raise SweepError(f"--set {text}: unknown key {head!r}; valid keys: {valid} (and their dotted keys, e.g. "
                         "fixed.trainer.max_steps)")
    if not rest:
        raw[head] = value
        return

    def mapping(x) -> dict:
        return dict(x) if isinstance(x, dict) else {}

    if head in DOTTED_MAPS:
        raw[head] = mapping(raw.get(head)) | {rest: value}
    elif head == "pruner":
        pruner = raw.get("pruner")
        raw["pruner"] = ({"type": pruner} if isinstance(pruner, str) else mapping(pruner)) | {rest: value}
    elif head == "tune":
        tune, (sub, _, tail) = mapping(raw.get("tune")), rest.partition(".")
        if sub == "grid" and tail:
            tune["grid"] = mapping(tune.get("grid")) | {tail: value}
        else:
            tune[rest] = value
        raw["tune"] = tune
    elif head == "summary":
        raw["summary"] = {rest: value}
    else:
        raise SweepError(f"--set {text}: {head} is one value, not a mapping; expected --set {head}=VALUE")


def design(spec: SweepSpec) -> str:
    """What the trials of a study run and measure: everything but its name and what only the report uses."""
    fields = (spec.metric, spec.direction, spec.sampler, spec.summary, spec.threshold, spec.grid, spec.search,
              spec.fixed, [str(b) for b in spec.base], spec.tune, spec.tune_seeds, spec.repeats, spec.trials,
              spec.pruner)
    return json.dumps(fields, sort_keys=True, default=str)


def load_sweep(path: str | Path, sets: list[str] | tuple[str, ...] = (), study: str | None = None) -> SweepSpec:
    """Read and check a sweep file (structure only; ``validate_configs`` checks values against the config), with
    the command line's changes: ``sets``, each ``KEY=VALUE`` (``--set fixed.trainer.max_steps=40``), checked as the
    file's own keys are (a bad one is a SweepError naming the --set), and ``study``, a name instead of the file's.
    A change to what the trials run (anything but ``baseline`` and ``marks``) needs a study name of its own, so a
    shortened study never joins the file's study."""
    path = Path(path)
    raw = read_mapping(path, "sweep", TOP_KEYS)
    if not sets and study is None:
        return _build(path, raw)
    parsed = [parse_set(text) for text in sets]
    changed = dict(raw)
    for text, key, value in parsed:
        apply_set(changed, text, key, value)
    if study is not None:
        if not re.fullmatch(STUDY_NAME, study):
            raise SweepError(f"--study {study!r}: use letters, digits, '_', '-' and '.' only")
        changed["study"] = study
    try:
        spec = _build(path, changed)
    except SweepError as e:
        blamed = [text for text, key, _ in parsed if _related(key, e.key)]
        if not blamed:
            try:
                _build(path, raw)
            except SweepError:
                raise e from None  # the file itself is at fault
            blamed = [text for text, _, _ in parsed]  # the file is fine: its --set values do not go together
        if e.key == "study" and study is not None:
            raise SweepError(f"--study {study}: {e.detail}", key=e.key, detail=e.detail) from None
        raise SweepError(f"--set {' --set '.join(blamed)}: {e.key}: {e.detail}", key=e.key, detail=e.detail) \
            from None
    spec.sets, spec.named = parsed, study
    try:
        as_written = _build(path, raw)
    except SweepError:
        as_written = None
    if as_written is None or design(as_written) != design(spec):
        changes = " ".join(f"--set {text}" for text, key, _ in parsed if key.partition(".")[0] not in REPORT_ONLY)
        file_study = raw.get("study")
        if study is None:
            raise SweepError(f"{changes}: changes what the trials of study {file_study!r} run; name this study with "
                             f"--study NAME (e.g. --study {file_study}-short), so it never joins {file_study!r}")
        if study == file_study:
            raise SweepError(f"--study {study}: {changes} changes what the trials run; name the changed study other "
                             f"than the file's own study {file_study!r}, so it never joins it")
    return spec


def _build(path: Path, raw: dict) -> SweepSpec:
    for key in ("study", "metric"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            _fail(path, key, "required, a non-empty string")
    if not re.fullmatch(STUDY_NAME, raw["study"]):
        _fail(path, "study", f"{raw['study']!r}: use letters, digits, '_', '-' and '.' only")

    def choice(key, valid, default):
        value = raw.get(key, default)
        if value not in valid:
            _fail(path, key, f"unknown value {value!r}; valid choices: {', '.join(valid)}")
        return value

    direction = choice("direction", DIRECTIONS, "maximize")
    summary, threshold = raw.get("summary", "final"), None
    if isinstance(summary, dict):
        if list(summary) != ["steps_to"] or isinstance(summary["steps_to"], bool) \
                or not isinstance(summary["steps_to"], (int, float)):
            _fail(path, "summary", f"expected one of final, best, mean or {{steps_to: a number}}, got {summary!r}")
        summary, threshold = "steps_to", float(summary["steps_to"])
    elif summary not in SUMMARIES[:3]:
        _fail(path, "summary", f"unknown value {summary!r}; valid choices: final, best, mean, {{steps_to: x}}")
    sampler = choice("sampler", SAMPLERS, "grid")

    base_raw = raw.get("base", [])
    if isinstance(base_raw, str):
        base_raw = [base_raw]
    if not isinstance(base_raw, list) or not all(isinstance(b, str) for b in base_raw):
        _fail(path, "base", "expected a list of config file paths")
    base = []
    for b in [DEFAULT_BASE] * (DEFAULT_BASE not in base_raw) + base_raw:
        candidates = [Path(b), path.parent / b]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            _fail(path, "base", f"config file {b!r} not found (looked in . and {path.parent})")
        base.append(found)

    repeats = raw.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        _fail(path, "repeats", f"expected an int >= 1, got {repeats!r}")
    trials = raw.get("trials")
    if trials is not None and (not isinstance(trials, int) or isinstance(trials, bool) or trials < 1):
        _fail(path, "trials", f"expected null or an int >= 1, got {trials!r}")

    pruner = raw.get("pruner") or {"type": "none"}
    if isinstance(pruner, str):
        pruner = {"type": pruner}
    if not isinstance(pruner, dict):
        _fail(path, "pruner", "expected {type: none|median|hyperband, warmup_epochs: N}")
    _check_keys(path, "pruner", pruner, ("type", "warmup_epochs"))
    if pruner.get("type", "none") not in PRUNERS:
        _fail(path, "pruner.type", f"unknown value {pruner.get('type')!r}; valid choices: {', '.join(PRUNERS)}")
    warmup = pruner.get("warmup_epochs", 0)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        _fail(path, "pruner.warmup_epochs", f"expected an int >= 0, got {warmup!r}")
    if summary == "steps_to" and pruner.get("type", "none") != "none":
        _fail(path, "pruner", "a steps_to study is not pruned (the pruner judges the metric, the study its steps); "
                              "use pruner: none")
    pruner = {"type": pruner.get("type", "none"), "warmup_epochs": warmup}

    grid_raw = raw.get("grid") or {}
    if not isinstance(grid_raw, dict):
        _fail(path, "grid", "expected a mapping of dotted config paths to lists of values")
    grid = {}
    for key, values in grid_raw.items():
        if not _is_dotted(key):
            _fail(path, f"grid.{key}", "expected a dotted config path such as model.preset")
        if isinstance(values, list):
            if not values:
                _fail(path, f"grid.{key}", "empty list of values")
            labeled = {label_of(v): v for v in values}
            if len(labeled) != len(values):
                _fail(path, f"grid.{key}", f"repeated values in {values}")
        elif isinstance(values, dict) and values:
            labeled = {str(label): v for label, v in values.items()}
        else:
            _fail(path, f"grid.{key}", f"expected a non-empty list of values or {{label: value}}, got {values!r}")
        grid[key] = labeled

    search_raw = raw.get("search") or {}
    if not isinstance(search_raw, dict):
        _fail(path, "search", "expected a mapping of dotted config paths to ranges")
    search = {}
    for key, spec in search_raw.items():
        where = f"search.{key}"
        if not _is_dotted(key):
            _fail(path, where, "expected a dotted config path such as model.lr")
        if key in grid:
            _fail(path, where, "also a grid axis; a key is either searched or a grid axis")
        if not isinstance(spec, dict):
            _fail(path, where, "expected {low: x, high: y, log: bool, int: bool} or {choices: [...]}")
        if "choices" in spec:
            _check_keys(path, where, spec, ("choices",))
            if not isinstance(spec["choices"], list) or not spec["choices"]:
                _fail(path, f"{where}.choices", "expected a non-empty list")
        else:
            _check_keys(path, where, spec, ("low", "high", "log", "int"))
            low, high = spec.get("low"), spec.get("high")
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (low, high)):
                _fail(path, where, f"low and high must be numbers, got low={low!r}, high={high!r}")
            if low > high:
                _fail(path, where, f"low ({low}) > high ({high})")
            if spec.get("log", False) and low <= 0:
                _fail(path, where, f"a log range needs low > 0, got low={low}")
            if spec.get("int", False) and not all(isinstance(x, int) for x in (low, high)):
                _fail(path, where, f"int: true needs integer bounds, got low={low!r}, high={high!r}")
        search[key] = dict(spec)

    fixed = raw.get("fixed") or {}
    if not isinstance(fixed, dict):
        _fail(path, "fixed", "expected a mapping of dotted config paths to values")
    for key in fixed:
        if not _is_dotted(key):
            _fail(path, f"fixed.{key}", "expected a dotted config path such as trainer.max_epochs")

    if sampler == "grid":
        if not grid:
            _fail(path, "grid", "sampler grid needs at least one grid axis")
        if search:
            _fail(path, "search", "sampler grid runs the grid only; use sampler tpe or random to search")
        if trials is not None:
            _fail(path, "trials", "sampler grid runs every point; leave trials null")
    else:
        if not search:
            _fail(path, "search", f"sampler {sampler} needs at least one search range")
        if grid:
            _fail(path, "grid", f"sampler {sampler} samples the search space; use sampler grid for a grid")
        if trials is None:
            _fail(path, "trials", f"sampler {sampler} needs a trial count")
    baseline = raw.get("baseline")
    if baseline is not None:
        if sampler != "grid":
            _fail(path, "baseline", f"a baseline is a grid point; sampler {sampler} has none")
        if not isinstance(baseline, dict) or set(baseline) != set(grid):
            _fail(path, "baseline", f"expected one label for each grid axis ({', '.join(grid)}), got {baseline!r}")
        for key, label in baseline.items():
            if label not in grid[key]:
                _fail(path, f"baseline.{key}", f"unknown label {label!r}; valid choices: "
                                               f"{', '.join(str(v) for v in grid[key])}")
        baseline = {key: baseline[key] for key in grid}
    tune, tune_seeds = _tune(path, raw.get("tune"), sampler, grid, fixed)
    if tune and repeats > TUNE_REPEAT:
        _fail(path, "repeats", f"a tuned study reports at most {TUNE_REPEAT} repeats (its pilot seeds come after)")
    marks = raw.get("marks") or {}
    if not isinstance(marks, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in marks.values()):
        _fail(path, "marks", f"expected a mapping of labels to numbers (e.g. {{chance: 0.03}}), got {marks!r}")
    spec = SweepSpec(path=path, study=raw["study"], base=base, metric=raw["metric"], direction=direction,
                     sampler=sampler, trials=trials, repeats=repeats, pruner=pruner, grid=grid, search=search,
                     fixed=fixed, baseline=baseline, summary=summary, threshold=threshold, tune=tune,
                     tune_seeds=tune_seeds, marks={str(k): float(v) for k, v in marks.items()})
    _wording(path, raw, spec)
    return spec


def _wording(path: Path, raw: dict, spec: SweepSpec) -> None:
    """The report-only keys that word a study's answers: ``escape`` (checked to lie beyond the task's plateau),
    ``margin`` (a positive number: the smallest difference that matters; it needs a baseline), ``setting``,
    ``paper_setting`` and ``claims`` (one per compared point, by its label)."""
    margin = raw.get("margin")
    if margin is not None:
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
            _fail(path, "margin", f"expected a positive number (a difference of {spec.metric}), got {margin!r}")
        if spec.baseline is None:
            _fail(path, "margin", "a margin is read from a comparison with the baseline; the file has no baseline")
        spec.margin = float(margin)
    escape = raw.get("escape")
    if escape is not None:
        if isinstance(escape, bool) or not isinstance(escape, (int, float)):
            _fail(path, "escape", f"expected a number (a value of {spec.metric}), got {escape!r}")
        if spec.summary == "steps_to":
            _fail(path, "escape", f"a steps_to study counts the seeds that reached {spec.threshold:g}; drop escape")
        plateau = task_plateau(spec)
        if plateau is not None and not (escape > plateau[0] if spec.direction == "maximize" else escape < plateau[0]):
            _fail(path, "escape", f"{escape:g} is not {'above' if spec.direction == 'maximize' else 'below'} the "
                                  f"task's plateau {plateau[0]:.4g} ({plateau[1]}); a seed on the plateau would count "
                                  f"as escaped: expected a value beyond it")
        spec.escape = float(escape)
    setting = raw.get("setting")
    if setting is not None and (not isinstance(setting, str) or not setting.strip()):
        _fail(path, "setting", f"expected a line naming the task, scale and metric the study runs, got {setting!r}")
    spec.setting = setting
    paper = raw.get("paper_setting", False)
    if not isinstance(paper, bool):
        _fail(path, "paper_setting", f"expected true or false, got {paper!r}")
    if paper and not setting:
        _fail(path, "paper_setting", "true needs a setting: the paper's task, scale and metric, named")
    spec.paper_setting = paper
    claims = raw.get("claims") or {}
    if not isinstance(claims, dict):
        _fail(path, "claims", f"expected a mapping of point labels to {{claim: text, paper: better|worse}}, "
                              f"got {claims!r}")
    labels = {str(label) for labels in spec.grid.values() for label in labels}
    for label, claim in claims.items():
        where = f"claims.{label}"
        if str(label) not in labels:
            _fail(path, where, f"unknown point label; valid choices: {', '.join(sorted(labels))}")
        if not isinstance(claim, dict) or set(claim) != {"claim", "paper"} or not isinstance(claim["claim"], str):
            _fail(path, where, f"expected {{claim: the paper's claim, paper: better|worse}}, got {claim!r}")
        if claim["paper"] not in SIDES:
            _fail(path, f"{where}.paper", f"unknown value {claim['paper']!r}; valid choices: {', '.join(SIDES)}")
    if claims and spec.baseline is None:
        _fail(path, "claims", "a claim is read from a comparison with the baseline; the file has no baseline")
    spec.claims = {str(k): dict(v) for k, v in claims.items()}


def _merge(into: dict, other: dict) -> dict:
    """``other`` merged into a copy of ``into``, mapping by mapping."""
    out = dict(into)
    for key, value in other.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _dotted(config: dict, key: str, value) -> dict:
    """``config`` with the dotted key set (``data.init_args.test_slices``)."""
    head, _, rest = key.partition(".")
    inner = config.get(head) if isinstance(config.get(head), dict) else {}
    return config | {head: _dotted(inner, rest, value) if rest else value}


def task_plateau(spec: SweepSpec) -> tuple[float, str] | None:
    """The highest plateau of the study's metric over its grid points, and what it is, where the task has a known
    one; None elsewhere. MQAR's accuracy: a model that answers each query with one of its sequence's N values
    without binding them scores 1/N a query, so over the validation (or test) slices' queries Σ count / Σ count·N.
    Read from the base configs, the fixed values and each grid point, as the trials merge them."""
    if spec.direction != "maximize" or not re.search(r"(^|/)acc$", spec.metric):
        return None
    config: dict = {}
    for base in spec.base:
        loaded = yaml.safe_load(Path(base).read_text()) or {}
        config = _merge(config, loaded if isinstance(loaded, dict) else {})
    found = []
    for labels in spec.grid_points() or [{}]:
        point = config
        for key, value in spec.overrides(labels, {}).items():
            point = _dotted(point, key, value)
        data = point.get("data")
        data = {"class_path": data} if isinstance(data, str) else data if isinstance(data, dict) else {}
        if not str(data.get("class_path", "")).endswith("MQARDataModule"):
            return None
        args = data.get("init_args") or {}
        split = "test" if spec.metric.startswith("test/") else "val"
        slices = (args.get("val_slices") if split == "val" else None) or args.get("test_slices")
        if slices is None:
            import inspect

            from ..data.mqar import MQARDataModule

            slices = inspect.signature(MQARDataModule).parameters["test_slices"].default
        queries = sum(count * n for _, n, count in slices)
        pairs = sorted({n for _, n, _ in slices})
        found.append((sum(count for _, _, count in slices) / queries,
                      f"MQAR {split} accuracy at 1/N, N = {', '.join(str(n) for n in pairs)} pairs: a model that "
                      f"answers with one of the sequence's values without binding them"))
    return max(found)


def _tune(path, raw, sampler, grid, fixed) -> tuple[dict[str, list], int]:
    """The tune block: ({key: candidate values}, pilot seeds per candidate); ({}, TUNE_SEEDS) without one."""
    if raw is None:
        return {}, TUNE_SEEDS
    if sampler != "grid":
        _fail(path, "tune", f"tuning picks a setting per grid point; sampler {sampler} has none")
    if not isinstance(raw, dict):
        _fail(path, "tune", "expected {grid: {dotted.key: [values]}, seeds: N}")
    _check_keys(path, "tune", raw, TUNE_KEYS)
    values = raw.get("grid")
    if not isinstance(values, dict) or not values:
        _fail(path, "tune.grid", "expected a non-empty mapping of dotted config paths to lists of candidate values")
    for key, candidates in values.items():
        if not _is_dotted(key):
            _fail(path, f"tune.grid.{key}", "expected a dotted config path such as model.lr")
        if key in grid or key in fixed:
            _fail(path, f"tune.grid.{key}", f"also a {'grid axis' if key in grid else 'fixed key'}; a key is tuned, "
                                            f"a grid axis or fixed")
        if not isinstance(candidates, list) or not candidates:
            _fail(path, f"tune.grid.{key}", f"expected a non-empty list of candidate values, got {candidates!r}")
    seeds = raw.get("seeds", TUNE_SEEDS)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not TUNE_SEEDS <= seeds <= TUNE_REPEAT:
        _fail(path, "tune.seeds", f"expected an int from {TUNE_SEEDS} to {TUNE_REPEAT} (the choice is the best median "
                                  f"over them; one seed's choice follows its noise), got {seeds!r}")
    return dict(values), seeds


def default_storage(study: str) -> str:
    """Where a study's journal lives unless --storage says otherwise: runs/optuna/<study>.journal."""
    return str(Path("runs") / "optuna" / f"{study}.journal")


def require_storage(url: str, name: str) -> None:
    """SweepError unless the storage ``url`` of study ``name`` exists (a journal file or SQLite database: checked
    here, before Optuna is imported; a database URL: when it is opened). Creates nothing."""
    path = store_file(url)
    if path is not None and not path.is_file():
        raise SweepError(f"report: no study named {name!r}: the storage {url} does not exist (--storage: the journal "
                         f"file or database URL the sweep used)")
