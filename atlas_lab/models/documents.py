"""Packed documents read as sequences of their own (``LanguageModel``'s ``document_start``).

A packed row holds documents back to back; ``document_start`` [B, T] (bool) is True where one begins. Each row is
cut at its document starts into segments — its first segment begins at position 0 whether or not it is flagged (a
document begun before the window) — and the segments are read as rows of one batch, right-padded with the row's
following tokens: every model here is causal and reads its rows independently, so the padding changes no output of
a segment, and each segment is read exactly as the document alone (memory states, Omega windows, short-conv
histories, optimiser states, attention and RoPE positions all start afresh; persistent tokens are the model's). The
outputs are scattered back to their places in the packed rows.

Padding is bounded by grouping: the segments, longest first, are read in groups whose longest is less than twice
each member's length, so no segment is padded to twice its length or more (at most 2·B·T tokens are read) and there
are at most ⌊log₂ T⌋ + 1 groups, one model call each. Cutting reads the flags on the host (one synchronisation).
"""
from __future__ import annotations

from typing import Callable

import torch


def segments(document_start: torch.Tensor) -> list[tuple[int, int, int]]:
    """The documents of the packed rows as (row, start, length), row by row. document_start: [B, T] bool."""
    T = document_start.shape[1]
    starts = document_start.clone()
    starts[:, 0] = True
    rows, cols = (x.tolist() for x in starts.nonzero(as_tuple=True))  # row-major order
    out = []
    for i, (row, col) in enumerate(zip(rows, cols)):
        end = cols[i + 1] if i + 1 < len(rows) and rows[i + 1] == row else T
        out.append((row, col, end - col))
    return out


def groups(lengths: list[int]) -> list[list[int]]:
    """Indices of ``lengths`` in groups read together: longest first, a group's longest < 2 × each member."""
    out = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if out and 2 * lengths[i] > lengths[out[-1][0]]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def read_documents(read: Callable[[torch.Tensor], torch.Tensor], input_ids: torch.Tensor,
                   document_start: torch.Tensor) -> torch.Tensor:
    """Each document of each packed row read as its own sequence.

    read: token ids [n, L] -> outputs [n, L, ...] (a causal model, rows independent); input_ids, document_start:
    [B, T] -> outputs [B, T, ...], position t of a row being ``read``'s output at t's place in its document.
    Rows without a document start inside them are read as they are, in one call.
    """
    B, T = input_ids.shape
    docs = segments(document_start)
    if len(docs) == B:
        return read(input_ids)
    flat, device = input_ids.reshape(-1), input_ids.device
    outputs, places = [], []
    for group in groups([n for _, _, n in docs]):
        row, start, length = (torch.tensor(x, device=device) for x in zip(*(docs[i] for i in group)))
        j = torch.arange(docs[group[0]][2], device=device)
        index = row[:, None] * T + (start[:, None] + j).clamp(max=T - 1)  # [n, L]: the row's tokens from start on
        real = j < length[:, None]
        outputs.append(read(flat[index])[real])
        places.append(index[real])
    out = torch.cat(outputs)[torch.cat(places).argsort()]  # [B·T, ...] in the packed rows' order
    return out.view(B, T, *out.shape[1:])
