"""A packed row of documents (document_start) is read as if each document were its own sequence, for every preset:
each document's logits are the model's on that document alone, and an earlier document changes nothing later."""
import re
import time

import pytest
import torch

from atlas_lab.layers import MemoryMixer
from atlas_lab.models import PRESETS, LanguageModel, resolve_preset
from atlas_lab.models.documents import groups, segments
from helpers import rel_err

# Two packed rows of 40 tokens: row 0 holds documents of 7, 13 and 20 tokens, row 1 the last 25 tokens of a document
# begun before the window (its position 0 is not flagged) and one of 15. Grouped for reading as 25, 20, 15, 13 (13
# padded to 25) and 7; the memories' chunks (8 or 16) and MAC's segments and SWA's window (5) straddle the starts.
T = 40
STARTS = {0: (0, 7, 20), 1: (25,)}
DOCUMENTS = [(0, 0, 7), (0, 7, 13), (0, 20, 20), (1, 0, 25), (1, 25, 15)]  # (row, start, length)
# Error model: packed and alone compute the same float64 function in different orders of operations (other batch
# shapes and padded lengths: other matmul blockings, SWA's blocked instead of dense path), so a logit moves by a few
# units of roundoff u = 2⁻⁵³ ≈ 1.1e-16 amplified by the conditioning of ≤ 4 layers over ≤ 25 tokens: measured at most
# 2.3e-15 relative over the presets' logits (deltanet) and 1.1e-14 over the gradients below (hope_cms). 1e-10 leaves
# a margin of over 10³, while a document that sees its predecessor (no reset) is off by 0.15 to 1.2 relative in its
# logits (asserted > 1e-2 below, so the comparison can fail) and by 0.09 to 0.36 in the gradients.
TOL = 1e-10


def tiny(preset: str) -> LanguageModel:
    """The preset at d_model 32, float64: attention 2 heads of 16, memories 8 heads of 4, SWA window 5, 2 persistent
    tokens; one layer of each kind of its pattern (at least 2); large chunks (lact, hope_cms) cut to 8."""
    torch.manual_seed(0)
    pattern, _ = resolve_preset(preset)
    model = LanguageModel(64, preset, d_model=32, n_layers=max(2, len(pattern)), n_heads=2, memory_heads=8,
                          swa_window=5, persistent_tokens=2)
    if max((m.config.chunk_size for m in model.modules() if isinstance(m, MemoryMixer)), default=1) > 16:
        torch.manual_seed(0)
        model = LanguageModel(64, preset, d_model=32, n_layers=max(2, len(pattern)), n_heads=2, memory_heads=8,
                              swa_window=5, persistent_tokens=2, memory={"chunk_size": 8})
    return model.double()


def packed(seed: int = 1):
    ids = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(seed))
    start = torch.zeros(2, T, dtype=torch.bool)
    for row, cols in STARTS.items():
        start[row, list(cols)] = True
    return ids, start


def test_segments_and_groups():
    _, start = packed()
    assert segments(start) == DOCUMENTS
    assert groups([n for _, _, n in DOCUMENTS]) == [[3, 2, 4, 1], [0]]
    assert segments(torch.zeros(3, 5, dtype=torch.bool)) == [(0, 0, 5), (1, 0, 5), (2, 0, 5)]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_document_reads_as_if_alone(preset):
    t0 = time.perf_counter()
    model = tiny(preset)
    ids, start = packed()
    with torch.no_grad():
        logits, cache = model(ids, document_start=start)
        no_reset, _ = model(ids)
        changed = ids.clone()
        changed[0, :7] = (changed[0, :7] + 1) % 64  # the first document of row 0
        changed[1, :25] = (changed[1, :25] + 1) % 64  # the first of row 1
        later, _ = model(changed, document_start=start)
        for row, s, n in DOCUMENTS:
            alone, _ = model(ids[row:row + 1, s:s + n])
            where = f"{preset}: document ({row}, {s}, {n})"
            err = rel_err(logits[row, s:s + n], alone[0])
            assert err < TOL, f"{where}: packed differs from alone by {err:.2e}"
            if s > 0:  # a document after another: it would see it without document_start
                assert rel_err(no_reset[row, s:s + n], alone[0]) > 1e-2, f"{where}: no reset changes nothing"
                assert torch.equal(later[row, s:s + n], logits[row, s:s + n]), f"{where}: sees the one before"
            else:
                assert not torch.equal(later[row, s:s + n], logits[row, s:s + n])
    assert cache is None
    print(f"{preset}: {time.perf_counter() - t0:.2f} s")


def weighted_loss(logits: torch.Tensor) -> torch.Tensor:
    """A loss that weighs every logit differently (fixed weights): [n, L, V] -> []."""
    w = torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)
    return (logits * w).sum() + 0.1 * logits.square().sum()


@pytest.mark.parametrize("preset", ["atlas", "titans_mac", "gated_deltanet_h2", "hope_cms"])
def test_gradients_of_a_packed_batch_are_those_of_its_documents_alone(preset):
    """The parameters' gradients of a loss on the packed rows equal the sum of those of each document read alone."""
    model = tiny(preset)
    ids, start = packed()
    packed_grads = torch.autograd.grad(weighted_loss(model(ids, document_start=start)[0]), list(model.parameters()),
                                       allow_unused=True)
    alone = sum(weighted_loss(model(ids[row:row + 1, s:s + n])[0]) for row, s, n in DOCUMENTS)
    alone_grads = torch.autograd.grad(alone, list(model.parameters()), allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), packed_grads, alone_grads):
        assert (a is None) == (b is None), f"{preset}: {name} has a gradient on one side only"
        assert b is None or rel_err(a, b) < TOL, f"{preset}: {name}: gradients differ by {rel_err(a, b):.2e}"


def test_document_start_is_checked_and_takes_no_cache():
    model = tiny("gla")
    ids, start = packed()
    _, cache = model(ids)
    for bad, message in ((start.long(), "must be a bool tensor of input_ids' shape [2, 40]; got torch.int64"),
                         (start[:, :5], "got torch.bool [2, 5]")):
        with pytest.raises(ValueError, match=re.escape(message)):
            model(ids, document_start=bad)
    with pytest.raises(ValueError, match="document_start takes no cache"):
        model(ids, cache, document_start=start)
    # without a start inside a row the batch is read as it is, in one call: the logits without document_start
    assert torch.equal(model(ids, document_start=torch.zeros_like(start))[0], model(ids)[0])


def test_lightning_module_reads_the_batches_documents(preset="atlas_mag"):
    """SequenceModel passes a batch's document_start to the model in training, validation and test (a real Trainer):
    train/loss, val/loss and test/loss are the cross-entropy of the packed logits, not of the logits without it."""
    import lightning as L

    from atlas_lab.lit import SequenceModel

    torch.manual_seed(0)
    module = SequenceModel(64, preset, d_model=32, n_layers=2, n_heads=2, memory_heads=8, swa_window=5, lr=1e-9,
                           warmup_steps=0)
    ids, start = packed()
    labels = torch.roll(ids, -1, 1)
    batch = {"input_ids": ids, "labels": labels, "document_start": start}
    with torch.no_grad():
        loss, no_reset = (torch.nn.functional.cross_entropy(module.model(ids, document_start=s)[0].flatten(0, 1),
                                                             labels.flatten()).item() for s in (start, None))
    assert abs(loss - no_reset) > 1e-3
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, loader, loader)
    train_loss = trainer.callback_metrics["train/loss"].item()  # before the step of lr 1e-9
    val, test = trainer.validate(module, loader)[0]["val/loss"], trainer.test(module, loader)[0]["test/loss"]
    for name, value in (("train", train_loss), ("val", val), ("test", test)):
        assert value == pytest.approx(loss, rel=1e-5), f"{preset}: {name}/loss {value} (packed {loss}, no reset "\
                                                       f"{no_reset})"
