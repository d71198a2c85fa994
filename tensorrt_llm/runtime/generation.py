"""The generation loop over a Session: context step, then one decode step per token.

Sequences are packed (no padding compute): a step's tokens of all running sequences are
concatenated, and a sequence leaves the batch as soon as it ends. Static batching is the
special case of this loop where every request arrives at once.
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from ..errors import RequestError
from . import beam_search
from .cuda_graph import CudaGraphDecoder
from .kv_cache_manager import KVCacheManager
from .sampling import SamplingConfig, choose, make_generator, process_logits
from .session import Session
from .word_lists import WordLists


@dataclass
class ModelLimits:
    """What the engine was built for; every request is checked against it before work."""
    vocab_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int = 1


class GenerationSession:

    def __init__(self, session: Session, limits: ModelLimits, kv_cache: KVCacheManager,
                 kv_cache_pool: torch.Tensor, cuda_graphs: Optional[CudaGraphDecoder] = None):
        self.session = session
        self.cuda_graphs = cuda_graphs
        self.limits = limits
        self.kv_cache = kv_cache
        self.kv_cache_pool = kv_cache_pool
        self.device = session.device

    def check_request(self, batch_input_ids, max_new_tokens, sampling: SamplingConfig,
                      stop_words_list=None, bad_words_list=None
                      ) -> tuple[list[torch.Tensor], Optional[WordLists], Optional[WordLists]]:
        """Every check of a request, before any work: returns (the prompts as 1-D int32 CPU
        tensors, the parsed stop words, the parsed bad words) or raises RequestError.

        batch_input_ids: a list of prompts, each a 1-D sequence of token ids (a list of
        Python ints, or an integer torch tensor or numpy array), or one 2-D integer tensor /
        array [batch, tokens] whose rows are taken whole as the prompts (no padding is
        removed: pass a list for prompts of different lengths). Ids are checked as integers
        in [0, vocab_size) before they are cast to int32; floats, bools, 0-D and 2-D prompts
        are refused.
        """
        lim = self.limits
        if not _is_integer(max_new_tokens) or max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1 and an integer, got {max_new_tokens!r}")
        max_new_tokens = int(max_new_tokens)
        if sampling.num_beams > lim.max_beam_width:
            raise RequestError(f"num_beams {sampling.num_beams} exceeds the engine's max_beam_width "
                               f"{lim.max_beam_width}; rebuild with a larger --max_beam_width")
        for name in ("end_id", "pad_id"):
            value = getattr(sampling, name)
            if value is not None and not 0 <= value < lim.vocab_size:
                raise RequestError(f"{name} {value} is outside the vocabulary [0, {lim.vocab_size})")
        prompts = _batch(batch_input_ids)
        if not prompts:
            raise RequestError("batch_input_ids is empty")
        total = 0
        for i, ids in enumerate(prompts):
            ids, n, lo, hi = _prompt_ids(i, ids)
            if len(prompts) > lim.max_batch_size:
                # Said after the first prompt's form: [1, 2, 3] is one prompt too few brackets.
                raise RequestError(f"{len(prompts)} prompts exceed the engine's max_batch_size "
                                   f"{lim.max_batch_size}; rebuild with a larger --max_batch_size")
            total += n
            if n == 0:
                raise RequestError(f"prompt {i} is empty")
            if n > lim.max_input_len:
                raise RequestError(f"prompt {i} has {n} tokens, more than the engine's max_input_len "
                                   f"{lim.max_input_len}; rebuild with a larger --max_input_len")
            if n + max_new_tokens > lim.max_seq_len:
                raise RequestError(f"prompt {i} ({n} tokens) + max_new_tokens {max_new_tokens} exceeds "
                                   f"the engine's max_seq_len {lim.max_seq_len}")
            if lo < 0 or hi >= lim.vocab_size:
                bad = lo if lo < 0 else hi
                raise RequestError(f"prompt {i} holds token id {bad}, outside the vocabulary "
                                   f"[0, {lim.vocab_size})")
            # In range, so the cast to int32 is exact.
            prompts[i] = _as_int32(ids)
        if total > lim.max_num_tokens:
            raise RequestError(f"the prompts hold {total} tokens, more than the engine's max_num_tokens "
                               f"{lim.max_num_tokens}; send fewer prompts at once or rebuild")
        B, V = len(prompts), lim.vocab_size
        # The loop checks stop words on the host, where the output is; beam search on the
        # device, where its candidates are.
        stop = WordLists.parse(stop_words_list, B, V, "stop_words_list",
                               self.device if sampling.num_beams > 1 else "cpu")
        bad = WordLists.parse(bad_words_list, B, V, "bad_words_list", self.device, bans=True)
        return prompts, stop, bad

    def generate(self, batch_input_ids, sampling: SamplingConfig,
                 max_new_tokens: int, output_generation_logits: bool = False,
                 return_context_logits: bool = False, stop_words_list=None, bad_words_list=None,
                 output_log_probs: bool = False, output_cum_log_probs: bool = False
                 ) -> Iterator[dict]:
        """An iterator over the state after every step; the last item is the final result.

        The request is checked when this is called (check_request says what
        batch_input_ids may be), not when the iterator is first read.
        stop_words_list / bad_words_list: see word_lists.py. output_log_probs adds
        `log_probs` [B, beams, max_new_tokens]: the log-probability of each generated token
        under the processed logits (penalties, min_length, bad words; before temperature,
        top-k and top-p), 0 past a sequence's end; output_cum_log_probs adds their sums,
        `cum_log_probs` [B, beams]. Beam search (sampling.num_beams > 1) is beam_search.py.
        """
        batch_input_ids, stop, bad = self.check_request(batch_input_ids, max_new_tokens, sampling,
                                                        stop_words_list, bad_words_list)
        max_new_tokens = int(max_new_tokens)
        outputs = dict(log_probs=output_log_probs, cum_log_probs=output_cum_log_probs)
        if sampling.num_beams > 1:
            if output_generation_logits:
                raise RequestError("output_generation_logits is not available with beam search")
            return beam_search.generate(self, batch_input_ids, sampling, max_new_tokens,
                                        return_context_logits, stop, bad, outputs)
        return self._generate(batch_input_ids, sampling, max_new_tokens, output_generation_logits,
                              return_context_logits, stop, bad, outputs)

    def _generate(self, batch_input_ids, sampling, max_new_tokens, output_generation_logits,
                  return_context_logits, stop, bad, outputs) -> Iterator[dict]:
        B = len(batch_input_ids)
        prompt_lens = [ids.numel() for ids in batch_input_ids]
        seq_ids = list(range(B))
        # Reserve every block a request can need now, so a request never fails half-way
        # and never takes blocks from another.
        reserved = []
        try:
            for s, n in zip(seq_ids, prompt_lens):
                self.kv_cache.add_sequence(s, n + max_new_tokens)
                reserved.append(s)
            yield from self._run(batch_input_ids, prompt_lens, sampling, max_new_tokens,
                                 output_generation_logits, return_context_logits, stop, bad,
                                 outputs)
        finally:
            for s in reserved:
                self.kv_cache.free_sequence(s)

    def context_step(self, batch_input_ids: list[torch.Tensor], block_tables: torch.Tensor,
                     return_context_logits: bool):
        """Run the prompts (packed). Returns (logits of each prompt's last token [B, V],
        each prompt's logits when return_context_logits else None)."""
        dev = self.device
        prompt_lens = [ids.numel() for ids in batch_input_ids]
        lens = torch.tensor(prompt_lens, dtype=torch.int32)
        ends = torch.cumsum(lens.to(torch.int64), 0)
        if return_context_logits:
            wanted = torch.arange(int(ends[-1]), dtype=torch.int64)
        else:
            wanted = ends - 1
        feed = {
            "input_ids": torch.cat(batch_input_ids).to(dev),
            "position_ids": torch.cat([torch.arange(n, dtype=torch.int32) for n in prompt_lens]).to(dev),
            "last_token_ids": wanted.to(dev),
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": block_tables,
            "sequence_lengths": lens.to(dev),
            "context_lengths": lens.to(dev),
            "host_context_lengths": lens,
            "host_sequence_lengths": lens,
        }
        logits = self.session.run(feed)["logits"]
        if not return_context_logits:
            return logits, None
        return logits[(ends - 1).to(logits.device)], list(torch.split(logits, prompt_lens))

    def _run(self, batch_input_ids, prompt_lens, sampling, max_new_tokens,
             output_generation_logits, return_context_logits, stop, bad, outputs):
        dev = self.device
        B = len(batch_input_ids)
        block_tables = self.kv_cache.get_block_table(list(range(B))).to(dev)
        generator = make_generator(sampling.random_seed, dev)
        logits, context_logits = self.context_step(batch_input_ids, block_tables,
                                                   return_context_logits)
        lens = torch.tensor(prompt_lens, dtype=torch.int32)

        width = max(prompt_lens) + max_new_tokens
        pad = sampling.pad_id if sampling.pad_id is not None else 0
        output_ids = torch.full((B, 1, width), pad, dtype=torch.int32)
        for b, ids in enumerate(batch_input_ids):
            output_ids[b, 0, :prompt_lens[b]] = ids
        seq_lens = lens.clone()           # host: tokens of each sequence so far
        lens_dev = lens.to(dev, copy=True)  # device: the same, for the rows still running
        gen_logits = [] if output_generation_logits else None
        # Penalties, min_length and bad words read every row's tokens so far from a device copy.
        history = output_ids[:, 0].to(dev) if _needs_history(sampling) or bad else None
        log_probs = torch.zeros(B, max_new_tokens, device=dev) if any(outputs.values()) else None
        active = torch.arange(B)  # rows of the batch still generating
        # Its device copy, changed only when rows leave: a host-to-device copy every step
        # would wait for the step in flight and undo the overlap below.
        active_dev = active.to(dev)
        host_tokens = torch.empty(B, dtype=torch.int32, pin_memory=dev.type == "cuda")
        copied = torch.cuda.Event() if dev.type == "cuda" else None

        for step in range(max_new_tokens):
            n = active.numel()
            if gen_logits is not None:
                full = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=logits.device)
                full[active.to(logits.device)] = logits
                gen_logits.append(full)
            rows = active_dev
            if history is not None:
                seen = history[rows]
                logits = process_logits(logits, sampling, token_ids=seen,
                                        context_lengths=lens[active],
                                        sequence_lengths=seq_lens[active])
                if bad is not None:
                    logits = bad.ban(logits, seen, seq_lens[active], rows)
            else:
                logits = process_logits(logits, sampling)
            tokens = choose(logits, sampling, generator)
            if log_probs is not None:
                log_probs[rows, step] = torch.log_softmax(logits, dim=-1).gather(
                    1, tokens.long().unsqueeze(1)).squeeze(1)
            host_tokens[:n].copy_(tokens, non_blocking=True)
            if copied is not None:
                copied.record()
            # The next step is launched before this one's tokens reach the host, so the GPU
            # computes while the host does the bookkeeping. A row that turns out to have
            # ended is dropped from the step after; its extra K/V row stays inside the blocks
            # reserved for it (positions < prompt + max_new_tokens).
            more = step + 1 < max_new_tokens
            if more:
                lens_dev += 1
                next_logits = self._decode_step(tokens, lens_dev, block_tables, active_dev, B)
            if copied is not None:
                copied.synchronize()
            new = host_tokens[:n]
            output_ids[active, 0, seq_lens[active].long()] = new
            seq_lens[active] += 1
            if history is not None:
                history[rows, (seq_lens[active] - 1).to(dev)] = tokens
            yield self._result(output_ids, seq_lens, gen_logits, context_logits, done=False)
            if not more:
                break
            logits = next_logits
            going = torch.ones(n, dtype=torch.bool)
            if sampling.end_id is not None:
                going &= new != sampling.end_id
            if stop is not None:
                going &= ~stop.stopped(output_ids[active, 0], seq_lens[active], active)
            if not bool(going.all()):
                kept = going.nonzero().squeeze(1)
                if kept.numel() == 0:
                    break
                active = active[kept]
                kept_dev = kept.to(dev)
                active_dev = active_dev[kept_dev]
                logits, lens_dev = logits[kept_dev], lens_dev[kept_dev]

        result = self._result(output_ids, seq_lens, gen_logits, context_logits, done=True)
        if log_probs is not None:
            add_log_probs(result, log_probs.unsqueeze(1).cpu(), outputs)
        yield result

    def _decode_step(self, tokens: torch.Tensor, lengths: torch.Tensor, block_tables: torch.Tensor,
                     active: torch.Tensor, batch: int) -> torch.Tensor:
        """Logits of one decode step: `tokens` (device) of the `active` rows (a device
        tensor), whose sequences hold `lengths` tokens once these are added."""
        n = active.numel()
        tables = block_tables if n == batch else block_tables[active]
        if self.cuda_graphs is not None:
            return self.cuda_graphs.step(tokens, lengths, tables)
        return self.decode_step(tokens, lengths, tables)

    def decode_step(self, tokens: torch.Tensor, lengths: torch.Tensor,
                    block_tables: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] of one decode step without CUDA graphs: `tokens` [n] (device) of
        sequences holding `lengths` [n] tokens once these are added, in `block_tables`."""
        n = tokens.numel()
        dev = self.device
        ones = torch.ones(n, dtype=torch.int32)
        feed = {
            "input_ids": tokens,
            "position_ids": lengths - 1,
            "last_token_ids": torch.arange(n, dtype=torch.int64, device=dev),
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": block_tables,
            "sequence_lengths": lengths.clone(),
            "context_lengths": ones.to(dev),
            "host_context_lengths": ones,
            # Only context-phase paths read it; a decode step's lengths stay on the device.
            "host_sequence_lengths": ones,
        }
        return self.session.run(feed, check=False)["logits"]

    @staticmethod
    def _result(output_ids, seq_lens, gen_logits, context_logits, done):
        out = {"output_ids": output_ids, "sequence_lengths": seq_lens.reshape(-1, 1).clone(),
               "done": done}
        if gen_logits is not None and done:
            out["generation_logits"] = torch.stack(gen_logits, dim=1).unsqueeze(1) if gen_logits \
                else None
        if context_logits is not None:
            out["context_logits"] = context_logits
        return out


def _is_integer(value) -> bool:
    """A Python or numpy integer; not a bool, a float or a string."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _batch(batch_input_ids) -> list:
    """The prompts of a request: a list's items, or the rows of one 2-D tensor / array."""
    if isinstance(batch_input_ids, (torch.Tensor, np.ndarray)):
        shape = list(batch_input_ids.shape)
        if len(shape) == 2:
            return list(batch_input_ids)
        raise RequestError(f"batch_input_ids is a tensor of shape {shape}: pass a list of 1-D "
                           f"prompts or one 2-D [batch, tokens] tensor")
    if isinstance(batch_input_ids, (str, bytes, dict)) or not isinstance(batch_input_ids, Iterable):
        raise RequestError(f"batch_input_ids must be a list of prompts (token-id lists or 1-D "
                           f"tensors), got {type(batch_input_ids).__name__}")
    return list(batch_input_ids)


def _prompt_ids(i: int, ids) -> tuple[object, int, int, int]:
    """(ids, n, lo, hi): prompt i's ids as given (a 1-D integer tensor, array or list of
    ints, not yet cast, so nothing has wrapped), its length and its smallest and largest id
    (0, -1 when empty). RequestError naming prompt i for anything but a 1-D sequence of
    integers."""
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        if not _integer_dtype(ids):
            kind = "numpy array" if isinstance(ids, np.ndarray) else "tensor"
            dtype = str(ids.dtype).removeprefix("torch.")
            raise RequestError(f"prompt {i} is a {dtype} {kind}; token ids must be integers")
        _check_1d(i, list(ids.shape))
        if isinstance(ids, torch.Tensor):
            ids = ids.detach()
        n = int(ids.shape[0])
        if n == 0:
            return ids, 0, 0, -1
        return ids, n, int(ids.min()), int(ids.max())
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        if _is_integer(ids):
            _check_1d(i, [])
        raise RequestError(f"prompt {i} must be a 1-D sequence of token ids, got "
                           f"{type(ids).__name__}")
    ids = list(ids)
    for pos, t in enumerate(ids):
        if isinstance(t, (torch.Tensor, np.ndarray)) and t.ndim == 0 and _integer_dtype(t):
            ids[pos] = t = int(t)
        if isinstance(t, (Sequence, torch.Tensor, np.ndarray)) and not isinstance(t, (str, bytes)):
            _check_1d(i, [len(ids), len(t)] if isinstance(t, Sequence) else [len(ids), *t.shape])
        if not _is_integer(t):
            raise RequestError(f"prompt {i} holds {t!r} ({type(t).__name__}) at position {pos}; "
                               f"token ids must be integers")
    if not ids:
        return ids, 0, 0, -1
    return ids, len(ids), int(min(ids)), int(max(ids))


def _as_int32(ids) -> torch.Tensor:
    """A prompt checked by _prompt_ids, its ids within int32: a 1-D int32 CPU tensor."""
    if isinstance(ids, torch.Tensor):
        return ids.to("cpu", torch.int32).contiguous()
    if isinstance(ids, np.ndarray):
        return torch.from_numpy(ids.astype(np.int32))
    return torch.tensor([int(t) for t in ids], dtype=torch.int32)


def _integer_dtype(t) -> bool:
    if isinstance(t, np.ndarray):
        return t.dtype.kind in "iu"
    return not (t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex)


def _check_1d(i: int, shape: list) -> None:
    if len(shape) == 0:
        raise RequestError(f"prompt {i} is a single token id, not a sequence: batch_input_ids is a "
                           f"list of prompts, e.g. [[1, 2, 3]]")
    if len(shape) != 1:
        raise RequestError(f"prompt {i} has shape {shape}: each prompt must be a 1-D sequence of "
                           f"token ids; pass a 2-D tensor [batch, tokens] as batch_input_ids "
                           f"itself for a batch of equal-length prompts")


def add_log_probs(result: dict, log_probs: torch.Tensor, outputs: dict) -> None:
    """Put the asked-for `log_probs` [B, beams, new_tokens] (0 past each end) and their sums
    `cum_log_probs` [B, beams] into a result."""
    if outputs["log_probs"]:
        result["log_probs"] = log_probs
    if outputs["cum_log_probs"]:
        result["cum_log_probs"] = log_probs.sum(dim=-1)


def _needs_history(s: SamplingConfig) -> bool:
    return (s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
            or s.min_length > 0)
