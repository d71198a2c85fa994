"""Stop words and bad words: per-request lists of token sequences matched against the end
of each row's tokens.

Format (TensorRT-LLM's): for every request a list of token sequences, e.g.
`[[[5, 6], [9]], [[7]]]` for two requests, or one list `[[5, 6], [9]]` shared by all.

- A bad word is never generated: a single-token one is banned at every step, a multi-token
  one when the row's tokens end with all but its last token, which is then banned
  (transformers' NoBadWordsLogitsProcessor).
- A stop word ends its row once the row's tokens end with it; it stays in the output.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from ..errors import RequestError


class WordLists:
    """Token sequences of every request, padded into tensors for matching on a device."""

    def __init__(self, words: list[list[list[int]]], device):
        owners, lengths, padded = [], [], []
        width = max((len(w) for ws in words for w in ws), default=1)
        for request, ws in enumerate(words):
            for w in ws:
                owners.append(request)
                lengths.append(len(w))
                padded.append(list(w) + [0] * (width - len(w)))
        self.device = torch.device(device)
        self.owner = torch.tensor(owners, dtype=torch.int64, device=device)     # [M]
        self.length = torch.tensor(lengths, dtype=torch.int64, device=device)   # [M]
        self.tokens = torch.tensor(padded, dtype=torch.int64, device=device).reshape(-1, width)

    @classmethod
    def parse(cls, value, batch_size: int, vocab_size: int, name: str, device,
              bans: bool = False) -> WordLists | None:
        """None when `value` holds no word; a RequestError naming `name` when it is malformed
        (see `check_words`)."""
        words = check_words(value, batch_size, vocab_size, name, bans)
        if not any(words):
            return None
        return cls(words, device)

    def ends_with(self, token_ids: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
                  drop_last: int = 0) -> torch.Tensor:
        """bool [R, M]: whether row r (of request rows[r], holding token_ids[r, :lengths[r]])
        ends with word m, less its last `drop_last` tokens. Words of other requests: False."""
        keep = (self.length - drop_last).clamp_min(0)                     # [M]
        j = torch.arange(self.tokens.shape[1], device=self.device)        # [K]
        lengths = lengths.to(self.device, torch.int64)
        # Position in the row of the word's j-th token when the word ends the row.
        pos = lengths[:, None, None] - keep[None, :, None] + j           # [R, M, K]
        used = j < keep[:, None]                                          # [M, K]
        inside = pos >= 0
        ids = token_ids.to(self.device, torch.int64)
        got = ids.gather(1, pos.clamp(0, ids.shape[1] - 1).reshape(len(ids), -1)).reshape(pos.shape)
        same = (got == self.tokens) & inside | ~used
        return same.all(dim=-1) & (self.owner == rows.to(self.device)[:, None])

    def ban(self, logits: torch.Tensor, token_ids: torch.Tensor, lengths: torch.Tensor,
            rows: torch.Tensor) -> torch.Tensor:
        """`logits` [R, V] with the bad words' tokens that would complete a word at -inf."""
        match = self.ends_with(token_ids, lengths, rows, drop_last=1)     # [R, M]
        last = self.tokens.gather(1, (self.length - 1)[:, None]).squeeze(1)
        bias = torch.zeros_like(logits)
        bias.index_add_(1, last, torch.where(match, -math.inf, 0.0).to(bias.dtype))
        return logits + bias

    def stopped(self, token_ids: torch.Tensor, lengths: torch.Tensor,
                rows: torch.Tensor) -> torch.Tensor:
        """bool [R]: rows whose tokens end with one of their request's stop words."""
        return self.ends_with(token_ids, lengths, rows).any(dim=1)


def check_words(value, batch_size: int, vocab_size: int, name: str,
                bans: bool = False) -> list[list[list[int]]]:
    """One list of words per request (empty lists when `value` is None), or a RequestError
    naming `name`. `bans`: the words are bad words, refused when one request's single-token
    words ban the whole vocabulary (nothing could be generated)."""
    if value is None:
        return [[] for _ in range(batch_size)]
    words = _per_request(value, batch_size, name)
    for request, ws in enumerate(words):
        for w in ws:
            if not w or any(t < 0 or t >= vocab_size for t in w):
                raise RequestError(f"{name}: request {request} holds {w!r}; every word must be a "
                                   f"non-empty list of token ids in [0, {vocab_size})")
        if bans and len({w[0] for w in ws if len(w) == 1}) >= vocab_size:
            raise RequestError(f"{name} bans every token of the vocabulary ({vocab_size}) for "
                               f"request {request}: nothing could be generated")
    return words


def _is_seq(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.dim() > 0
    return isinstance(x, Sequence) and not isinstance(x, str)


def _per_request(value, batch_size: int, name: str) -> list[list[list[int]]]:
    """One list of words per request from either accepted format. A list of empty lists
    reads as one (empty) list per request."""
    def token(t):
        if isinstance(t, torch.Tensor) and t.dim() == 0 and not (
                t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex):
            t = int(t)
        if not isinstance(t, numbers.Integral) or isinstance(t, bool):
            raise RequestError(f"{name} holds {t!r} ({type(t).__name__}); token ids must be integers")
        return int(t)

    def words_of(ws):
        return [[token(t) for t in w] for w in ws]
    if not _is_seq(value):
        raise RequestError(f"{name} must be a list of token-id lists (shared by all requests) or "
                         f"one such list per request, got {type(value).__name__}")
    value = list(value)
    if all(_is_seq(w) and all(_is_seq(s) for s in w) for w in value) and value:
        if len(value) != batch_size:
            raise RequestError(f"{name} has {len(value)} lists for {batch_size} requests")
        return [words_of(ws) for ws in value]
    if all(_is_seq(w) and all(not _is_seq(t) for t in w) for w in value):
        shared = words_of(value)
        return [shared] * batch_size
    raise RequestError(f"{name} must be List[List[int]] (shared) or List[List[List[int]]] "
                     f"(per request)")
