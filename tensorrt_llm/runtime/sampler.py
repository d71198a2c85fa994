"""The executor's sampler: one SamplingConfig per row, each request drawing its own numbers.

A row's random number is a hash of its request's seed and the index of the token drawn
(counter-based, as Philox is), so a request draws the same tokens whether it runs alone or
in any batch, and a seed repeats its output. Penalties and bad words read each row's
tokens so far; min_tokens only their counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .request import Request
from .sampling import choose, process_logits
from .word_lists import WordLists

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function: a bijection of uint64 that mixes every bit."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _stream(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """uint64: element `counter` of the stream of `seed`."""
    with np.errstate(over="ignore"):
        return _splitmix64(_splitmix64(seeds.astype(np.uint64))
                           + (counters.astype(np.uint64) + np.uint64(1)) * _GOLDEN)


def mix_seed(seed: int, index: int) -> int:
    """A seed for stream `index` derived from `seed` (rows of one static batch)."""
    return int(_stream(np.array([seed % 2**64], dtype=np.uint64), np.array([index]))[0])


def uniforms(seeds: np.ndarray, counters: np.ndarray) -> torch.Tensor:
    """float32 [R] in [0, 1): the top 24 bits of element `counter` of each seed's stream
    (24 bits are exact in float32, so the value is < 1)."""
    z = _stream(seeds, counters)
    return torch.from_numpy((z >> np.uint64(40)).astype(np.float32) / np.float32(2 ** 24))


@dataclass
class Sampled:
    tokens: torch.Tensor                        # int32 [R], on the logits' device
    log_probs: Optional[torch.Tensor] = None    # float32 [R]: the chosen tokens'
    top_ids: Optional[torch.Tensor] = None      # int64 [R, k]: the most likely tokens
    top_log_probs: Optional[torch.Tensor] = None


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


class Sampler:

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> Sampled:
        """The next token of each request from its row of `logits` [R, V]. The requests'
        token counts (num_tokens) are those before the new token."""
        device = logits.device
        configs = [r.sampling for r in requests]
        history = {}
        if any(_needs_counts(r) for r in requests):
            history = self._history(requests, device)
        logits = process_logits(logits, configs, **{k: v for k, v in history.items() if k != "token_ids"
                                                    or _needs_values(requests)})
        if any(r.bad_words for r in requests):
            logits = self._ban(logits, requests, history, device)
        uniform = None
        if not all(c.is_greedy for c in configs):
            seeds = np.array([r.seed for r in requests], dtype=np.uint64)
            counters = np.array([r.num_generated for r in requests], dtype=np.int64)
            uniform = _to_device(uniforms(seeds, counters), device)
        tokens = choose(logits, configs, uniform)
        out = Sampled(tokens)
        if any(r.logprobs for r in requests):
            log_probs = torch.log_softmax(logits, dim=-1)
            out.log_probs = log_probs.gather(1, tokens.long().unsqueeze(1)).squeeze(1)
            k = max(r.top_logprobs for r in requests)
            if k:
                out.top_log_probs, out.top_ids = torch.topk(log_probs, min(k, logits.shape[1]), dim=-1)
        return out

    @staticmethod
    def _history(requests: list[Request], device) -> dict:
        """token_ids [R, S] (values; zeros where not needed), context and sequence lengths."""
        values = _needs_values(requests)
        width = max(r.num_tokens for r in requests) if values else 1
        ids = np.zeros((len(requests), width), dtype=np.int64)
        if values:
            for i, r in enumerate(requests):
                ids[i, :len(r.tokens)] = r.tokens
        lens = torch.tensor([r.num_tokens for r in requests], dtype=torch.int32)
        prompt = torch.tensor([r.prompt_len for r in requests], dtype=torch.int32)
        return {"token_ids": _to_device(torch.from_numpy(ids), device),
                "context_lengths": _to_device(prompt, device),
                "sequence_lengths": _to_device(lens, device)}

    def _ban(self, logits, requests, history, device) -> torch.Tensor:
        words = WordLists([r.bad_words for r in requests], device)
        rows = torch.arange(len(requests), device=device)
        return words.ban(logits, history["token_ids"], history["sequence_lengths"], rows)


def draws_the_argmax(r: Request) -> bool:
    """Whether `Sampler.sample` gives r the argmax of its logits as they are, and nothing more:
    greedy, with nothing that processes the logits (penalties, min_tokens, bad words) and no
    log-probs. Such a row's token may be taken with the step (DecodeGraphs.step_greedy)."""
    return r.sampling.is_greedy and not _needs_counts(r) and not r.logprobs


def _needs_values(requests: list[Request]) -> bool:
    return any(r.needs_token_values for r in requests)


def _needs_counts(r: Request) -> bool:
    return r.needs_token_values or r.sampling.min_length > 0 or bool(r.bad_words)
