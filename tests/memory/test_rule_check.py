"""``check_against_reference`` tests the learning rule itself: the engine against the rule's own per-token equation,
and causality, for a rule a user writes in one file (docs/components.md)."""
import dataclasses

import pytest

from atlas_lab.memory import LEARNING_RULES, Online, check_against_reference


class TimeNormalized(Online):
    """Not causal: each value divided by its norm over the whole call (a later token changes an earlier value)."""

    def act(self, steps):
        return dataclasses.replace(steps, v=steps.v / steps.v.norm(dim=1, keepdim=True))


class KeyScaled(Online):
    """η_t scaled by ‖φ(k_t)‖² in its fast form, but ‖φ(k_t)‖ in the equation it states: the two disagree."""

    def act(self, steps):
        return dataclasses.replace(steps, gates={**steps.gates,
                                                 "eta": steps.gates["eta"] * steps.phi_k.square().sum(-1)})

    def equation(self, W, S, x, loop):
        g = loop.window(loop.start, x, x.v, x.gates["gamma"])
        return loop.step(W, S, g, x.gates["alpha"], x.gates["eta"] * x.phi_k.norm(dim=-1), x.gates["theta"])


class KeyScaledRight(KeyScaled):
    def equation(self, W, S, x, loop):
        g = loop.window(loop.start, x, x.v, x.gates["gamma"])
        return loop.step(W, S, g, x.gates["alpha"], x.gates["eta"] * x.phi_k.square().sum(-1), x.gates["theta"])


def test_a_rule_that_is_not_causal_fails_naming_it():
    with pytest.raises(AssertionError, match=r"chunked: the output of learning rule TimeNormalized with mlp.* at a "
                                             r"token t <= 0 changed when the tokens after 0 did: not causal"):
        check_against_reference(learning_rule=TimeNormalized())


def test_a_rule_whose_fast_form_is_not_its_equation_fails_naming_it():
    with pytest.raises(AssertionError, match=r"chunked differs from the equation of learning rule KeyScaled with "
                                             r"linear, identity, l2, gd"):
        check_against_reference(learning_rule=KeyScaled(), architecture="linear")
    errors = check_against_reference(learning_rule=KeyScaledRight(), architecture="linear")
    assert max(errors.values()) < 1e-10


def test_a_per_matrix_rule_passes():
    """LaCT's per-matrix learning rates: γ one per weight matrix (was a KeyError in the check's own gate table)."""
    errors = check_against_reference(T=8, read="chunk", chunk_size=4, window=1,
                                     learning_rule={"name": "chunk_commit", "per_matrix": True})
    assert max(errors.values()) < 1e-10


@pytest.mark.parametrize("rule", [{"name": "online", "gradient_at": "retained"}, "kda", "gdn2",
                                  {"name": "deltaproduct", "householder_steps": 3}, "longhorn"], ids=str)
def test_every_shipped_rule_computes_its_equation(rule):
    """The rules of chunk 1 on a linear memory, each against its own equation (causality included)."""
    errors = check_against_reference(learning_rule=rule, architecture="linear", chunk_size=1, window=1, alpha="learned")
    assert max(errors.values()) < 1e-10


@pytest.mark.parametrize("rule,changes", [
    ({"name": "chunk_commit", "reset_every": 3}, dict(chunk_size=3, T=11)),
    ({"name": "levels", "chunks": [2, 4]}, dict(chunk_size=2, read="chunk", T=11)),
    ("online", dict(read="start", optimizer="momentum")),
    ({"name": "gdn2", "gradient_at": "state", "per_channel": []}, dict(architecture="mlp", window=2, chunk_size=1)),
], ids=str)
def test_rules_with_resets_levels_and_reads_compute_their_equation(rule, changes):
    errors = check_against_reference(learning_rule=rule, **changes)
    assert max(errors.values()) < 1e-10


def test_every_shipped_rule_is_tested_here():
    tested = {"online", "kda", "gdn2", "deltaproduct", "longhorn", "chunk_commit", "levels"}
    assert set(LEARNING_RULES) == tested
