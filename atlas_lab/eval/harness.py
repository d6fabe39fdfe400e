"""lm-evaluation-harness model ``atlas-lab``: a checkpoint of ``atlas-lab fit`` scored on the harness's tasks.

``import atlas_lab.eval`` registers it; then ``lm_eval.simple_evaluate(model="atlas-lab",
model_args="checkpoint=PATH", tasks=[...])``. Model arguments: checkpoint (required), batch_size (default 8),
device (default cuda where available, else cpu), max_length (the window read per call; default the training
length T).

Every request reads its tokens through the model's streaming state in windows of max_length, so a context or a
document of any length is scored whole, never truncated: each token is predicted from its entire prefix, once.
A text starts after the prefix token: the tokenizer's end-of-document token, or <pad> where the data has none (the
LM data's byte and BPE tokenizers), as the harness conditions an empty context on its model's BOS/EOS token.
"""
from __future__ import annotations

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from .checkpoint import Checkpoint, EvalError
from .scores import token_scores

GENERATION_OPTIONS = ("until", "max_gen_toks", "do_sample", "temperature")
GENERATION_STEP = 16  # tokens generated between two looks for a stop string


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvalError(f"{name}: expected an int >= 1, got {value!r}")
    return value


@register_model("atlas-lab")
class AtlasLM(TemplateLM):
    """The harness's LM contract (``TemplateLM``: the harness splits context and continuation into tokens) for a
    checkpoint: loglikelihood, loglikelihood_rolling and generate_until, batched and read in windows."""

    def __init__(self, checkpoint: str, batch_size: int = 8, device: str | None = None,
                 max_length: int | None = None):
        super().__init__()
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.checkpoint = Checkpoint.load(checkpoint, device)
        self.model, self.tokenizer = self.checkpoint.model, self.checkpoint.tokenizer
        self.batch_size = _positive_int("batch_size", batch_size)
        self.max_length = _positive_int("max_length", max_length or self.checkpoint.seq_len)
        self._device = device

    @property
    def eot_token_id(self) -> int:
        """The prefix token: end of document where the tokenizer has one, else <pad>."""
        return self.tokenizer.eos_id if self.tokenizer.eos_id is not None else self.tokenizer.pad_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def score(self, sequences: list[list[int]], scored: list[int]) -> list[tuple[float, bool]]:
        """For each token sequence, the sum of log p(x_t | x_<t) over its last ``scored`` tokens and whether each of
        them is the greedy choice. Longest first, ``batch_size`` at a time, right-padded (the model is causal: the
        padding after a sequence never reaches its scores)."""
        results = [(0.0, True)] * len(sequences)
        order = sorted((i for i in range(len(sequences)) if scored[i] > 0), key=lambda i: -len(sequences[i]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            length = len(sequences[batch[0]])
            ids = torch.full((len(batch), length), self.tokenizer.pad_id, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
            ids = ids.to(self._device)
            log_probs, greedy = token_scores(self.model, ids[:, :-1], ids[:, 1:], self.max_length)
            for row, i in enumerate(batch):
                end = len(sequences[i]) - 1
                first = end - scored[i]
                results[i] = (log_probs[row, first:end].sum().item(), bool(greedy[row, first:end].all()))
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context tokens, continuation tokens) -> (log p(continuation |
        context), whether greedy decoding gives the continuation)."""
        results = self.score([context + continuation for _, context, continuation in requests],
                             [len(continuation) for _, _, continuation in requests])
        for (key, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(document) = Σ_t log p(x_t | prefix token, x_<t): every token of the document scored once, from the
        whole document before it (the streaming state carried across windows)."""
        documents = [self.tok_encode(request.args[0]) for request in requests]
        results = self.score([[self.prefix_token_id] + d for d in documents], [len(d) for d in documents])
        for request, (log_prob, _) in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, log_prob)
        return [log_prob for log_prob, _ in results]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continue each context (greedy, or sampled at ``temperature`` with do_sample) until a stop string of
        ``until``, the end-of-document token or ``max_gen_toks`` tokens (default 256); the text before the stop.
        One request at a time: the streaming state reads a prompt whole, and left padding would enter it."""
        out = []
        for request in requests:
            context, options = request.args
            unknown = sorted(set(options) - set(GENERATION_OPTIONS))
            if unknown:
                raise EvalError(f"generate_until: unknown generation options {unknown}; atlas-lab takes "
                                f"{', '.join(GENERATION_OPTIONS)}")
            until = options.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            temperature = float(options.get("temperature", 0.0)) if options.get("do_sample", False) else 0.0
            text = self.generate(context, until, int(options.get("max_gen_toks", 256)), temperature)
            self.cache_hook.add_partial("generate_until", request.args, text)
            out.append(text)
        return out

    def generate(self, context: str, until: list[str], max_tokens: int, temperature: float) -> str:
        """The continuation of ``context`` up to its first stop string (or end-of-document token), read and generated
        through the streaming cache: the prompt in windows of max_length, then GENERATION_STEP tokens per call of
        LanguageModel.generate, each call continuing the cache of the one before."""
        prompt = torch.tensor([self.tok_encode(context) or [self.prefix_token_id]], device=self._device)
        cache = None
        for piece in prompt[:, :-1].split(self.max_length, 1):
            _, cache = self.model(piece, cache)
        last, tokens = prompt[:, -1:], []
        while len(tokens) < max_tokens:
            new, cache = self.model.generate(last, min(GENERATION_STEP, max_tokens - len(tokens)), temperature, cache)
            tokens += new[0].tolist()
            last = new[:, -1:]
            if self.tokenizer.eos_id in tokens or any(s in self.tokenizer.decode(tokens) for s in until):
                break
        if self.tokenizer.eos_id in tokens:
            tokens = tokens[:tokens.index(self.tokenizer.eos_id)]
        text = self.tokenizer.decode(tokens)
        return text[:min([text.index(s) for s in until if s in text], default=len(text))]
