"""docs/results.md and the sweep files' cost lines are generated from the committed journals: every block written
again gives the file as committed, and no number stands outside a block."""
from pathlib import Path

import pytest

from atlas_lab.cli import main
from atlas_lab.sweep.results_doc import block, numbers_outside_blocks, regenerate, write_docs
from atlas_lab.sweep.spec import SweepError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "results.md", ROOT / "README.md"] + sorted((ROOT / "sweeps").glob("*.yaml"))


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the blocks name journals and sweep files from the repository's root


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_generated_block_is_what_the_journals_give(path, at_root):
    """Regenerate every block of the file and compare, line by line: a hand edit, a changed journal or a changed
    statistic shows as the first line that differs."""
    text = path.read_text()
    again = regenerate(path)
    for n, (was, now) in enumerate(zip(text.splitlines(), again.splitlines()), 1):
        assert was == now, f"{path.name}:{n}: committed {was!r}, the journals give {now!r}"
    assert text == again


def test_the_results_state_no_number_outside_the_generated_blocks():
    text = (ROOT / "docs" / "results.md").read_text()
    assert text.count("<!-- generated: ") >= 30
    assert numbers_outside_blocks(text) == []


def test_a_number_outside_a_block_is_found():
    text = "\n".join(["Table 6 and Fig. 5 and §5 are words; so is the 1/N plateau and `sweeps/x_c1.yaml`.",
                      "<!-- generated: s points -->", "| 0.97 |", "<!-- end generated -->",
                      "<!-- quoted -->", "the paper: 19.97", "<!-- end quoted -->",
                      "```", "atlas-lab report s --power 0.1", "```",
                      "the linear memory is ahead by 0.66", "about 22 CPU-hours"])
    assert numbers_outside_blocks(text) == ["11: the linear memory is ahead by 0.66", "12: about 22 CPU-hours"]


def test_check_names_a_changed_block_and_writes_nothing(tmp_path, at_root, capsys):
    doc = tmp_path / "r.md"
    fresh = "\n".join(["# r", "<!-- generated: table6-components cost-line -->", "stale", "<!-- end generated -->"])
    doc.write_text(fresh + "\n")
    assert main(["results-doc", str(doc), "--check"]) == 1
    assert capsys.readouterr().out == f"{doc}: differs from its journals\n" and "stale" in doc.read_text()
    assert main(["results-doc", str(doc)]) == 0 and "stale" not in doc.read_text()
    assert doc.read_text().splitlines()[2] == block("table6-components cost-line")[0]
    assert main(["results-doc", str(doc), "--check"]) == 0 and write_docs([doc], check=True) == []


@pytest.mark.parametrize("lines,message", [
    (["<!-- generated: table6-components points -->"], "generated block without its end marker"),
    (["<!-- generated: table6-components bogus -->", "<!-- end generated -->"], "unknown block kind 'bogus'"),
    (["<!-- generated: no-such-study points -->", "<!-- end generated -->"], "journal docs/results/no-such-study"),
    (["<!-- generated: table6-components points power -->", "<!-- end generated -->"], "'power': expected"),
    (["<!-- generated: mqar-atlas-seeds power -->", "<!-- end generated -->"], "needs power=DELTA")])
def test_a_bad_block_is_one_line_and_nothing_is_written(lines, message, tmp_path, at_root, capsys):
    doc = tmp_path / "r.md"
    doc.write_text("\n".join(lines) + "\n")
    with pytest.raises(SweepError) as e:
        regenerate(doc)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert main(["results-doc", str(doc)]) == 2 and doc.read_text() == "\n".join(lines) + "\n"
    assert capsys.readouterr().err.count("\n") == 1
