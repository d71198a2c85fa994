"""Static generation: a batch of prompts in, one result out, as a client of the executor.

`GenerationSession.generate` checks the whole batch, submits one executor request per
prompt (same parameters, each its own seed stream), steps the executor until all are done
and assembles the rows into the `[batch, beams, tokens]` tensors ModelRunner returns.
Beam search (num_beams > 1) drives the step runner itself (beam_search.py).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import torch

from ..errors import RequestError
from . import beam_search
from .executor import Executor
from .request import Request, _batch, check_length, check_prompt, check_token_ids
from .sampler import mix_seed
from .sampling import SamplingConfig
from .word_lists import WordLists, check_words


class GenerationSession:

    def __init__(self, executor: Executor):
        self.executor = executor
        self.runner = executor.runner
        self.limits = executor.limits
        self.kv_cache = executor.kv_cache
        self.device = executor.device

    def check_request(self, batch_input_ids, max_new_tokens, sampling: SamplingConfig,
                      stop_words_list=None, bad_words_list=None
                      ) -> tuple[list[list[int]], list[list[list[int]]], list[list[list[int]]]]:
        """Every check of a request, before any work: returns (the prompts as lists of ints,
        each prompt's stop words, each prompt's bad words) or raises RequestError.

        batch_input_ids: a list of prompts, each a 1-D sequence of token ids (a list of
        Python ints, or an integer torch tensor or numpy array), or one 2-D integer tensor /
        array [batch, tokens] whose rows are taken whole as the prompts (no padding is
        removed: pass a list for prompts of different lengths). Ids are checked as integers
        in [0, vocab_size) before they are cast; floats, bools, 0-D and 2-D prompts are
        refused. Prompts over the step's token budget are spread over several steps.
        """
        lim = self.limits
        check_length(0, 0, max_new_tokens, lim)
        if sampling.num_beams > lim.max_beam_width:
            raise RequestError(f"num_beams {sampling.num_beams} exceeds the engine's max_beam_width "
                               f"{lim.max_beam_width}; rebuild with a larger --max_beam_width")
        check_token_ids("end_id", [sampling.end_id], lim)
        check_token_ids("pad_id", [sampling.pad_id], lim)
        prompts = _batch(batch_input_ids)
        if not prompts:
            raise RequestError("batch_input_ids is empty")
        for i, ids in enumerate(prompts):
            prompts[i] = check_prompt(i, ids, lim)
            if len(prompts) > lim.max_batch_size:
                # Said after the first prompt's form: [1, 2, 3] is one prompt too few brackets.
                raise RequestError(f"{len(prompts)} prompts exceed the engine's max_batch_size "
                                   f"{lim.max_batch_size}; rebuild with a larger --max_batch_size")
            check_length(i, len(prompts[i]), max_new_tokens, lim)
        B, V = len(prompts), lim.vocab_size
        stop = check_words(stop_words_list, B, V, "stop_words_list")
        bad = check_words(bad_words_list, B, V, "bad_words_list", bans=True)
        return prompts, stop, bad

    def generate(self, batch_input_ids, sampling: SamplingConfig,
                 max_new_tokens: int, output_generation_logits: bool = False,
                 return_context_logits: bool = False, stop_words_list=None, bad_words_list=None,
                 output_log_probs: bool = False, output_cum_log_probs: bool = False,
                 every_step: bool = True) -> Iterator[dict]:
        """An iterator over the state after every step; the last item is the final result
        (with every_step=False the final result alone: a batch of hundreds of rows would
        otherwise assemble its whole output on the host at every step).

        The request is checked when this is called (check_request says what
        batch_input_ids may be), not when the iterator is first read.
        stop_words_list / bad_words_list: see word_lists.py. output_log_probs adds
        `log_probs` [B, beams, max_new_tokens]: the log-probability of each generated token
        under the processed logits (penalties, min_length, bad words; before temperature,
        top-k and top-p), 0 past a sequence's end; output_cum_log_probs adds their sums,
        `cum_log_probs` [B, beams]. Beam search (sampling.num_beams > 1) is beam_search.py.
        """
        prompts, stop, bad = self.check_request(batch_input_ids, max_new_tokens, sampling,
                                                stop_words_list, bad_words_list)
        max_new_tokens = int(max_new_tokens)
        outputs = dict(log_probs=output_log_probs, cum_log_probs=output_cum_log_probs)
        if sampling.num_beams > 1:
            if output_generation_logits:
                raise RequestError("output_generation_logits is not available with beam search")
            B, V = len(prompts), self.limits.vocab_size
            stop_lists = WordLists.parse(stop, B, V, "stop_words_list", self.device) if any(stop) else None
            bad_lists = WordLists.parse(bad, B, V, "bad_words_list", self.device) if any(bad) else None
            tensors = [torch.tensor(p, dtype=torch.int32) for p in prompts]
            return beam_search.generate(self, tensors, sampling, max_new_tokens,
                                        return_context_logits, stop_lists, bad_lists, outputs)
        requests = []
        for i, (ids, stop_words, bad_words) in enumerate(zip(prompts, stop, bad)):
            # Each row its own seed stream, so that rows with one prompt differ.
            seed = None if sampling.random_seed is None else mix_seed(sampling.random_seed, i)
            requests.append(Request(ids, dataclasses.replace(sampling, random_seed=seed), max_new_tokens,
                                    stop_words=stop_words, bad_words=bad_words,
                                    logprobs=any(outputs.values()),
                                    return_context_logits=return_context_logits,
                                    return_generation_logits=output_generation_logits))
        for r in requests:
            self.executor.check(r)
        return self._run(requests, sampling, max_new_tokens, outputs, every_step)

    def _run(self, requests: list[Request], sampling: SamplingConfig, max_new_tokens: int,
             outputs: dict, every_step: bool) -> Iterator[dict]:
        ex = self.executor
        try:
            for r in requests:
                ex.add_request(r)
            while not all(r.finished for r in requests):
                if ex.step() and every_step:
                    yield self._result(requests, sampling, max_new_tokens, outputs, done=False)
            yield self._result(requests, sampling, max_new_tokens, outputs, done=True)
        finally:  # a stream closed early: its requests leave the executor
            for r in requests:
                ex.abort(r.request_id)

    @staticmethod
    def _result(requests: list[Request], sampling: SamplingConfig, max_new_tokens: int,
                outputs: dict, done: bool) -> dict:
        B = len(requests)
        width = max(r.prompt_len for r in requests) + max_new_tokens
        output_ids = torch.full((B, 1, width), sampling.pad_id, dtype=torch.int32)
        lengths = torch.zeros(B, 1, dtype=torch.int32)
        for b, r in enumerate(requests):
            output_ids[b, 0, :len(r.tokens)] = torch.tensor(r.tokens, dtype=torch.int32)
            lengths[b, 0] = len(r.tokens)
        out = {"output_ids": output_ids, "sequence_lengths": lengths, "done": done}
        if requests[0].return_context_logits:
            out["context_logits"] = [r.context_logits[0] if r.context_logits else None for r in requests]
        if not done:
            return out
        if requests[0].return_generation_logits:
            steps = max(len(r.generation_logits) for r in requests)
            V = requests[0].generation_logits[0].shape[-1]
            gen = torch.zeros(B, 1, steps, V)
            for b, r in enumerate(requests):
                if r.generation_logits:
                    gen[b, 0, :len(r.generation_logits)] = torch.stack(r.generation_logits).cpu()
            out["generation_logits"] = gen
        if any(outputs.values()):
            log_probs = torch.zeros(B, 1, max_new_tokens)
            for b, r in enumerate(requests):
                log_probs[b, 0, :len(r.log_probs)] = torch.tensor(r.log_probs, dtype=torch.float32)
            add_log_probs(out, log_probs, outputs)
        return out


def add_log_probs(result: dict, log_probs: torch.Tensor, outputs: dict) -> None:
    """Put the asked-for `log_probs` [B, beams, new_tokens] (0 past each end) and their sums
    `cum_log_probs` [B, beams] into a result."""
    if outputs["log_probs"]:
        result["log_probs"] = log_probs
    if outputs["cum_log_probs"]:
        result["cum_log_probs"] = log_probs.sum(dim=-1)
