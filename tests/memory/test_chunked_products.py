"""The chunked path's products restructured for speed give the values of the products they replace, bit for bit."""
import pytest
import torch

from atlas_lab.memory.chunked import _TokenApply


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
