"""Components as objects (docs/components.md): user components defined here reach the engine from Python and from
YAML (class_path / init_args through `atlas-lab fit`), take the path their form allows, and match the oracle."""
import dataclasses
from pathlib import Path

import pytest
import torch

from atlas_lab.cli import main
from atlas_lab.memory import (GD, L2, Adam, Huber, KLRetention, Lp, LqRetention, MemoryOptimizer, Muon, AttentionalBias,
                              TransformedAccumulator, TransformedMomentum, MemoryConfig, check_against_reference,
                              GateSpec, Online, memorize)
from atlas_lab.memory.plan import form_of


class NormalizedGD(MemoryOptimizer):
    """W_t = α_t W_{t−1} − η_t g_t / (‖g_t‖ + ε): no closed in-chunk form, so the engine steps token by token."""

    def __init__(self, eps: float = 1e-6):
        self.eps = eps

    def update(self, w, s, g, alpha, eta, theta):
        norm = g.flatten(1).norm(dim=1).reshape(-1, *[1] * (g.dim() - 1))
        return alpha.reshape(norm.shape) * w - eta.reshape(norm.shape) * g / (norm + self.eps), None


class TanhMomentum(TransformedMomentum):
    """S_t = θ S_{t−1} + g_t, W_t = α W_{t−1} − η tanh(S_t / τ): a smooth sign of the momentum."""

    def __init__(self, tau: float = 0.5):
        self.tau = tau

    def direction(self, S, ndim):
        return torch.tanh(S / self.tau)


class TanhAccumulator(TransformedAccumulator):
    """A_t = α A_{t−1} − η g_t, W_t = τ tanh(A_t / τ): weights bounded by τ; A_0 = τ artanh(W_0 / τ)."""

    def __init__(self, tau: float = 2.0):
        self.tau = tau

    def start(self, w):
        return w, self.tau * torch.atanh(w / self.tau)

    def weights(self, A):
        return self.tau * torch.tanh(A / self.tau)


class LogCosh(AttentionalBias):
    """ℓ = Σ_j log cosh(y_j − v_j); no ``grad``, so its gradients come from torch.func."""

    def loss(self, y, v):
        return torch.log(torch.cosh(y - v)).sum(-1)


def path(name):
    return {"class_path": f"{__name__}.{name}"}


@pytest.mark.parametrize("memory", ["linear", "mlp", "gated_mlp"])
@pytest.mark.parametrize("bias", ["l2", LogCosh(), Huber(0.3), Lp(3.0)], ids=repr)
@pytest.mark.parametrize("optimizer", [NormalizedGD(), TanhMomentum(), TanhAccumulator(), "momentum"], ids=repr)
@pytest.mark.parametrize("read", ["token", "chunk"])
def test_user_components_match_the_reference(memory, bias, optimizer, read):
    errors = check_against_reference(architecture=memory, feature_map="polynomial", attentional_bias=bias,
                                     optimizer=optimizer, read=read)
    assert max(errors.values()) < 1e-6


def test_check_against_reference_can_fail():
    """The one-call check finds a component whose fast form disagrees with its own update rule."""

    class Inconsistent(TanhMomentum):
        def update(self, w, s, g, alpha, eta, theta):  # reference: without the tanh
            s = theta.reshape(-1, *[1] * (w.dim() - 1)) * s + g
            return w - eta.reshape(-1, *[1] * (w.dim() - 1)) * s, s

        def direction(self, S, ndim):  # the closed form it declares (with the tanh) beside that update
            return torch.tanh(S / self.tau)

    with pytest.raises(AssertionError, match="chunked differs from the equation of learning rule online with mlp"):
        check_against_reference(optimizer=Inconsistent())


def test_the_declared_form_decides_the_path():
    """The plan's in-chunk form is what an optimiser declares (a closed form defined with its ``update``); a subclass
    that overrides ``update`` without declaring a closed form again runs its own update token by token."""
    class Renamed(GD):  # GD's update and closed form, inherited together
        pass

    class OwnUpdate(GD):  # its own update: GD's closed form no longer describes it
        def update(self, w, s, g, alpha, eta, theta):
            return GD.update(self, w, s, 2 * g, alpha, eta, theta)

    def form(optimizer):
        config = MemoryConfig(architecture="mlp", optimizer=optimizer, chunk_size=4)
        mem, _, bias, optimizer = config.components()
        return form_of(config, mem, bias, optimizer, config.rule().gates(config, optimizer))[0]

    assert form(NormalizedGD()) == "stepwise" and form(Adam()) == "stepwise" and form(OwnUpdate()) == "stepwise"
    assert form(TanhMomentum()) == "transformed" and form(Muon()) == "transformed"
    assert form(GD()) == "linear" and form(Renamed()) == "linear"
    assert all(form(o) == "accumulated" for o in (TanhAccumulator(), LqRetention(), KLRetention()))
    check_against_reference(optimizer=OwnUpdate())  # the update it defines, on every path
    config = MemoryConfig(architecture={"name": "mlp", "depth": 3}, feature_map={"name": "taylor", "degree": 3},
                          attentional_bias=path("LogCosh"), optimizer=path("NormalizedGD"))
    mem, fmap, bias, optimizer = config.components()
    assert (mem.depth, fmap.degree, type(bias), type(optimizer)) == (3, 3, LogCosh, NormalizedGD)
    assert bias.grad is None and L2().grad is not None and not optimizer.uses_theta
    assert isinstance(MemoryConfig(optimizer=GD()).components()[3], GD)


@pytest.mark.parametrize("bias", [Huber(2.5), Lp(3.0), Lp(1.5)], ids=repr)
def test_objective_gradients_are_the_derivative_of_the_loss(bias):
    """∂ℓ/∂y given by the bias equals autograd's derivative of its loss; Huber is ½‖r‖² inside δ = 2.5 (‖r‖ of
    these draws is 2.6 on average: both sides are taken), δ‖r‖ − ½δ² outside."""
    g = torch.Generator().manual_seed(0)
    y, v = torch.randn(50, 4, generator=g, dtype=torch.float64), torch.randn(50, 4, generator=g, dtype=torch.float64)
    y.requires_grad_(True)
    (auto,) = torch.autograd.grad(bias.loss(y, v).sum(), y)
    torch.testing.assert_close(bias.grad(y, v), auto, rtol=1e-12, atol=1e-12)
    if isinstance(bias, Huber):
        r = (y - v).detach()
        inside = r.norm(dim=-1) <= 2.5
        outside = ~inside
        assert inside.any() and outside.any()
        torch.testing.assert_close(bias.loss(y, v)[inside], 0.5 * r[inside].square().sum(-1))
        torch.testing.assert_close(bias.loss(y, v)[outside], 2.5 * r[outside].norm(dim=-1) - 3.125)


def test_user_components_train_through_atlas_lab_fit_from_yaml(workdir, capsys):
    Path("components.yaml").write_text(f"""model:
  preset: titans
  d_model: 16
  n_layers: 1
  n_heads: 2
  memory_heads: 2
  memory:
    optimizer:
      class_path: {__name__}.NormalizedGD
      init_args: {{eps: 1.0e-5}}
    attentional_bias:
      class_path: {__name__}.LogCosh
data:
  init_args:
    train_slices: [[16, 2, 32]]
    test_slices: [[16, 2, 16]]
    batch_size: 8
""")
    args = ["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "-c", "components.yaml",
            "--trainer.fast_dev_run=true", "--trainer.logger=false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "memory n/a" in out  # no FLOPs formula for a token-by-token optimiser: said, not invented
    from atlas_lab.lit.cli import run_cli

    cli = run_cli(args)
    mixer = cli.model.model.blocks[0].mixer
    assert type(mixer.optimizer) is NormalizedGD and mixer.optimizer.eps == 1e-5 and type(mixer.bias) is LogCosh
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_a_bad_class_path_is_one_line(workdir, capsys):
    args = ["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--trainer.fast_dev_run=true",
            "--model.memory.optimizer={class_path: torch.nn.Linear}"]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "model.memory.optimizer: class_path 'torch.nn.Linear' is not a MemoryOptimizer" in err[0]


def test_a_component_option_from_the_command_line_joins_the_component_of_the_config_files(workdir):
    """A YAML names the optimiser with one option; --model.memory.optimizer.ns_steps adds another, keeping its name."""
    from atlas_lab.lit.cli import check_config

    Path("cubic.yaml").write_text("model:\n  memory:\n    optimizer: {name: muon, ns_coefficients: cubic}\n")
    cli = check_config(["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "-c", "cubic.yaml",
                        "--model.memory.optimizer.ns_steps=2"])
    optimizer = cli.model.model.blocks[0].mixer.optimizer
    assert (type(optimizer), optimizer.ns_steps, optimizer.ns_coefficients) == (Muon, 2, "cubic")


class ValueGate(Online):
    """A user's rule (docs/components.md): a learned gate ω per head scales the value each token writes, ω_t v_t."""

    def gates(self, config, optimizer):
        return {**super().gates(config, optimizer),
                "omega": GateSpec("ω", "learned", 0.5, lambda x: x >= 0, ">= 0", per_step=True)}

    def act(self, steps):
        return dataclasses.replace(steps, v=steps.v * steps.gates["omega"].unsqueeze(-1))

    def equation(self, W, S, x, loop):
        g = loop.window(loop.start, x, x.gates["omega"].unsqueeze(-1) * x.v, x.gates["gamma"])
        return loop.step(W, S, g, x.gates["alpha"], x.gates["eta"], x.gates["theta"])


@pytest.mark.parametrize("changes", [dict(), dict(architecture="linear", optimizer="momentum", read="chunk")])
def test_a_users_learning_rule_is_checked_in_one_call(changes):
    """A rule that is not built in, given as an object, passes the one-call check; it is the online rule on ω ⊙ v."""
    errors = check_against_reference(learning_rule=ValueGate(), **changes)
    assert max(errors.values()) < 1e-10
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    omega = torch.rand(1, 5, 2, generator=g, dtype=torch.float64)
    config = MemoryConfig(learning_rule=ValueGate(), window=2, chunk_size=2)
    mine = memorize(q, k, v, config, gates={"omega": omega})[0]
    plain = memorize(q, k, v * omega.unsqueeze(-1), config.replace(learning_rule="online"))[0]
    assert torch.equal(mine, plain)
    with pytest.raises(ValueError, match=r"the learning rule has no gate\(s\) \['erase'\]; its gates: alpha, eta"):
        memorize(q, k, v, config, gates={"omega": omega, "erase": 0.5})


def test_learning_rules_are_named_like_the_other_components():
    rule = MemoryConfig(learning_rule={"class_path": "atlas_lab.memory.learning_rules.DeltaProduct",
                                       "init_args": {"householder_steps": 3}}).rule()
    assert (repr(rule), rule.steps()) == ("deltaproduct", 3)
    with pytest.raises(ValueError, match="learning_rule.householder: deltaproduct does not take 'householder'"):
        MemoryConfig(learning_rule={"name": "deltaproduct", "householder": 3}).validate()
    changed = MemoryConfig(architecture="linear", alpha="learned").replace(**{"learning_rule": "kda",
                                                                               "learning_rule.gradient_at": "state"})
    assert changed.learning_rule == {"name": "kda", "gradient_at": "state"}


class ValueNormDelta(Online):
    """A user's rule with an option of its own, p: float (the online rule; p is what its class declares)."""

    def __init__(self, p: float = 1.0):
        super().__init__()
        self.p = p


def test_a_components_options_are_checked_by_their_annotations():
    """An option its constructor's annotation does not admit is one line naming the key, the type and the value,
    before the class is built; a string of a number (YAML 1.1's 1e-3) is the float the annotation asks for; the
    init_args form of ``replace`` sets an option of a class given by class_path, and is refused for a short-hand."""
    from atlas_lab.memory import build_learning_rule

    config = MemoryConfig(learning_rule=path("ValueNormDelta"))
    with pytest.raises(ValueError, match=r"^memory\.learning_rule\.init_args\.p: expected float; got abc$"):
        config.replace(**{"learning_rule.init_args.p": "abc"})
    with pytest.raises(ValueError, match=r"^memory\.learning_rule\.init_args\.p: expected float; got \[1\]$"):
        config.replace(**{"learning_rule.p": [1]})
    changed = config.replace(**{"learning_rule.init_args.p": "1e-3"})
    assert changed.learning_rule == {**path("ValueNormDelta"), "init_args": {"p": "1e-3"}}
    rule = build_learning_rule(changed.learning_rule)
    assert type(rule) is ValueNormDelta and rule.p == 0.001 and type(rule.p) is float
    with pytest.raises(ValueError, match=r"^memory\.learning_rule\.init_args\.p: init_args holds the options of a "
                                         r"class given by class_path, and the learning_rule is 'online'; write "
                                         r"learning_rule\.p: 0\.5"):
        MemoryConfig().replace(**{"learning_rule.init_args.p": 0.5})
    with pytest.raises(ValueError, match=r"^memory\.optimizer\.ns_steps: expected int; got 2\.5$"):
        MemoryConfig(optimizer={"name": "muon", "ns_steps": 2.5}).validate()
    with pytest.raises(ValueError, match="muon ns_steps must be an int >= 1, got 0"):  # its range: the class's own
        MemoryConfig(optimizer={"name": "muon", "ns_steps": 0}).validate()


USER_RULE_YAML = f"model:\n  memory:\n    learning_rule: {{class_path: {__name__}.ValueNormDelta}}\n"


@pytest.mark.parametrize("flag", ["--model.memory.learning_rule.init_args.p=0.5", "--model.memory.learning_rule.p=0.5"])
def test_a_users_option_from_the_command_line_reaches_its_class(flag, workdir):
    """A YAML names a user's rule by class_path; an option flag, in LightningCLI's init_args form or the short one,
    sets its option: the model's layers build the class with it."""
    from atlas_lab.lit.cli import check_config
    from atlas_lab.memory import build_learning_rule

    Path("rule.yaml").write_text(USER_RULE_YAML)
    cli = check_config(["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "-c", "rule.yaml", flag])
    spec = cli.model.model.blocks[0].mixer.config.learning_rule
    assert spec == {**path("ValueNormDelta"), "init_args": {"p": 0.5}}
    assert build_learning_rule(spec).p == 0.5


def test_print_config_shows_the_memory_the_run_uses(workdir, capsys):
    """--print_config with a component's option flags prints the config with the options set (the class given by
    class_path and its init_args; an option of the preset's component as a mapping of options), not the parser's
    reading of the flags."""
    import yaml

    Path("rule.yaml").write_text(USER_RULE_YAML)
    base = ["fit", "-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=atlas"]
    with pytest.raises(SystemExit) as done:
        main([*base, "-c", "rule.yaml", "--model.memory.learning_rule.init_args.p=0.5",
              "--model.memory.optimizer.ns_steps=3", "--print_config"])
    assert done.value.code == 0
    memory = yaml.safe_load(capsys.readouterr().out)["model"]["memory"]
    assert memory == {"learning_rule": {**path("ValueNormDelta"), "init_args": {"p": 0.5}},
                      "optimizer": {"ns_steps": 3}}
