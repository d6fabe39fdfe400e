"""The chunked path's products restructured for speed give the values of the products they replace, bit for bit."""
import pytest
import torch

from atlas_lab.memory.chunked import _FactorCombine, _TokenApply
from atlas_lab.memory.ops.causal import causal_matmul, causal_operands, non_finite_tokens


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(64, 16, 16, 15), (64, 16, 4, 16), (3, 5, 7, 2)])
def test_the_per_token_read_has_autograds_values_and_gradients(shape, dtype):
    """u_t W_tᵀ with ∂W_t as an element-wise outer product: the values and gradients of autograd through the batched
    matrix-vector product (its ∂W_t a GEMM over K = 1, one rounded multiplication an entry), a NaN included."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(*shape, generator=g, dtype=dtype)
    u = torch.randn(*shape[:-2], shape[-1], generator=g, dtype=dtype)
    u[0, 0, 0] = float("nan")
    grad = torch.randn(*shape[:-1], generator=g, dtype=dtype)
    results = []
    for apply in (lambda W, u: (W @ u.unsqueeze(-1)).squeeze(-1), _TokenApply.apply):
        W_, u_ = W.clone().requires_grad_(), u.clone().requires_grad_()
        y = apply(W_, u_)
        y.backward(grad)
        results.append((y, W_.grad, u_.grad))
    for ours, autograd in zip(*results):
        assert torch.equal(ours.nan_to_num(), autograd.nan_to_num())
        assert torch.equal(ours.isnan(), autograd.isnan())


def _composed_combine(C, delta, u):
    """Σ_i C[t, i] δ_i u_iᵀ as autograd composes it: the products laid out [N, n, L, out], copied for the GEMM."""
    N, n, L = C.shape
    P = C.unsqueeze(-1) * delta.unsqueeze(1)
    return (P.transpose(1, 2).reshape(N, L, -1).mT @ u).view(N, n, delta.shape[-1], u.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(512, 16, 23, 16, 15), (64, 16, 16, 16, 64), (64, 64, 71, 16, 45), (4, 1, 1, 2, 3)])
def test_the_factor_combination_has_autograds_values_and_gradients(shape, dtype):
    """Σ_i C[t, i] δ_i u_iᵀ with the products written in the GEMM's order: the values and the gradients of C, δ and u
    of autograd through the composed expression (whose sums it takes on the same operands), bit for bit."""
    N, n, L, out, inp = shape
    g = torch.Generator().manual_seed(0)
    C = torch.randn(N, n, L, generator=g, dtype=dtype).tril(L - n)
    delta = torch.randn(N, L, out, generator=g, dtype=dtype)
    u = torch.randn(N, L, inp, generator=g, dtype=dtype)
    grad = torch.randn(N, n, out, inp, generator=g, dtype=dtype)
    results = []
    for apply in (_composed_combine, _FactorCombine.apply):
        inputs = [x.clone().requires_grad_() for x in (C, delta, u)]
        y = apply(*inputs)
        y.backward(grad)
        results.append([y] + [x.grad for x in inputs])
    for ours, autograd in zip(*results):
        assert torch.equal(ours, autograd)


def test_a_token_is_non_finite_where_an_entry_is_nan_or_either_infinity():
    y = torch.randn(3, 5, 4, 2, dtype=torch.float64)
    y[0, 1, 2, 1], y[1, 3, 0, 0], y[2, 4, 3, 1] = float("nan"), float("inf"), -float("inf")
    y[2, 0, 0, 0] = torch.finfo(torch.float64).max  # finite
    assert non_finite_tokens(y).nonzero().tolist() == [[0, 1], [1, 3], [2, 4]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(512, 16, 16, 240), (64, 16, 23, 153), (3, 4, 6, 5)])
def test_the_causal_product_has_autograds_values_and_gradients(shape, dtype):
    """Σ_{i ≤ t} X[t, i] Y_i with the where's zeros written in place into the product's gradient: the values and the
    gradients of X and Y of autograd through causal_operands and the product, bit for bit, a non-finite token
    included."""
    N, n, L, k = shape
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, n, L, generator=g, dtype=dtype)
    Y = torch.randn(N, L, k, generator=g, dtype=dtype)
    Y[0, L - 2, 1] = float("inf")
    grad = torch.randn(N, n, k, generator=g, dtype=dtype)
    results = []
    for apply in (lambda X, Y: torch.matmul(*causal_operands(X, Y)), causal_matmul):
        inputs = [x.clone().requires_grad_() for x in (X, Y)]
        y = apply(*inputs)
        y.backward(grad)
        results.append([y] + [x.grad for x in inputs])
    for ours, autograd in zip(*results):
        assert torch.equal(ours.nan_to_num(), autograd.nan_to_num())
        assert torch.equal(ours.isnan(), autograd.isnan())
