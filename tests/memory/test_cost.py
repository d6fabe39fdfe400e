"""atlas_lab.memory.cost: the FLOPs formulas (the plan's ``flops``) against torch's FlopCounterMode on the real forward
pass."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import helpers
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.memory.cost import attention_flops
from atlas_lab.memory.plan import Shapes, plan
from atlas_lab.models import PRESETS, resolve_preset

MEMORY_PRESETS = [p for p in PRESETS if resolve_preset(p)[1] is not None and p not in ("atlas_mag", "atlas_mal")]
EXTRA = {"gated_mlp muon global": dict(architecture="gated_mlp", optimizer="muon", window=None, chunk_size=5),
         "mlp depth 3 momentum": dict(architecture={"name": "mlp", "depth": 3}, optimizer="momentum", window=2,
                                      chunk_size=4),
         "mlp muon cubic": dict(architecture="mlp", optimizer={"name": "muon", "ns_coefficients": "cubic"}, window=3,
                                chunk_size=4),
         "mlp lq retention": dict(architecture="mlp", attentional_bias="lp", optimizer="lq_retention", window=3,
                                  chunk_size=4),
         "gated_mlp kl retention": dict(architecture="gated_mlp", optimizer="kl_retention", window=None, chunk_size=5),
         "normalised linear": dict(architecture="linear", feature_map="taylor", attentional_bias="dot", normalize=True,
                                   chunk_size=4),
         "mlp muon levels": dict(architecture="mlp", optimizer="muon", window=2, chunk_size=3, read="chunk",
                                 learning_rule={"name": "levels", "chunks": [3, 9], "rates": [1.0, 0.5]})}


def counted_flops(config: MemoryConfig, head_dim: int, T: int) -> int:
    g = torch.Generator().manual_seed(0)
    rule = config.rule()
    n_h = rule.steps()  # DeltaProduct: n_h keys, values per token
    q, k, v = (torch.randn(1, T * n, 2, head_dim, generator=g).to(helpers.DEVICE) for n in (1, n_h, n_h))
    values = dict(alpha=0.9, eta=0.1, theta=0.5, gamma=0.7)  # and 0.8 for the rule's other learned gates (GDN-2's)
    gates = {name: values.get(name, 0.8) for name, spec in rule.gates(config, config.components()[3]).items()
             if name in values or spec.value == "learned"}
    with FlopCounterMode(display=False) as counter:
        memorize(q, k, v, config, gates=gates)
    return counter.get_total_flops() / 2  # 2 heads


@pytest.mark.parametrize("read", ["token", "start", "chunk"])
@pytest.mark.parametrize("name", MEMORY_PRESETS + list(EXTRA))
def test_memory_flops_formula_equals_the_counted_forward(name, read, monkeypatch):
    """Every preset's memory and a few more, at T = 37 (a partial last chunk): formula == count, exactly. A form
    without a formula (stepwise: gates per channel outside the delta rule, lact's kept row norms) says None.
    The compiled CPU Newton–Schulz kernel is not an aten op, so the count runs NS as batched matmuls."""
    monkeypatch.setenv("ATLAS_LAB_NS_KERNEL", "0")
    config = resolve_preset(name)[1] if name in PRESETS else MemoryConfig(**EXTRA[name])
    if read not in config.rule().reads or (read != "chunk" and getattr(config.rule(), "per_matrix", False)):
        config = config.replace(learning_rule="chunk_commit")  # levels, γ per matrix (lact): chunk reads only
    config = config.replace(read=read)
    T, head_dim = 37, 8
    how = plan(config, Shapes(1, T, 2, head_dim, head_dim), impl="chunked")
    if how.form == "stepwise":
        assert how.flops is None
        return
    flops = how.flops
    assert flops * T == pytest.approx(counted_flops(config, head_dim, T), rel=1e-12)


def test_attention_flops_is_the_causal_part_of_the_full_product():
    """A masked attention's products are the full T × T ones; causal attention needs (T + 1) / 2T of them."""
    T, d = 50, 16
    q = torch.randn(1, 2, T, d)
    with FlopCounterMode(display=False) as counter:
        scores = (q @ q.mT).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf)
        scores.softmax(-1) @ q
    full = counter.get_total_flops() / 2
    assert attention_flops(d, T) * T == pytest.approx(full * (T + 1) / (2 * T), rel=1e-12)
    assert attention_flops(d, T, window=10) < attention_flops(d, T) and attention_flops(d, 5, window=10) == \
        attention_flops(d, 5)
