"""Kernels as registered torch operators, so that ``torch.compile`` keeps a graph that calls them whole.

    register_like_input(forward, backward)

for an operator pair ``forward(X, *args) -> Y`` (Y of X's shape, contiguous) and ``backward(X, dY, *args) -> dX``
(``torch.library.custom_op``s): their shape functions, and forward's autograd (X saved; ``backward`` on the upstream
gradient; the other arguments not differentiable).
"""
from __future__ import annotations


def register_like_input(forward, backward) -> None:
    forward.register_fake(lambda X, *args: X.new_empty(X.shape))  # contiguous, as the kernels write it
    backward.register_fake(lambda X, grad, *args: X.new_empty(X.shape))

    def setup(ctx, inputs, output):
        X, *ctx.args = inputs
        ctx.save_for_backward(X)

    def gradient(ctx, grad):
        (X,) = ctx.saved_tensors
        return backward(X, grad, *ctx.args), *(None for _ in ctx.args)

    forward.register_autograd(gradient, setup_context=setup)
