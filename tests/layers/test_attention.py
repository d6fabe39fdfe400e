"""Sliding-window attention: the blocked O(T·w) path is the dense-mask function (values and gradients, float64 and
float32, lengths that are not a multiple of the window, with a streaming cache), and the SWA layer streams exactly."""
import pytest
import torch

from atlas_lab.layers import Attention
from atlas_lab.layers.attention import sliding_window_attention_blocked, sliding_window_attention_dense
from atlas_lab.layers.rope import rotary

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T,cached,window", [(37, 0, 8), (64, 7, 8), (65, 3, 16), (100, 0, 1), (9, 0, 8),
                                             (200, 63, 64), (129, 5, 64), (17, 1, 2)])
def test_blocked_equals_dense(T, cached, window, dtype):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, 3, T, 5, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 3, T + cached, 5, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))
    weight = torch.randn(2, 3, T, 5, generator=g, dtype=dtype)
    outs = [f(q, k, v, window) for f in (sliding_window_attention_blocked, sliding_window_attention_dense)]
    grads = [torch.autograd.grad((o * weight).sum(), (q, k, v)) for o in outs]
    torch.testing.assert_close(outs[0], outs[1], rtol=TOL[dtype], atol=TOL[dtype])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("window", [1, 5, 16])
def test_swa_layer_streams_like_one_call(window):
    """Pieces shorter and longer than the window (dense and blocked paths) give the one-call outputs."""
    torch.manual_seed(0)
    layer = Attention(32, 4, window=window).double()
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    full, _ = layer(x)
    cache, pieces = None, []
    for lo, hi in [(0, 3), (3, 4), (4, 30), (30, 61)]:
        y, cache = layer(x[:, lo:hi], cache)
        pieces.append(y)
        assert cache["k"].shape[1] == min(hi, window - 1)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-12, atol=1e-12)


def test_swa_layer_equals_masked_softmax_attention():
    """The layer's output is softmax attention over the last w positions, computed directly."""
    torch.manual_seed(1)
    w, T = 6, 40
    layer = Attention(16, 2, window=w).double()
    x = torch.randn(1, T, 16, dtype=torch.float64)
    y, _ = layer(x)
    from atlas_lab.layers.rope import rotary
    q, k, v = layer.qkv(x).view(1, T, 3, 2, 8).unbind(2)
    pos = torch.arange(T)
    q, k = rotary(q, pos, layer.rope_base), rotary(k, pos, layer.rope_base)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / 8 ** 0.5
    inside = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - w)
    o = torch.einsum("bhts,bshd->bthd", scores.masked_fill(~inside, -torch.inf).softmax(-1), v)
    torch.testing.assert_close(y, layer.o_proj(o.reshape(1, T, 16)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [None, 3, 8])
def test_persistent_tokens_are_keys_every_query_sees(window):
    """With persistent pairs (P, V_P), each query's output is softmax over [P; its causal window] computed directly;
    the blocked SWA path (T > window) and a stream of pieces give the same as one call."""
    torch.manual_seed(0)
    attn = Attention(16, 2, window=window, persistent=3).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    y, _ = attn(x)
    B, T, H, d = 2, 13, 2, 8
    q, k, v = attn.qkv(x).view(B, T, 3, H, d).unbind(2)
    pos = torch.arange(T)
    q, k = rotary(q, pos, attn.rope_base), rotary(k, pos, attn.rope_base)
    pk, pv = attn.persistent
    out = torch.zeros(B, T, H, d, dtype=torch.float64)
    for t in range(T):
        lo = 0 if window is None else max(0, t - window + 1)
        keys = torch.cat([pk.unsqueeze(0).expand(B, -1, -1, -1), k[:, lo:t + 1].transpose(1, 2)], 2)
        vals = torch.cat([pv.unsqueeze(0).expand(B, -1, -1, -1), v[:, lo:t + 1].transpose(1, 2)], 2)
        w = torch.softmax(torch.einsum("bhd,bhsd->bhs", q[:, t], keys) / d ** 0.5, -1)
        out[:, t] = torch.einsum("bhs,bhsd->bhd", w, vals)
    direct = attn.o_proj(out.reshape(B, T, H * d))
    assert (y - direct).abs().max() < 1e-12
    cache, pieces = None, []
    for lo, hi in [(0, 5), (5, 6), (6, 13)]:
        o, cache = attn(x[:, lo:hi], cache)
        pieces.append(o)
    assert (torch.cat(pieces, 1) - y).abs().max() < 1e-12
