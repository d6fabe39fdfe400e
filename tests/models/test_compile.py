"""Compiled blocks (``atlas_lab.models.compile_blocks``, ``SequenceModel(compile=True)``, ``--model.compile=true`` or
torch.compile's options, ``--model.compile.mode=reduce-overhead``): every block of every preset traces into one graph
in training, forward and backward, with no host synchronisation (a graph break would split the fused chunk body and
cost a launch round trip each; an ``.item()``, a branch on a tensor or a data-dependent shape would each break it, and
would keep "reduce-overhead" from capturing the block as one CUDA graph), and the compiled model computes the eager
model's function within the float32 error model of tests/helpers.py."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from atlas_lab.lit import SequenceModel
from atlas_lab.models import LanguageModel, compile_blocks
from atlas_lab.models.presets import PRESETS
from helpers import compare_float32, compiles_as_eager

# Every preset. The default suite traces muon with polynomial features and the CPU Newton–Schulz operator (atlas), a
# deep memory with momentum (titans), the LaCT layer with its components' options (lact), memory as context with its
# cache of the segment's keys (titans_mac) and attention alone; -m slow the others: the delta rule's WY blocks
# (gated_deltanet), per-channel gates token by token (kda), erase and write gates (gated_deltanet2), chunk-start
# reads with resets (tnt), levels of commits (hope_levels), the hybrids' memory beside attention (atlas_mag), ...
DEFAULT_TRACED = ("atlas", "titans", "lact", "titans_mac", "transformer")
TRACED = [p if p in DEFAULT_TRACED else pytest.param(p, marks=pytest.mark.slow) for p in PRESETS]
SIZE = dict(d_model=32, n_layers=1, n_heads=4)


def tokens(T: int, vocab: int = 64, B: int = 2) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(T))


@pytest.mark.parametrize("preset", TRACED)
def test_every_block_traces_in_one_graph(preset, device):
    """torch.compile's tracer takes each block of the preset's layer pattern whole, training (the forward and, through
    each autograd.Function, its backward) and evaluation: one graph, no graph break (a Python call it cannot trace, a
    cache that a call fills, an operator without a shape function, a host synchronisation: ``.item()``, a branch on a
    tensor, ``nonzero`` or a boolean mask). On ``--device cuda`` (make gpu-check) with the paths the plan takes
    there: the Triton Newton–Schulz operator for atlas."""
    torch.manual_seed(0)
    model = LanguageModel(64, preset, **{**SIZE, "n_layers": len(PRESETS[preset]["layers"])}).to(device)
    h = model.embed(tokens(40).to(device)).detach()
    for i, block in enumerate(model.blocks):
        for grad in (True, False):
            torch._dynamo.reset()
            with torch.set_grad_enabled(grad):
                explained = torch._dynamo.explain(block)(h)
            reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), (i, grad, reasons)


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


@pytest.mark.parametrize("flag, options", [("--model.compile=true", {}),
                                           ("--model.compile.mode=reduce-overhead", {"mode": "reduce-overhead"}),
                                           ("--model.compile={mode: max-autotune-no-cudagraphs, fullgraph: true}",
                                            {"mode": "max-autotune-no-cudagraphs", "fullgraph": True})])
def test_a_fit_runs_its_blocks_compiled(flag, options, workdir, monkeypatch):
    """``atlas-lab fit --model.compile=true`` (or torch.compile's options) with lightning_config.yaml's callbacks:
    each block is compiled with the options given, and training and validation run the compiled blocks. (The model
    summary's forward under torch's FLOP counter used to leave every block uncompiled for the whole fit, silently: it
    now runs eager.) The blocks compile with dynamo's "eager" backend here (which takes no mode), to keep the test
    short; what is checked is that the options reach ``torch.compile`` and that dynamo takes the blocks' frames."""
    pytest.importorskip("jsonargparse")  # the command's parser (a bare GPU image has none)
    from atlas_lab.cli import main

    compile_, given = torch.nn.Module.compile, []

    def compile_eagerly(self, **kw):
        given.append(kw)
        compile_(self, **{k: v for k, v in kw.items() if k != "mode"}, backend="eager")

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eagerly)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert main(["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=titans", flag,
                 "--model.d_model=16", "--model.n_layers=1", "--model.n_heads=2",
                 "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.logger=false"]) == 0
    assert given == [{"dynamic": False, **options}]
    counters = torch._dynamo.utils.counters  # (fullgraph counts no frames: a break there raises)
    assert counters["stats"]["unique_graphs"] >= 2, dict(counters["stats"])  # training and validation graphs
    assert counters["frames"]["ok"] == counters["frames"]["total"], dict(counters["frames"])


@pytest.mark.parametrize("flag, line", [
    ("--model.compile.moed=reduce-overhead",
     "model.compile: expected true or false or a mapping of mode, fullgraph; got {'moed': 'reduce-overhead'}"),
    ("--model.compile.mode=fast",
     "model.compile: expected true or false or a mapping of mode, fullgraph; got {'mode': 'fast'}")])
def test_a_bad_compile_option_is_one_line(flag, line, workdir, capsys):
    """An option torch.compile's blocks do not take, or a mode torch does not have: one line naming the key, what it
    takes and what was given, exit 2, nothing written."""
    pytest.importorskip("jsonargparse")
    from atlas_lab.cli import main

    assert main(["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", flag]) == 2
    assert capsys.readouterr().err.splitlines()[0].startswith(f"error: {line}")
    assert not (workdir / "runs").exists()


def test_the_module_refuses_an_unknown_compile_option():
    """``SequenceModel(compile={...})`` from Python: a key ``CompileOptions`` does not hold, or a value its annotation
    does not admit, is a ValueError naming the key, what it takes and what was given."""
    with pytest.raises(ValueError, match=r"^model\.compile\.moed: unknown key; expected one of mode, fullgraph; "
                                         r"got moed: reduce-overhead$"):
        SequenceModel(vocab_size=64, preset="titans", compile={"moed": "reduce-overhead"}, **SIZE)
    with pytest.raises(ValueError, match=r"^model\.compile\.mode: expected 'default', 'reduce-overhead', "
                                         r"'max-autotune', 'max-autotune-no-cudagraphs'; got fast$"):
        SequenceModel(vocab_size=64, preset="titans", compile={"mode": "fast"}, **SIZE)


def compiled_matches_eager(preset: str, options: dict, device) -> None:
    """A compiled model (inductor with ``options``: fused and reordered float32 arithmetic) against the eager float64
    model, within SPREAD × the eager float32 model's spread (tests/helpers.py): logits and every parameter's gradient
    of a cross-entropy step."""
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
    compile_blocks(compiled32, options)
    weights = {f"w{i}": p.detach().clone() for i, p in enumerate(model64.parameters())}
    oracle = run(model64)(weights)
    compare_float32(run(compiled32), run(eager32), {n: w.float().to(device) for n, w in weights.items()}, oracle,
                    f"{preset} compiled with {options}")


def test_a_block_compiled_to_reduce_overhead_computes_the_eager_function(device):
    """``mode: reduce-overhead`` (a CUDA graph per block on a GPU; on the CPU, which has none, inductor's code alone)
    runs and computes the eager function: attention's block, about ten seconds of compiling on a CPU core. A memory's
    block is the slow test below."""
    compiled_matches_eager("transformer", {"mode": "reduce-overhead"}, device)


@pytest.mark.slow
@pytest.mark.parametrize("preset, options", [("atlas", None), ("titans", None),
                                             ("titans", {"mode": "reduce-overhead"})])
def test_compiled_blocks_compute_the_eager_function(preset, options, device):
    """``compiled_matches_eager`` for a memory's block: about a minute of compiling a preset on a CPU core."""
    compiled_matches_eager(preset, options, device)
