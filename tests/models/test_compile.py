"""Compiled blocks (``atlas_lab.models.compile_blocks``, ``SequenceModel(compile=True)``, ``--model.compile=true``):
every layer kind traces into one graph (a graph break would split the fused chunk body and cost a launch round
trip each), and the compiled model computes the eager model's function within the float32 error model of
tests/helpers.py."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from atlas_lab.lit import SequenceModel
from atlas_lab.models import LanguageModel, compile_blocks
from helpers import compare_float32, compiles_as_eager

# One preset of each computation the blocks hold. The default suite traces muon with polynomial features and the CPU
# Newton–Schulz operator (atlas), a deep memory with momentum (titans), the LaCT layer with its components' options
# (lact) and attention alone; -m slow adds the delta rule's WY blocks (gated_deltanet), per-channel gates token by
# token (kda), erase and write gates (gated_deltanet2), chunk-start reads with resets (tnt), levels of commits
# (hope_levels) and the hybrids' memory beside attention (atlas_mag).
TRACED = ["atlas", "titans", "lact", "transformer",
          *(pytest.param(p, marks=pytest.mark.slow)
            for p in ("gated_deltanet", "kda", "gated_deltanet2", "tnt", "hope_levels", "atlas_mag"))]
SIZE = dict(d_model=32, n_layers=1, n_heads=4)


def tokens(T: int, vocab: int = 64, B: int = 2) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(T))


@pytest.mark.parametrize("preset", TRACED)
def test_every_block_traces_in_one_graph(preset, device):
    """torch.compile's tracer takes each block whole, training and evaluation: no graph break (a Python call it
    cannot trace, a cache that a call fills, an operator without a shape function). On ``--device cuda`` (make
    gpu-check) with the paths the plan takes there: the Triton Newton–Schulz operator for atlas."""
    torch.manual_seed(0)
    model = LanguageModel(64, preset, **SIZE).to(device)
    block, h = model.blocks[0], model.embed(tokens(40).to(device)).detach()
    for grad in (True, False):
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            explained = torch._dynamo.explain(block)(h)
        assert explained.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in explained.break_reasons]


def test_the_cpu_newton_schulz_kernel_is_one_operator_in_a_compiled_graph(device):
    """The compiled CPU kernel is a registered operator: AOT autograd through it gives the eager values and gradient
    exactly (its shape function and its backward are the ones the graph uses)."""
    from atlas_lab.memory import newton_schulz
    from atlas_lab.memory.ops.newton_schulz import cpu

    if device.type != "cpu":
        pytest.skip("the CPU kernel (on a GPU machine its build would take a minute of the check)")
    if not cpu.available():
        pytest.skip("the CPU Newton–Schulz kernel does not build here")
    G = torch.randn(3, 20, 6, generator=torch.Generator().manual_seed(0))
    weights = torch.arange(120.0).view(1, 20, 6)
    compiles_as_eager(lambda G: (newton_schulz(G, 5, "quintic", impl="cpu") * weights).sum(), G)


def test_compile_is_a_module_option_that_keeps_the_parameter_names():
    """``SequenceModel(compile=True)`` compiles each block in place: the same parameters under the same names (a
    checkpoint of either loads into the other), nothing compiled until the first call."""
    torch.manual_seed(0)
    eager = SequenceModel(vocab_size=64, preset="titans", **SIZE)
    torch.manual_seed(0)
    compiled = SequenceModel(vocab_size=64, preset="titans", compile=True, **SIZE)
    assert all(block._compiled_call_impl is not None for block in compiled.model.blocks)
    assert all(block._compiled_call_impl is None for block in eager.model.blocks)
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(compiled.state_dict().values(), eager.state_dict().values()))
    assert compiled.hparams.compile is True


def test_a_fit_runs_its_blocks_compiled(workdir, monkeypatch):
    """``atlas-lab fit --model.compile=true`` with lightning_config.yaml's callbacks: training and validation run the
    compiled blocks. (The model summary's forward under torch's FLOP counter used to leave every block uncompiled for
    the whole fit, silently: it now runs eager.) The blocks compile with dynamo's "eager" backend here, to keep the
    test short; what is checked is that dynamo takes their frames at all."""
    pytest.importorskip("jsonargparse")  # the command's parser (a bare GPU image has none)
    from atlas_lab.cli import main

    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert main(["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=titans",
                 "--model.compile=true", "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2",
                 "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.logger=false"]) == 0
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["ok"] >= 2 and frames["ok"] == frames["total"], dict(frames)  # training and validation graphs


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["atlas", "titans"])
def test_compiled_blocks_compute_the_eager_function(preset, device):
    """A compiled model (inductor: fused and reordered float32 arithmetic) against the eager float64 model, within
    SPREAD × the eager float32 model's spread (tests/helpers.py): logits and every parameter's gradient of a
    cross-entropy step. About a minute of compiling a preset on a CPU core."""
    torch.manual_seed(0)
    model64 = LanguageModel(64, preset, **SIZE).double()
    ids = tokens(33)
    ids_of = {"cpu": ids, device.type: ids.to(device)}

    def run(model):
        def go(problem):
            for i, p in enumerate(model.parameters()):
                p.data.copy_(problem[f"w{i}"])
            model.zero_grad(set_to_none=True)
            x = ids_of[next(model.parameters()).device.type]
            logits, _ = model(x[:, :-1])
            F.cross_entropy(logits.reshape(-1, 64).double(), x[:, 1:].reshape(-1)).backward()
            return {"output": logits, **{f"grad.{n}": p.grad for n, p in model.named_parameters()}}
        return go

    eager32 = LanguageModel(64, preset, **SIZE).to(device)
    compiled32 = LanguageModel(64, preset, **SIZE).to(device)
    compile_blocks(compiled32)
    weights = {f"w{i}": p.detach().clone() for i, p in enumerate(model64.parameters())}
    oracle = run(model64)(weights)
    compare_float32(run(compiled32), run(eager32), {n: w.float().to(device) for n, w in weights.items()}, oracle,
                    f"{preset} compiled")
