"""The generation loop over a Session: context step, then one decode step per token.

Sequences are packed (no padding compute): a step's tokens of all running sequences are
concatenated, and a sequence leaves the batch as soon as it ends. Static batching is the
special case of this loop where every request arrives at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from .cuda_graph import CudaGraphDecoder
from .kv_cache_manager import KVCacheManager
from .sampling import SamplingConfig, make_generator, sample
from .session import Session


@dataclass
class ModelLimits:
    """What the engine was built for; every request is checked against it before work."""
    vocab_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int


class GenerationSession:

    def __init__(self, session: Session, limits: ModelLimits, kv_cache: KVCacheManager,
                 kv_cache_pool: torch.Tensor, cuda_graphs: Optional[CudaGraphDecoder] = None):
        self.session = session
        self.cuda_graphs = cuda_graphs
        self.limits = limits
        self.kv_cache = kv_cache
        self.kv_cache_pool = kv_cache_pool
        self.device = session.device

    def check_request(self, batch_input_ids: list[torch.Tensor], max_new_tokens: int) -> None:
        lim = self.limits
        if not batch_input_ids:
            raise ValueError("batch_input_ids is empty")
        if len(batch_input_ids) > lim.max_batch_size:
            raise ValueError(f"{len(batch_input_ids)} prompts exceed the engine's max_batch_size "
                             f"{lim.max_batch_size}; rebuild with a larger --max_batch_size")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        total = 0
        for i, ids in enumerate(batch_input_ids):
            n = ids.numel()
            total += n
            if n == 0:
                raise ValueError(f"prompt {i} is empty")
            if n > lim.max_input_len:
                raise ValueError(f"prompt {i} has {n} tokens, more than the engine's max_input_len "
                                 f"{lim.max_input_len}; rebuild with a larger --max_input_len")
            if n + max_new_tokens > lim.max_seq_len:
                raise ValueError(f"prompt {i} ({n} tokens) + max_new_tokens {max_new_tokens} exceeds "
                                 f"the engine's max_seq_len {lim.max_seq_len}")
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= lim.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"prompt {i} holds token id {bad}, outside the vocabulary "
                                 f"[0, {lim.vocab_size})")
        if total > lim.max_num_tokens:
            raise ValueError(f"the prompts hold {total} tokens, more than the engine's max_num_tokens "
                             f"{lim.max_num_tokens}; send fewer prompts at once or rebuild")

    def generate(self, batch_input_ids: list[torch.Tensor], sampling: SamplingConfig,
                 max_new_tokens: int, output_generation_logits: bool = False,
                 return_context_logits: bool = False) -> Iterator[dict]:
        """Yield the state after every step; the last item is the final result."""
        batch_input_ids = [torch.as_tensor(ids, dtype=torch.int32).reshape(-1).cpu()
                           for ids in batch_input_ids]
        self.check_request(batch_input_ids, max_new_tokens)
        prompt_lens = [ids.numel() for ids in batch_input_ids]
        B = len(batch_input_ids)
        seq_ids = list(range(B))
        # Reserve every block a request can need now, so a request never fails half-way
        # and never takes blocks from another.
        reserved = []
        try:
            for s, n in zip(seq_ids, prompt_lens):
                self.kv_cache.add_sequence(s, n + max_new_tokens)
                reserved.append(s)
            yield from self._run(batch_input_ids, prompt_lens, sampling, max_new_tokens,
                                 output_generation_logits, return_context_logits)
        finally:
            for s in reserved:
                self.kv_cache.free_sequence(s)

    def _run(self, batch_input_ids, prompt_lens, sampling, max_new_tokens,
             output_generation_logits, return_context_logits):
        dev = self.device
        B = len(batch_input_ids)
        block_tables = self.kv_cache.get_block_table(list(range(B))).to(dev)
        generator = make_generator(sampling.random_seed, dev)

        lens = torch.tensor(prompt_lens, dtype=torch.int32)
        packed = torch.cat(batch_input_ids)
        ends = torch.cumsum(lens.to(torch.int64), 0)
        if return_context_logits:
            wanted = torch.arange(int(ends[-1]), dtype=torch.int64)
        else:
            wanted = ends - 1
        feed = {
            "input_ids": packed.to(dev),
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
        context_logits = None
        if return_context_logits:
            context_logits = list(torch.split(logits, prompt_lens))
            logits = logits[(ends - 1).to(logits.device)]

        width = max(prompt_lens) + max_new_tokens
        pad = sampling.pad_id if sampling.pad_id is not None else 0
        output_ids = torch.full((B, 1, width), pad, dtype=torch.int32)
        for b, ids in enumerate(batch_input_ids):
            output_ids[b, 0, :prompt_lens[b]] = ids
        seq_lens = lens.clone()           # host: tokens of each sequence so far
        lens_dev = lens.to(dev, copy=True)  # device: the same, for the rows still running
        gen_logits = [] if output_generation_logits else None
        # Penalties and min_length read every row's tokens so far from a device copy.
        history = output_ids[:, 0].to(dev) if _needs_history(sampling) else None
        active = torch.arange(B)  # rows of the batch still generating
        host_tokens = torch.empty(B, dtype=torch.int32, pin_memory=dev.type == "cuda")
        copied = torch.cuda.Event() if dev.type == "cuda" else None

        for step in range(max_new_tokens):
            n = active.numel()
            if gen_logits is not None:
                full = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=logits.device)
                full[active.to(logits.device)] = logits
                gen_logits.append(full)
            if history is not None:
                tokens = sample(logits, sampling, generator, token_ids=history[active],
                                context_lengths=lens[active], sequence_lengths=seq_lens[active])
            else:
                tokens = sample(logits, sampling, generator)
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
                next_logits = self._decode_step(tokens, lens_dev, block_tables, active, B)
            if copied is not None:
                copied.synchronize()
            new = host_tokens[:n]
            output_ids[active, 0, seq_lens[active].long()] = new
            seq_lens[active] += 1
            if history is not None:
                history[active.to(dev), (seq_lens[active] - 1).to(dev)] = tokens
            yield self._result(output_ids, seq_lens, gen_logits, context_logits, done=False)
            if not more:
                break
            logits = next_logits
            if sampling.end_id is not None:
                going = new != sampling.end_id
                if not bool(going.all()):
                    rows = going.nonzero().squeeze(1)
                    if rows.numel() == 0:
                        break
                    active = active[rows]
                    rows_dev = rows.to(dev)
                    logits, lens_dev = logits[rows_dev], lens_dev[rows_dev]

        yield self._result(output_ids, seq_lens, gen_logits, context_logits, done=True)

    def _decode_step(self, tokens: torch.Tensor, lengths: torch.Tensor, block_tables: torch.Tensor,
                     active: torch.Tensor, batch: int) -> torch.Tensor:
        """Logits of one decode step: `tokens` (device) of the `active` rows, whose sequences
        hold `lengths` tokens once these are added."""
        n = active.numel()
        dev = self.device
        tables = block_tables if n == batch else block_tables[active.to(dev)]
        if self.cuda_graphs is not None:
            return self.cuda_graphs.step(tokens, lengths, tables)
        ones = torch.ones(n, dtype=torch.int32)
        feed = {
            "input_ids": tokens,
            "position_ids": lengths - 1,
            "last_token_ids": torch.arange(n, dtype=torch.int64, device=dev),
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": tables,
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


def _needs_history(s: SamplingConfig) -> bool:
    return (s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
            or s.min_length > 0)
