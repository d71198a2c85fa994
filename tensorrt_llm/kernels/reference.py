"""Plain PyTorch oracles of the kernels that compute no op of their own: the in-place rotary
embedding, the paged K/V write, decode attention (parts of gpt_attention's CUDA
implementation) and top-k/top-p sampling (the sampler's).

They are the CPU implementation of those `trtllm::` ops, and what the kernels' tests compare
against. A kernel that computes an op (rms_norm, the gated activations, the GEMV) has the op's
reference, in tensorrt_llm/ops, as its meaning.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..ops.rotary import rotary_embedding_reference


def _check_positions(positions: torch.Tensor, max_positions: int) -> None:
    if positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= max_positions:
        raise ValueError(f"rotary_embedding: positions span [{lo}, {hi}] but cos_sin_cache has "
                         f"{max_positions} rows")


def rotary_embedding_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                      cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """The rotary_embedding op's reference (tensorrt_llm.ops.rotary), in place on q [T, Hq, D]
    and k [T, KV, D]: the form of the kernel. Out-of-range positions raise here (the CUDA
    kernel, which cannot raise without a sync, leaves those tokens unchanged)."""
    _check_positions(positions, cos_sin_cache.shape[0])
    table = cos_sin_cache.to(q.device)
    for x in (q, k):
        tokens, heads, head_dim = x.shape
        rotated = rotary_embedding_reference(x.reshape(tokens, heads * head_dim), positions.to(q.device), table,
                                             num_heads=heads, head_dim=head_dim, rotary_dim=table.shape[1],
                                             is_neox=is_neox)
        x.copy_(rotated.view(tokens, heads, head_dim))


def paged_kv_write_(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    block_tables: torch.Tensor, cu_seqlens: torch.Tensor,
                    past_lengths: torch.Tensor) -> None:
    """Token t of sequence b goes to position p = past_lengths[b] + t - cu_seqlens[b], that is
    block block_tables[b, p // tpb], slot p % tpb of kv_cache [num_blocks, 2, KV, tpb, D].

    Bad metadata (a block id outside [0, num_blocks), a position past the block table,
    cu_seqlens not covering the tokens) raises ValueError here; the CUDA kernel skips such
    tokens instead (it cannot raise without a sync) and never writes out of bounds.
    """
    num_blocks, _, _, tpb, _ = kv_cache.shape
    batch, max_blocks = block_tables.shape
    cu = [int(v) for v in cu_seqlens.tolist()]
    past = [int(v) for v in past_lengths.tolist()]
    tables = block_tables.cpu()
    if cu[0] != 0 or cu[-1] != key.shape[0] or any(a > b for a, b in zip(cu, cu[1:])):
        raise ValueError(f"paged_kv_write: cu_seqlens {cu} must rise from 0 to the {key.shape[0]} tokens")
    writes = []  # check every sequence before writing anything
    for b in range(batch):
        start, end = cu[b], cu[b + 1]
        if start == end:
            continue
        if past[b] < 0:
            raise ValueError(f"paged_kv_write: past_lengths[{b}] = {past[b]} is negative")
        pos = torch.arange(past[b], past[b] + end - start)
        idx = pos // tpb
        if int(idx[-1]) >= max_blocks:
            raise ValueError(f"paged_kv_write: sequence {b} reaches position {int(pos[-1])}, past its "
                             f"{max_blocks} blocks of {tpb} tokens")
        blocks = tables[b, idx].long()
        if int(blocks.min()) < 0 or int(blocks.max()) >= num_blocks:
            raise ValueError(f"paged_kv_write: block_tables[{b}] holds block ids {blocks.tolist()} outside "
                             f"[0, {num_blocks})")
        writes.append((start, end, blocks.to(kv_cache.device), (pos % tpb).to(kv_cache.device)))
    for start, end, blocks, slots in writes:
        kv_cache[blocks, 0, :, slots] = key[start:end]
        kv_cache[blocks, 1, :, slots] = value[start:end]


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """int32 [B]: each row's first largest logit, NaN counting as the largest (torch.argmax)."""
    return logits.argmax(dim=-1).to(torch.int32)


MASS_BITS = 40  # top_k_top_p_sample weighs tokens in fixed point: the row maximum weighs 2**40


def _sampling_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits as the sampling kernel reads them: NaN as -inf, -0.0 as +0.0 (equal values, equal keys)."""
    x = logits.float()
    x = torch.where(x.isnan(), float("-inf"), x)
    return torch.where(x == 0, 0.0, x)


def top_k_top_p_masses(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept bool [B, V], mass int64 [B, V]): the tokens each row may draw and their masses.

    mass = floor(2**40 * exp((l - max) / T)) in float32, exactly 2**40 for the tokens equal to the row
    maximum. Top-k (0 < k < V) keeps the tokens whose logit is >= the k-th largest; top-p (0 < p < 1)
    keeps, of those, the tokens whose strictly larger kept logits weigh less than
    P = max(1, floor(p * kept mass)) (float64 product, truncated). Tokens tied at a threshold are kept.
    Greedy rows (T <= 0 or k == 1) keep their argmax only, the lowest index among equal maxima.
    """
    x = _sampling_logits(logits)
    vocab = x.shape[1]
    greedy = ~(temperature > 0) | (top_k == 1)
    row_max = x.max(dim=1, keepdim=True).values
    t = torch.where(greedy, 1.0, temperature).unsqueeze(1)
    e = torch.where(x == row_max, 1.0, torch.exp((x - row_max) / t))
    mass = torch.where(e > 0, e * 2.0 ** MASS_BITS, 0.0).to(torch.int64)  # the product is exact

    values, order = x.sort(dim=1, descending=True)
    limit_k = ~greedy & (top_k > 0) & (top_k < vocab)
    kth = values.gather(1, (top_k.long().clamp(1, vocab) - 1).unsqueeze(1))
    kept = ~limit_k.unsqueeze(1) | (x >= kth)

    limit_p = ~greedy & (top_p > 0) & (top_p < 1)
    kept_mass = torch.where(kept, mass, 0)
    target = (top_p.double() * kept_mass.sum(dim=1).double()).to(torch.int64).clamp_min(1)
    ranked = kept_mass.gather(1, order)
    # The mass strictly above a token is the mass ranked before the first token of its tie group.
    first_of_tie = torch.searchsorted(-values, -values)
    above = torch.empty_like(ranked).scatter_(1, order, (ranked.cumsum(dim=1) - ranked).gather(1, first_of_tie))
    kept &= ~limit_p.unsqueeze(1) | (above < target.unsqueeze(1))
    argmax = F.one_hot(x.argmax(dim=1), vocab).bool()
    return torch.where(greedy.unsqueeze(1), argmax, kept), mass


def top_k_top_p_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       uniform: torch.Tensor) -> torch.Tensor:
    """int32 [B]: the token row b draws with uniform[b] (see top_k_top_p_masses for what it may draw).

    The kept tokens' masses are laid out as intervals [S_i, S_i + mass_i) in vocabulary order; the
    token drawn is the one whose interval holds R = min(floor(u * kept mass), kept mass - 1) (float64
    product, truncated; u < 0 or NaN counts as 0). A greedy row keeps its argmax only, which holds every R.
    """
    kept, mass = top_k_top_p_masses(logits, temperature, top_k, top_p)
    ends = torch.where(kept, mass, 0).cumsum(dim=1)
    total = ends[:, -1:]
    u = torch.where(uniform >= 0, uniform, 0.0).double().unsqueeze(1)
    draw = torch.minimum((u * total.double()).to(torch.int64), total - 1)
    return torch.searchsorted(ends, draw, right=True).squeeze(1).to(torch.int32)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor] = None,
                     sliding_window: int = 0, k_new: Optional[torch.Tensor] = None,
                     v_new: Optional[torch.Tensor] = None, rotary_cos_sin: Optional[torch.Tensor] = None,
                     is_neox: bool = True) -> torch.Tensor:
    """One query token per sequence (q [B, H, D], at position L_b - 1) over cache positions
    max(0, L_b - window) .. L_b - 1, read through block_tables; softmax in float32.

    With k_new/v_new [B, KV, D], this step's rows are first written at position L_b - 1
    (k and q rotated by rotary_cos_sin when given; the caller's q/k are left as they are)."""
    batch, num_heads, head_dim = q.shape
    kv_heads, tpb = kv_cache.shape[2], kv_cache.shape[3]
    if k_new is not None:
        positions = sequence_lengths.long() - 1
        if rotary_cos_sin is not None:
            q, k_new = q.clone(), k_new.clone()
            rotary_embedding_(q, k_new, positions, rotary_cos_sin, is_neox)
        cu_seqlens = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        paged_kv_write_(k_new, v_new, kv_cache, block_tables, cu_seqlens, positions.to(torch.int32))
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    for b in range(batch):
        length = int(sequence_lengths[b])
        positions = torch.arange(length, device=q.device)
        blocks = block_tables[b].long()[positions // tpb]
        slots = positions % tpb
        keys = kv_cache[blocks, 0, :, slots].float()      # [L, KV, D]
        values = kv_cache[blocks, 1, :, slots].float()
        keys = keys.repeat_interleave(group, dim=1)       # [L, H, D]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float() * scale, keys)
        if alibi_slopes is not None:
            scores = scores + alibi_slopes.float()[:, None] * (positions - (length - 1)).float()[None, :]
        if sliding_window:
            scores[:, positions < length - sliding_window] = float("-inf")
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", probs, values).to(q.dtype)
    return out
