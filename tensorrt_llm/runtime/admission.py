"""Whether a request may be queued: every check made before it reaches the scheduler.

An `Admission` holds only what the checks read (the engine's limits, the step's token budget,
the KV pool's size), so it can be handed to another process: a front end that refuses bad
requests itself, before they travel to the engine, applies the same rules as the executor.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from .request import ModelLimits, Request, check_length, check_prompt, check_token_ids
from .word_lists import check_words


@dataclass(frozen=True)
class Admission:
    limits: ModelLimits
    max_num_tokens: int
    enable_chunked_context: bool
    tokens_per_block: int
    num_blocks: int

    def check(self, request: Request) -> None:
        """RequestError naming what is wrong; normalises the request's lists in place."""
        lim, s = self.limits, request.sampling
        if s.num_beams != 1:
            raise RequestError("the in-flight batching executor samples one sequence per request "
                               "(num_beams 1); beam search runs through ModelRunner.generate")
        request.prompt_token_ids = check_prompt(0, request.prompt_token_ids, lim)
        request.tokens = list(request.prompt_token_ids)
        n = request.prompt_len
        request.max_new_tokens = check_length(0, n, request.max_new_tokens, lim)
        check_token_ids("end_id", [s.end_id], lim)
        check_token_ids("pad_id", [s.pad_id], lim)
        check_token_ids("stop token id", request.stop_token_ids, lim)
        # The same rules as the static generate's lists, for this one request.
        # (per-request format: an empty word is refused, not read as "no words")
        request.stop_words = check_words([[list(w) for w in request.stop_words]], 1, lim.vocab_size,
                                         "stop_words")[0]
        request.bad_words = check_words([[list(w) for w in request.bad_words]], 1, lim.vocab_size,
                                        "bad_words", bans=True)[0]
        if not self.enable_chunked_context and n > self.max_num_tokens:
            raise RequestError(f"the prompt has {n} tokens, more than max_num_tokens "
                               f"{self.max_num_tokens} computed in one step; enable "
                               f"chunked context or raise max_num_tokens")
        # A new sequence's blocks (no reuse counted: the pool must hold the request alone).
        blocks = -(-(n + request.max_new_tokens) // self.tokens_per_block)
        if blocks > self.num_blocks:
            raise RequestError(f"prompt ({n} tokens) + max_new_tokens {request.max_new_tokens} needs "
                               f"{blocks} KV-cache blocks; the whole pool has {self.num_blocks} "
                               f"(raise kv_cache_free_gpu_mem_fraction / max_tokens_in_paged_kv_cache)")
        if request.top_logprobs < 0 or request.top_logprobs > lim.vocab_size:
            raise RequestError(f"top_logprobs must be in [0, {lim.vocab_size}], got {request.top_logprobs}")
