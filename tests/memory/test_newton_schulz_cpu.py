"""The compiled CPU Newton–Schulz kernel takes the normalisation X / (‖X‖_F + eps) and the transpose of a tall
matrix inside (ops/newton_schulz/cpu.cpp): the same values and gradients, bit for bit, as the normalisation written
in PyTorch in front of the kernel's bare iterations (a scale d = 1 divides nothing away)."""
import pytest
import torch

from atlas_lab.memory import newton_schulz
from atlas_lab.memory.ops.newton_schulz import cpu
from atlas_lab.memory.ops.newton_schulz.reference import NS_COEFFICIENTS

pytestmark = pytest.mark.skipif(not cpu.available(), reason="the CPU Newton–Schulz kernel does not build here")


class _Iterations(torch.autograd.Function):
    """The kernel's k iterations alone on X_0 [M, m, n] (m ≤ n), d = 1; its backward ∂L/∂X_0 (the first term / 1)."""

    @staticmethod
    def forward(ctx, X, steps, a, b, c):
        ctx.save_for_backward(X)
        ctx.args = (steps, a, b, c)
        return cpu.kernel().forward(X.contiguous(), X.new_ones(X.shape[0]), steps, a, b, c)

    @staticmethod
    def backward(ctx, grad):
        (X,) = ctx.saved_tensors
        g, _ = cpu.kernel().backward(X.contiguous(), X.new_ones(X.shape[0]), grad.contiguous(), *ctx.args)
        return g, None, None, None, None


def normalised_in_pytorch(G, steps, coefficients, eps=1e-7):
    """The normalisation and the transpose in PyTorch (autograd through them), then the kernel's iterations."""
    transpose = G.shape[-2] > G.shape[-1]
    X = G.mT if transpose else G
    batch = X.shape[:-2]
    X = X.reshape(-1, *X.shape[-2:])
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    X = _Iterations.apply(X, steps, *NS_COEFFICIENTS[coefficients]).reshape(*batch, *X.shape[-2:])
    return X.mT if transpose else X


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("coefficients", ["quintic", "cubic"])
@pytest.mark.parametrize("shape", [(3, 4, 16, 15), (5, 4, 16), (6, 9, 5), (40, 1, 3), (2, 17, 40), (4, 3, 3)])
def test_the_kernel_normalises_as_pytorch_does_bit_for_bit(shape, coefficients, dtype):
    g = torch.Generator().manual_seed(0)
    G = torch.randn(*shape, generator=g, dtype=dtype)
    G.view(-1, *shape[-2:])[0] = 0.0  # a zero matrix: the norm's backward is masked there
    weight = torch.randn(*shape, generator=g, dtype=dtype)
    results = []
    for ns in (lambda G: newton_schulz(G, 5, coefficients, impl="cpu"), lambda G: normalised_in_pytorch(G, 5,
                                                                                                      coefficients)):
        G_ = G.clone().requires_grad_()
        out = ns(G_)
        (grad,) = torch.autograd.grad((out * weight).sum(), G_)
        results.append((out, grad))
    (out, grad), (out_pt, grad_pt) = results
    assert torch.equal(out, out_pt)
    assert torch.equal(grad, grad_pt)
    assert torch.isfinite(grad).all()
