"""benchmarks/cpu_step.py: its variants, a tiny run's table of ratios, and a bad variant refused in one line."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import cpu_step  # noqa: E402  (benchmarks/ is not a package)


def test_a_variant_is_a_preset_with_memory_options():
    assert cpu_step.parse_variant("atlas") == ("atlas", {})
    assert cpu_step.parse_variant("atlas:read=chunk,chunk_size=8") == ("atlas", {"read": "chunk", "chunk_size": 8})
    with pytest.raises(ValueError, match="unknown preset 'atlass'"):
        cpu_step.parse_variant("atlass")
    with pytest.raises(ValueError, match="key=value"):
        cpu_step.parse_variant("atlas:read")


def test_a_tiny_run_steps_every_variant_beside_the_transformer(tmp_path):
    out = tmp_path / "cpu_step.json"
    cpu_step.main(["--tiny", "--variants", "atlas:read=chunk", "atlas", "--out", str(out)])
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["transformer", "atlas:read=chunk", "atlas"]  # the transformer is added, first
    assert rows["transformer"]["ratio_to_transformer"] == 1.0
    for row in rows.values():
        assert row["ms_median"] > 0 and len(row["ms_all"]) == 1
        assert row["ratio_to_transformer"] == pytest.approx(row["ms_median"] / rows["transformer"]["ms_median"])
    assert rows["atlas"]["target"] == cpu_step.ATLAS_TARGET and rows["atlas:read=chunk"]["target"] is None


def test_a_bad_variant_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "cpu_step.json"
    with pytest.raises(SystemExit) as exit_:
        cpu_step.main(["--tiny", "--variants", "atlas:read", "--out", str(out)])
    assert exit_.value.code == 2
    assert "--variants atlas:read: expected preset:key=value" in capsys.readouterr().err.splitlines()[-1]
    assert not out.exists()
