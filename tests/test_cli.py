"""The atlas-lab command."""
import pytest
from rich.console import Console

from atlas_lab.cli import PRESET_COLUMNS, print_presets
from atlas_lab.models import PRESETS


def test_presets_table_lists_every_preset_with_its_columns():
    from atlas_lab.memory.cost import flops_text
    from atlas_lab.models import LanguageModel

    console = Console(record=True, width=400)
    print_presets(console, d_model=32, n_layers=2, n_heads=4, vocab_size=64, swa_window=8)
    text = console.export_text()
    for column in ("architecture", "feature map", "attentional bias", "window", "chunk", "optimizer", "gates",
                   "parameters",
                   "state (bytes)", "+bytes/token", "memory FLOPs/token", "attention FLOPs/token"):
        assert column in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    rows.pop("", None)  # a row's wrapped cells
    assert set(rows) == set(PRESETS)
    assert "muon(k=5,quintic)" in rows["atlas"] and "polynomial(p=2)" in rows["atlas"]
    assert "momentum" in rows["titans"] and "α_t η_t θ_t" in rows["titans"]
    assert "mlp(L=2,E=4,LN)" in rows["deep_transformer"] and "mlp(L=2,E=4)" in rows["atlas"]
    chunk = [c.strip() for c in rows["deltanet"].split("│")][7], [c.strip() for c in rows["atlas"].split("│")][7]
    assert chunk == ("1", "16")
    flops = {name: [c.strip() for c in row.split("│")][-3:-1] for name, row in rows.items()}
    assert flops["transformer"][0] == "0" and flops["atlas"][1] == "0" and flops["atlas_mag"][1] != "0"
    model = LanguageModel(64, "atlas", d_model=32, n_layers=2, n_heads=4)
    assert flops["atlas"][0] == flops_text(model.flops_per_token(4096)["memory"])


def test_presets_show_each_memorys_path_on_cuda_by_its_prediction():
    """The CUDA paths at the study's shape (whatever the table's model sizes) and the chosen path's predicted time
    of a call beside the others' (memory/predict.py): the plan's, as plan() gives them."""
    import torch

    from atlas_lab.cli import STUDY_SHAPES, predicted_text
    from atlas_lab.memory.plan import Shapes, plan
    from atlas_lab.memory.predict import ms
    from atlas_lab.models import resolve_preset

    console = Console(record=True, width=1000)
    print_presets(console, d_model=32, n_layers=2, n_heads=4, vocab_size=64, swa_window=8)
    text = console.export_text()
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")] for line in text.splitlines()
            if line.startswith("│")}
    how = plan(resolve_preset("gated_deltanet")[1], Shapes(*STUDY_SHAPES), torch.float32, "cuda")
    times = dict(how.predictions)
    assert rows["gated_deltanet"][11] == predicted_text(how) == \
        f"triton {ms(times['triton'])} (chunked {ms(times['chunked'])})"
    assert rows["gated_deltanet"][10] == "triton / triton / chunked" and rows["transformer"][11] == "—"


@pytest.mark.parametrize("width", [80, 60])
def test_presets_table_in_a_narrow_pipe_cuts_nothing(width):
    """At 80 columns (a pipe) the columns are spread over several tables, each naming every preset in full."""
    console = Console(record=True, width=width, force_terminal=False)
    print_presets(console, d_model=32, n_layers=2, n_heads=4, vocab_size=64, swa_window=8)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    parts = text.count("atlas-lab presets (")
    assert parts > 1
    names = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert [n for n in names if n] == list(PRESETS) * parts
    for column in PRESET_COLUMNS[1:]:
        assert all(word in text for word in column.split())
