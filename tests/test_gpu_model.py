"""benchmarks/gpu_model.py: the launch counter against a hand count of a one-matrix model's training step, the
multi-tensor-apply launches of a foreach operator, a memory call routed to the chunk kernel counted as its Triton
launches, and the fit against synthetic tables with known constants."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_model  # noqa: E402  (benchmarks/ is not a package)


def test_a_one_matrix_step_is_counted_as_counted_by_hand():
    """loss = (x W).sum() with W [4, 3] on the meta device, gradient clipping and AdamW with foreach.

    forward    mm, sum                                                                        2
    backward   ones_like (the loss's gradient), mm (∂W = xᵀ g; the sum's backward is a view)   2
    optimizer  clipping: _foreach_norm (its multi-tensor launch and its cleanup: 2), stack, vector_norm, add ε,
               max_norm / · (reciprocal, mul), clamp, _foreach_mul_                           9
               AdamW: _foreach_ mul_ (weight decay), lerp_, mul_ (β₂), addcmul_, sqrt, div_, add_ (ε), addcdiv_
               (the step counters are CPU tensors: nothing on a GPU)                          8
    """
    W = torch.nn.Parameter(torch.zeros(4, 3, device="meta"))
    x = torch.zeros(2, 4, device="meta")
    optimizer = torch.optim.AdamW([W], lr=1e-3, weight_decay=0.1, foreach=True)

    def step(count):
        count.phase = "forward"
        loss = (x @ W).sum()
        count.phase = "backward"
        loss.backward()
        count.phase = "optimizer"
        torch.nn.utils.clip_grad_norm_([W], 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    count = gpu_model.count_step(step)
    assert dict(count.launches) == {"forward": 2, "backward": 2, "optimizer": 17}, count.ops
    assert dict(count.flops) == {"forward": 2 * 2 * 4 * 3, "backward": 2 * 4 * 2 * 3, "optimizer": 0}
    # forward bytes: mm reads x [2, 4] and W [4, 3] and writes [2, 3]; sum reads [2, 3] and writes one float
    assert count.bytes["forward"] == 4 * (8 + 12 + 6) + 4 * (6 + 1)
    assert sum(count.syncs.values()) == 0


def test_a_finiteness_check_is_a_host_synchronisation_and_a_value_read_is_refused():
    def check(count):
        y = torch.zeros(3, device="meta").sum()
        if not torch.isfinite(y):  # read on the host: as if it passed
            raise AssertionError
    assert gpu_model.count_step(check).syncs == {"_local_scalar_dense": 1}
    with pytest.raises(RuntimeError, match="reads a tensor's value on the host"):
        gpu_model.count_step(lambda count: torch.zeros(3, device="meta").sum().item())


def test_a_blocking_copy_from_the_host_is_a_host_synchronisation():
    """ATen's blocking host-to-device copy syncs the stream after it: ``.to(device)`` and ``copy_`` of a host tensor
    count one each; a non-blocking copy and a copy on the device none."""
    def step(count):
        x = torch.ones(3).to("meta")
        torch.empty(3, device="meta").copy_(torch.ones(3))
        torch.ones(3).to("meta", non_blocking=True)
        x.to(torch.float64)
    assert gpu_model.count_step(step).syncs == {"copy from the host": 2}


@pytest.mark.parametrize("preset", ["atlas", "swla"])
def test_a_polynomial_feature_map_copies_nothing_from_the_host(preset):
    """φ's monomial indices and scales are on the device once (feature_maps._monomials per device and dtype), not
    copied from the host in every call (5 host synchronisations a call at p = 2 before): a training step of a
    polynomial-φ preset has the finiteness check as its one host synchronisation."""
    from atlas_lab.lit import SequenceModel

    model = SequenceModel(vocab_size=64, preset=preset, d_model=32, n_layers=1, n_heads=2).to("meta")
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    count = gpu_model.count_step(gpu_model.fit_step(model, {"input_ids": ids, "labels": ids}, gpu_model.adamw(model)))
    assert count.syncs == {"_local_scalar_dense": 1}


@pytest.mark.parametrize("numels,depth,launches", [
    ([10] * 110, 1, 1), ([10] * 111, 1, 2), ([10] * 64, 2, 1), ([10] * 65, 2, 2), ([10] * 31, 5, 2),
    ([65536 * 320], 1, 1), ([65536 * 320 + 1], 1, 2), ([65536 * 200, 65536 * 200], 3, 2), ([0, 0], 1, 0)])
def test_foreach_launches_follow_multi_tensor_apply(numels, depth, launches):
    """A launch when 320 blocks of 65,536 elements or the depth's tensors (110, 64, 48, 36, 30) are full."""
    assert gpu_model.foreach_launches(numels, depth) == launches


def test_a_call_routed_to_the_chunk_kernel_counts_its_triton_launches_and_their_flops():
    """gpu_check's Omega case (window 16, momentum, chunk 64) planned as on CUDA takes the chunk kernel: three
    launches forward, three backward, and the dots of ``launches()`` added to the FLOPs, its forward kernels' to the
    forward's and the rest to the backward's; nothing of the kernel runs on the meta device."""
    import gpu_check
    from atlas_lab.memory.ops.chunk_linear_memory.triton import launches
    from atlas_lab.memory.predict import FORWARD_KERNELS

    B, T, H = 2, 160, 2
    case = gpu_check.KERNEL_CASES["omega"]
    options = {n: v for n, v in case.items() if n not in ("d", "gates", "tol")}
    x = gpu_check.kernel_inputs(B, T, H, case["d"], case["gates"], "meta")
    count = gpu_model.count_step(lambda count: gpu_check.memorize_fwd_bwd(x, "auto", options))
    expected = launches(B * H, T, case["d"], case["d"], chunk_size=64, window=16, bias="l2", momentum=True)
    triton = {name[len("triton::"):]: n for name, n in count.ops.items() if name.startswith("triton::")}
    assert triton == dict.fromkeys(expected, 1)
    forward = sum(f for name, (_, _, f) in expected.items() if name in FORWARD_KERNELS)
    assert 0 < forward < sum(f for _, _, f in expected.values())
    assert count.flops["forward"] >= forward and count.flops["backward"] >= sum(
        f for name, (_, _, f) in expected.items() if name not in FORWARD_KERNELS)


def test_ns_flops_by_hand():
    """One quintic step on one 2 × 3 matrix: X Xᵀ 2·2·2·3, A² 2·2·2·2, B X 2·2·2·3; its backward (one step: no
    iterate recomputed) X Xᵀ, A², dX Xᵀ, B dX, sym X (2·2·2·3 each, but A²) and dB A, A dB."""
    assert gpu_model.ns_flops(1, 2, 3, 1, True, False) == 24 + 16 + 24
    assert gpu_model.ns_flops(1, 2, 3, 1, True, True) == 4 * 24 + 3 * 16
    assert gpu_model.ns_flops(5, 2, 3, 2, False, False) == 5 * 2 * 48


def synthetic(constants, seed=0, noise=0.0):
    rng = np.random.default_rng(seed)
    points = []
    for preset in ("a", "b", "c", "d"):
        for L in (64, 128, 256):
            launches, flops = float(rng.integers(200, 12000)), float(rng.uniform(1e10, 5e12))
            step = constants.predict(launches, flops) * (1 + noise * rng.standard_normal())
            points.append(dict(preset=preset, L=L, launches=launches, flops=flops, measured=step))
    return points


def test_the_fit_recovers_known_constants():
    known = gpu_model.Constants(C0=1.6e-3, C_launch=29e-6, R=60e12)
    report = gpu_model.fit_report(synthetic(known))
    c = report["constants"]
    # exact data: the least-squares solution up to float64 rounding, u = 1.1e-16 times the condition number of the
    # column-scaled system (4.6 here): far below 1e-9
    assert c["C0"] == pytest.approx(known.C0, rel=1e-9) and c["C_launch"] == pytest.approx(known.C_launch, rel=1e-9)
    assert c["R"] == pytest.approx(known.R, rel=1e-9)
    assert report["max_ratio"] == pytest.approx(1.0, abs=1e-9)
    assert all(r == pytest.approx(1.0, abs=1e-6) for ratios in report["left_out"].values() for r in ratios)


def test_the_fit_keeps_every_constant_non_negative():
    """Steps that shrink as FLOPs grow: unconstrained, 1/R would be negative; the fit sets it to 0 (R infinite)."""
    points = [dict(preset=p, launches=n, flops=f, measured=1e-3 + 1e-5 * n - f / 1e14)
              for p, n, f in (("a", 100, 1e10), ("a", 200, 5e10), ("b", 400, 9e10), ("b", 800, 1e9))]
    c = gpu_model.fit(points)
    assert c.R == float("inf") and c.C0 >= 0 and c.C_launch > 0


def test_targets_are_judged_per_configuration():
    counts = {"transformer": {64: dict(launches=100, flops=0, bytes=0, syncs=1),
                              256: dict(launches=100, flops=0, bytes=0, syncs=1)},
              "fast": {64: dict(launches=200, flops=0, bytes=0, syncs=1), 256: dict(launches=220, flops=0,
                                                                                    bytes=0, syncs=1)},
              "growing": {64: dict(launches=200, flops=0, bytes=0, syncs=1), 256: dict(launches=600, flops=0,
                                                                                       bytes=0, syncs=1)}}
    # atlas, judged at ≤ 6×: 2 ms of launches, and 5 ms more with its kernels' scratch moved at HBM's bandwidth
    counts["atlas"] = {L: dict(launches=200, flops=0, bytes=0, syncs=1, scratch=gpu_model.HBM * 5e-3)
                       for L in (64, 256)}
    rows = gpu_model.predicted_rows(counts, gpu_model.Constants(0.0, 1e-5, 1e12))
    verdicts = {t["name"]: t for t in gpu_model.targets(rows)}
    assert verdicts["fast"]["met"] and verdicts["fast"]["launch_ratio"] == pytest.approx(1.1)
    assert not verdicts["growing"]["met"] and verdicts["growing"]["launches_vs_base"] == pytest.approx(6.0)
    assert not verdicts["atlas"]["met"] and verdicts["atlas"]["step_vs_base"] == pytest.approx(7.0)
    assert verdicts["atlas"]["in_l2"] == pytest.approx(2.0)


def test_the_envelope_adds_or_overlaps_host_and_gpu_between_synchronisations():
    """Host issue and GPU work added (the fit's form) or overlapped in each stretch between host synchronisations
    (the forward; the backward and optimizer step), the scratch free or at HBM's bandwidth, each over the
    transformer's taken the same way: launches 10 µs each, FLOPs at 1 TFLOP/s."""
    def phases(fwd, bwd):
        return {64: dict(by_phase={"forward": fwd, "backward": bwd, "optimizer": dict(launches=0, flops=0)})}
    counts = {"transformer": phases(dict(launches=100, flops=0), dict(launches=100, flops=0)),
              "atlas": phases(dict(launches=100, flops=3e9),
                              dict(launches=100, flops=2e9, scratch=gpu_model.HBM * 1e-3))}
    (row,) = gpu_model.envelope(counts, gpu_model.Constants(0.0, 1e-5, 1e12), tf32_rate=1e12)
    # added: 1 + 3 + 1 + 2 (+ 1) ms over 2; overlapped: max(1, 3) + max(1, 2 (+ 1)) ms over 2
    assert (row["added_l2"], row["added_hbm"], row["overlap_l2"], row["overlap_hbm"]) == \
        pytest.approx((3.5, 4.0, 2.5, 3.0))


@pytest.mark.parametrize("label", ["transformer", "gated_deltanet"])
def test_a_stack_counted_per_layer_is_the_stack_counted_whole(label):
    """gpu_check's training step at 3 layers: counted whole, and from 1 and 2 layers plus the whole optimizer step."""
    import gpu_check

    size = dict(gpu_check.TRAIN_TINY, n_layers=3)
    assert gpu_model.count_training(label, size, per_layer=True) == \
        {k: v for k, v in gpu_model.count_training(label, size).items() if k != "by_phase"}


# memory/predict.py: the plan's cost formulas against this counter, and its constants against this fit

FORMULA_CASES = [  # (preset, path, dtype of q, k, v): every path that computes these presets' calls on CUDA
    *[(p, path, torch.float32) for p in ("deltanet", "longhorn", "gated_deltanet", "gated_deltanet_h2",
                                         "linear_attention", "gla", "retnet", "mamba2", "swla")
      for path in ("triton", "chunked")],
    *[(p, "chunked", torch.float32) for p in ("kda", "gated_deltanet2", "gated_deltaproduct")],
    ("deltanet", "triton", torch.bfloat16),
    *[(p, "fla", torch.bfloat16) for p in ("deltanet", "longhorn", "kda", "linear_attention", "gla", "mamba2")],
    # the 2-layer MLP memories: the MLP kernels (muon's fused one for atlas) and the chunked path (atlas's: its
    # Newton–Schulz one batched Triton launch a chunk)
    *[(p, path, torch.float32) for p in ("ttt_mlp", "titans", "omeganet", "dot") for path in ("triton", "chunked")],
    *[("atlas", path, torch.float32) for path in ("triton", "chunked")],
    ("atlas", "triton", torch.bfloat16),  # 16-bit inputs: their casts to float32 and back
    # atlas_pp (muon on the gated MLP): the fused kernel with 16-bit inputs (its stacked pair 128 × 256 in float32
    # is over the kernel's entries), the chunked path
    *[("atlas_pp", path, dtype) for path, dtype in (("triton", torch.bfloat16), ("chunked", torch.float32))],
]


@pytest.mark.parametrize("preset,path,dtype", FORMULA_CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_the_plans_launch_and_walk_formulas_are_the_counted_ones(preset, path, dtype):
    """predict.py's launches and walked chunks of a path, against the counter on the path alone (count_path), at
    three lengths: whole chunks and blocks (64, 128) and a partial last one (100: 6¼ chunks of 16, 1 9/16 blocks of
    64). Counts are integers: equal. The chunked path's FLOPs (3 × the plan's forward formula: 0.92–1.33 × the
    products counted here) move its prediction by less than 1 %: at R a call's FLOPs are microseconds beside its
    launches' milliseconds."""
    from atlas_lab.memory import predict
    from atlas_lab.memory.plan import CANDIDATES, Shapes, acting, call_problem

    if path == "fla":
        pytest.importorskip("fla")
    for T in (64, 100, 128):
        q, k, v, config, options = gpu_model.memory_call(preset, 4, T, dtype=dtype)
        count = gpu_model.count_path(q, k, v, config, path, **options)
        specs = config.resolve().specs
        problem = call_problem(config, Shapes(4, T, 8, 16, 16), dtype, "cuda", acting(specs, options["gates"]))
        cost = CANDIDATES[path].cost(problem)
        counted = count.total()
        assert (cost.launches, cost.walk) == (counted["launches"], counted["walk"]), (T, dict(count.launches))
        if path == "chunked":  # its FLOPs: 3 × the plan's forward formula (cost.py), against the products counted
            assert abs(cost.flops - counted["flops"]) / predict.R < 0.01 * cost.seconds, (cost, counted["flops"])


@pytest.mark.slow  # 13–22 s; the formulas against the counter stay in the default suite
def test_the_plans_constants_are_this_fit():
    """predict.py's constants are the fit of the H200 table to this tree's counts (the measured presets on their
    measured routes), as written there to four significant digits."""
    from atlas_lab.memory import predict

    counts = dict(gpu_model.sweep_counts(gpu_model.SWEEP, (), list(gpu_model.MEASURED), gpu_model.LENGTHS,
                                         gpu_model.MEASURED_ROUTES, measured=True))
    fitted = gpu_model.fit(gpu_model.measured_points(counts))
    for name, mine in (("C0", predict.C0), ("C_launch", predict.C_LAUNCH), ("R", predict.R),
                       ("C_walk", predict.C_WALK)):
        assert mine == pytest.approx(getattr(fitted, name), rel=1e-3), (name, fitted)


@pytest.mark.parametrize("sets, expected", [
    (["model.memory.read=chunk"], "error: --set model.memory.read=chunk: unknown key 'model'; valid keys: base,"),
    (["fixed.model.memory.read=chunk"], "error: sweeps/mqar_gpu.yaml: configuration 'transformer': model.preset "
                                        "'transformer' has no memory layer; memory overrides ['read'] do not apply"),
])
def test_a_bad_set_is_one_line_before_anything_is_counted(sets, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(gpu_model.ROOT)
    argv = ["--no-125m", "--presets", "transformer", "--json", str(tmp_path / "out.json")]
    assert gpu_model.main(argv + [a for s in sets for a in ("--set", s)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())
