"""Every table readable at any width: atlas-lab presets, atlas-lab report and the sweep summary at 80, 120 and 200
columns cut no cell and no title; they wrap at word boundaries or spread the columns over several tables, each
repeating the row's name."""
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from rich.cells import cell_len
from rich.console import Console

from atlas_lab import tables
from atlas_lab.models import PRESETS

sys.path.insert(0, str(Path(__file__).parent / "sweep"))
from test_report import add_tune_trial, synthetic_study  # noqa: E402

WIDTHS = [80, 120, 200]
BASELINE = {"model.preset": "atlas", "model.memory": "atlas"}


def squeeze(text: str) -> str:
    return "".join(text.split())


def parse(text: str) -> list[dict]:
    """The tables of rendered text, in order: each with the lines before it (its title), its headers and, per
    column, the text of each of its lines."""
    parts, pending, current = [], [], None
    for line in text.splitlines():
        if line.startswith("┏"):
            current = {"before": pending, "header": [], "body": []}
            pending = []
        elif current is not None and line.startswith("┃"):
            current["header"].append([c.strip() for c in line.split("┃")[1:-1]])
        elif current is not None and line.startswith("│"):
            current["body"].append([c.strip() for c in line.split("│")[1:-1]])
        elif current is not None and line.startswith("└"):
            parts.append(current)
            current = None
        elif current is None:
            pending.append(line)
    for p in parts:
        p["columns"] = [" ".join(h[j] for h in p["header"] if h[j]) for j in range(len(p["header"][0]))]
        p["title"] = " ".join(p["before"])
    return parts


def rows_of(part: dict) -> list[list[str]]:
    """A table's rows, a row beginning at each line whose first cell is not empty; each cell's lines joined."""
    rows = []
    for line in part["body"]:
        if line[0] or not rows:
            rows.append([[c] for c in line])
        else:
            for cell, piece in zip(rows[-1], line):
                cell.append(piece)
    return [[" ".join(p for p in cell if p) for cell in row] for row in rows]


class Recorder:
    """print_table, recording each call's title, columns, rows and keys."""

    def __init__(self):
        self.calls = []

    def __call__(self, console, title, columns, rows, right=(), keys=1, styles=None, caption=None):
        self.calls.append({"title": title, "columns": list(columns), "keys": keys,
                           "rows": [["—" if c is None else str(c) for c in r] for r in rows]})
        tables.print_table(console, title, columns, rows, right, keys, styles, caption)


def check(text: str, calls: list[dict], width: int) -> list[list[dict]]:
    """Nothing cut or ellipsised, no line over ``width``; per recorded call its tables: every column once (the keys
    in each), every title whole, every row's name whole on its first line and every cell's text whole, in order.
    Returns each call's tables."""
    assert "…" not in text
    assert max(cell_len(line) for line in text.splitlines()) <= width
    parts, out = parse(text), []
    for call in calls:
        first = parts.pop(0)
        split = re.search(re.escape(squeeze(call["title"])) + r"\(1/(\d+)\)$", squeeze(first["title"]))
        n = int(split[1]) if split else 1
        mine = [first] + [parts.pop(0) for _ in range(n - 1)]
        keys, columns = call["keys"], call["columns"]
        seen = []
        for k, part in enumerate(mine):
            suffix = f" ({k + 1}/{n})" if n > 1 else ""
            assert squeeze(part["title"]).endswith(squeeze(call["title"] + suffix)), (part["title"], call["title"])
            assert [squeeze(c) for c in part["columns"][:keys]] == [squeeze(c) for c in columns[:keys]]
            seen += part["columns"][keys:]
            index = [[squeeze(c) for c in columns].index(squeeze(c)) for c in part["columns"]]
            rows = rows_of(part)
            assert [r[0] for r in rows] == [r[0] for r in call["rows"]]  # the row names, each whole on one line
            for shown, row in zip(rows, call["rows"]):
                assert [squeeze(c) for c in shown] == [squeeze(row[i]) for i in index]
        assert [squeeze(c) for c in seen] == [squeeze(c) for c in columns[keys:]]
        out.append(mine)
    return out


def render(width: int, draw) -> str:
    console = Console(record=True, width=width, force_terminal=False, color_system=None)
    draw(console)
    return console.export_text()


# --- the wrapping itself ---

@pytest.mark.parametrize("width", [1, 3, 8, 13, 30])
def test_wrap_keeps_every_character_within_the_width(width):
    text = "memory(chunk_size=16,eta=0.00625)+memory(chunk_size=64,eta=0.0015625) α_t η_t θ_t   γ=1 4,265,548"
    lines = tables.wrap(text, width)
    assert all(cell_len(line) <= width for line in lines)
    assert squeeze("".join(lines)) == squeeze(text)


def test_wrap_breaks_at_spaces_then_after_punctuation_never_inside_a_number():
    assert tables.wrap("short", 80) == ["short"]
    assert tables.wrap("the quick brown fox", 10) == ["the quick", "brown fox"]
    assert tables.wrap("memory(chunk_size=16,eta=0.5)+memory(chunk_size=64,eta=0.25)", 32) == \
        ["memory(chunk_size=16,eta=0.5)+", "memory(chunk_size=64,eta=0.25)"]
    assert tables.wrap("params 4,265,548 (2/6)", 10) == ["params", "4,265,548", "(2/6)"]
    assert tables.wrap("gated_deltaproduct", 10) == ["gated_delt", "aproduct"]  # only where nothing else fits
    assert tables.wrap("one\ntwo three", 5) == ["one", "two", "three"]


@pytest.mark.parametrize("width", [20, 33, 47, 80, 120, 200])
@pytest.mark.parametrize("keys", [0, 1, 2])
def test_any_table_fits_any_width_whole(width, keys):
    columns = ["point name", "axis", "a long header of several words", "x", "value", "note"]
    rows = [["atlas", "memory=linear", "[0.4723, 0.9277]", "—", "1,086,208", "a note of a few words " * 3],
            ["atlas_mag_with_a_longer_name", "preset=atlas_mag, memory=gd", None, "1", "12", "ok"],
            ["x", "y", "memory(chunk_size=16,eta=0.00625)+memory(chunk_size=64,eta=0.0015625)", "2", "3", ""]]
    rec = Recorder()
    text = render(width, lambda c: rec(c, "a title of many words, " * 8 + "end", columns, rows, right=["value"],
                                       keys=keys))
    assert "…" not in text and max(cell_len(line) for line in text.splitlines()) <= width
    parts = parse(text)
    assert squeeze(" ".join(p["title"] for p in parts)).count(squeeze("a title of many words, " * 8 + "end")) \
        == len(parts)
    for j, column in enumerate(columns):  # each column's text whole and in order, in every table that shows it
        shown = [p for p in parts if squeeze(column) in [squeeze(c) for c in p["columns"]]]
        assert len(shown) == (len(parts) if j < keys else 1)
        for p in shown:
            i = [squeeze(c) for c in p["columns"]].index(squeeze(column))
            assert "".join(squeeze(line[i]) for line in p["body"]) == \
                "".join(squeeze("—" if r[j] is None else r[j]) for r in rows)


def test_a_caption_too_wide_for_its_table_is_a_paragraph_of_its_own():
    text = render(40, lambda c: tables.print_table(c, "t", ["a", "b"], [["1", "2"]],
                                                   caption="a caption far wider than this small table is, " * 2))
    assert "…" not in text and max(map(len, text.splitlines())) <= 40
    assert squeeze("a caption far wider than this small table is, " * 2) in squeeze(text.split("└")[1])


# --- atlas-lab presets ---

def presets_text(width: int, monkeypatch) -> tuple[str, list[dict]]:
    import atlas_lab.cli as cli

    rec = Recorder()
    monkeypatch.setattr(cli, "print_table", rec)
    text = render(width, lambda c: cli.print_presets(c, d_model=256, n_layers=4, n_heads=16, vocab_size=256,
                                                     swa_window=64))
    return text, rec.calls


@pytest.mark.parametrize("width", WIDTHS)
def test_presets_cut_nothing(width, monkeypatch):
    """The command's defaults; every preset named whole in every table (hope_cms' layers wrap after a '+')."""
    text, calls = presets_text(width, monkeypatch)
    (parts,) = check(text, calls, width)
    for part in parts:
        assert [r[0] for r in rows_of(part)] == list(PRESETS)
    if width == 80:
        assert len(parts) > 1 and [squeeze(c) for c in parts[0]["columns"]] == ["preset", "layers"]


@pytest.mark.parametrize("columns", [pytest.param(None, marks=pytest.mark.slow), "80",
                                     pytest.param("120", marks=pytest.mark.slow)])  # 4–13 s each
def test_the_presets_command_in_a_pipe_fits_80_columns_or_COLUMNS(columns):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env |= {"COLUMNS": columns} if columns else {}
    command = "import sys; from atlas_lab.cli import main; sys.exit(main(['presets']))"
    out = subprocess.run([sys.executable, "-c", command], env=env | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, check=True).stdout
    width = int(columns or 80)
    assert "…" not in out and max(cell_len(line) for line in out.splitlines()) <= width
    assert max(cell_len(line) for line in out.splitlines()) > width - 5  # the width is used, not a narrower one
    names = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert set(PRESETS) <= set(names) and set(names) <= set(PRESETS) | {""}


# --- atlas-lab report and the sweep summary ---

def study_with_every_table():
    """Points (one failed, one pruned repeat), differences to the baseline, a tuned point and a mark."""
    study = synthetic_study({("atlas", "atlas"): [0.5, 0.6, 0.7], ("atlas", "linear"): [0.6, 0.72, 0.78],
                             ("atlas", "gd"): [0.6, 0.8, 0.7], ("atlas_mag", "atlas"): [0.4, None, 0.9]},
                            baseline=BASELINE, states={("atlas", "gd", 1): optuna.trial.TrialState.PRUNED})
    study.set_user_attr("marks", {"chance": 0.25})
    study.set_user_attr("tune_keys", ["model.lr"])
    for slot, (lr, values) in enumerate(((1e-3, (0.9, 0.7)), (3e-3, (0.95, 0.75)), (1e-2, (0.1, 0.2)))):
        for seed, v in enumerate(values):
            add_tune_trial(study, "atlas", "atlas", {"model.lr": lr}, slot, v, seed)
    return study


def steps_to_study():
    base = [(200, False), (300, False), (250, False), (400, False), (350, False)]
    linear = [(800, True), (800, True), (700, False), (800, True), (800, True)]
    return synthetic_study({("atlas", "atlas"): base, ("atlas", "linear"): linear}, direction="minimize",
                           baseline=BASELINE, metric="val/acc.steps_to_0.9", summary="steps_to")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("make", [study_with_every_table, steps_to_study])
def test_report_cuts_nothing(width, make, tmp_path, monkeypatch):
    from atlas_lab.sweep import costs, report

    rec = Recorder()
    monkeypatch.setattr(report, "print_table", rec)
    monkeypatch.setattr(costs, "print_table", rec)  # the quality-against-cost table
    text = render(width, lambda c: report.summarize(make(), console=c, out_dir=tmp_path, power=0.1))
    tables_of = check(text, rec.calls, width)
    # points, differences, with --power per seed and power, the quality against cost; and the tuning of every table
    assert len(rec.calls) == (6 if make is study_with_every_table else 5)
    assert ["atlas", "linear"] in [r[:2] for r in rows_of(tables_of[0][0])]  # the points, keyed by both axes
    differences = next(i for i, call in enumerate(rec.calls) if "paired by seed" in call["title"])
    assert {r[0] for r in rows_of(tables_of[differences][0])} >= {"memory=linear"}  # named by their change
    if width == 80:
        assert len(tables_of[differences]) > 1  # the differences' ten columns do not fit 80: they spread


def test_the_sweep_summary_at_80_columns_cuts_nothing(tmp_path, monkeypatch):
    """The summary the sweep driver prints at its end: summarize with the parent run, on the driver's console."""
    from mlflow.tracking import MlflowClient

    from atlas_lab.sweep import costs, report
    from atlas_lab.sweep.tracking import parent_run

    monkeypatch.chdir(tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = parent_run(client, "s", "memory")
    rec = Recorder()
    monkeypatch.setattr(report, "print_table", rec)
    monkeypatch.setattr(costs, "print_table", rec)
    text = render(80, lambda c: report.summarize(study_with_every_table(), client, parent, console=c,
                                                 out_dir=tmp_path / "out"))
    check(text, rec.calls, 80)
    assert "browse its runs" in text


def test_the_report_command_in_a_pipe_fits_COLUMNS(tmp_path, monkeypatch, capsys):
    """atlas-lab report on a stored study, its output not a terminal: the tables fit COLUMNS=80."""
    from atlas_lab.cli import main
    from atlas_lab.sweep.study import open_storage

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    study = study_with_every_table()
    journal = str(tmp_path / "s.journal")
    optuna.copy_study(from_study_name=study.study_name, from_storage=study._storage, to_storage=open_storage(journal),
                      to_study_name="s")
    capsys.readouterr()
    assert main(["report", "s", "--storage", journal]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(cell_len(line) for line in out.splitlines()) <= 80
    assert "study s: val/acc (maximize), best first" in " ".join(out.split())
