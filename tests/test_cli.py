"""The atlas-lab command."""
from rich.console import Console

from atlas_lab.cli import presets_table
from atlas_lab.models import PRESETS


def test_presets_table_lists_every_preset_with_its_columns():
    console = Console(record=True, width=400)
    console.print(presets_table(d_model=32, n_layers=2, n_heads=4, vocab_size=64, swa_window=8))
    text = console.export_text()
    for column in ("memory", "feature map", "objective", "window", "chunk", "optimizer", "gates", "parameters",
                   "state (bytes)", "+bytes/token"):
        assert column in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert set(rows) == set(PRESETS)
    assert "muon(k=5,quintic)" in rows["atlas"] and "polynomial(p=2)" in rows["atlas"]
    assert "momentum" in rows["titans"] and "α_t η_t θ_t" in rows["titans"]
    assert "mlp(L=2,E=4,LN)" in rows["deep_transformer"] and "mlp(L=2,E=4)" in rows["atlas"]
    chunk = [c.strip() for c in rows["deltanet"].split("│")][7], [c.strip() for c in rows["atlas"].split("│")][7]
    assert chunk == ("1", "16")
