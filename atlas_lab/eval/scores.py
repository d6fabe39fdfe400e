"""Next-token scores of a language model read through its streaming state, window by window."""
from __future__ import annotations

import torch

from ..models import LanguageModel


@torch.no_grad()
def token_scores(model: LanguageModel, input_ids: torch.Tensor, targets: torch.Tensor, window: int):
    """log p(targets[b, t] | input_ids[b, :t+1]) [B, L] and whether targets[b, t] is the most likely token [B, L].

    input_ids, targets: [B, L]. The input is read in windows of ``window`` tokens with the streaming cache carried
    from one to the next, so every position sees its whole prefix (the same scores as one call over all L tokens)
    with the state of a fixed-size model, whatever L.
    """
    log_probs, greedy = [], []
    for h, target in zip(model.hidden_pieces(input_ids, window), targets.split(window, 1)):
        logits = model.head(h).float()
        log_probs.append(logits.log_softmax(-1).gather(-1, target[..., None])[..., 0])
        greedy.append(logits.argmax(-1) == target)
    return torch.cat(log_probs, 1), torch.cat(greedy, 1)
