"""Log-probabilities in OpenAI's two shapes: completions' parallel lists (tokens, token_logprobs,
top_logprobs, text_offset) and chat's list of {token, logprob, bytes, top_logprobs}.

A token is shown as its text; one that is part of a character (a byte of a multi-byte UTF-8
sequence) is shown as OpenAI shows it, "bytes:\\xe6\\x97", and chat gives its exact bytes.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Optional, Sequence

import torch

from .openai_protocol import LOGPROB_FLOOR, ChatLogProb, ChatTokenLogProb, CompletionLogProbs


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte (tokens of byte-level tokenizers are
    spelled in it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
    """Token id -> (the text OpenAI shows, its bytes), cached per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text, list(text.encode())
        raw = self._raw_bytes(token_id)
        if raw is None:
            return text, list(text.encode())
        try:
            return raw.decode(), list(raw)
        except UnicodeDecodeError:  # part of a character
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)

    def _raw_bytes(self, token_id: int) -> Optional[bytes]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return None
        match = _SENTENCEPIECE_BYTE.fullmatch(piece)
        if match:  # SentencePiece's byte fallback
            return bytes([int(match.group(1), 16)])
        alphabet = _byte_level_alphabet()
        if all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
        return None


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


def top_k(candidates: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The k most likely of a token's candidates ({token: logprob}: the top ones and the chosen
    one, which is among them or less likely than all of them)."""
    return sorted(candidates.items(), key=lambda kv: -kv[1])[:k]


def chat_logprobs(text_of: TokenText, token_ids: Sequence[int], logprobs: Sequence[dict[int, float]],
                  k: int) -> list[ChatTokenLogProb]:
    out = []
    for token, candidates in zip(token_ids, logprobs):
        text, raw = text_of(token)
        top = [ChatLogProb(token=text_of(t)[0], logprob=_finite(lp), bytes=text_of(t)[1])
               for t, lp in top_k(candidates, k)]
        out.append(ChatTokenLogProb(token=text, logprob=_finite(candidates[token]), bytes=raw, top_logprobs=top))
    return out


def completion_logprobs(text_of: TokenText, token_ids: Sequence[int],
                        logprobs: Sequence[Optional[dict[int, float]]], k: int,
                        offset: int = 0) -> CompletionLogProbs:
    """Completions' shape; `logprobs[i]` None gives a null entry (the first prompt token of an
    echo has no logprob). `offset`: where the first token's text starts in the choice's text."""
    result = CompletionLogProbs()
    for token, candidates in zip(token_ids, logprobs):
        text = text_of(token)[0]
        result.tokens.append(text)
        result.text_offset.append(offset)
        offset += len(text)
        if candidates is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(_finite(candidates[token]))
        top = {}
        for t, lp in top_k(candidates, k):
            top.setdefault(text_of(t)[0], _finite(lp))
        result.top_logprobs.append(top)
    return result


def prompt_logprobs(prompt_token_ids: Sequence[int], context_logits: torch.Tensor,
                    k: int) -> list[Optional[dict[int, float]]]:
    """Each prompt token's logprob and the k most likely tokens at its position, from the
    prompt's logits ([prompt_len, vocab]); the first token has none."""
    logprobs = torch.log_softmax(context_logits.float(), dim=-1)
    out: list[Optional[dict[int, float]]] = [None]
    for pos in range(1, len(prompt_token_ids)):
        row = logprobs[pos - 1]
        candidates = {}
        if k:
            values, ids = row.topk(k)
            candidates = dict(zip(ids.tolist(), values.tolist()))
        token = prompt_token_ids[pos]
        candidates[token] = float(row[token])
        out.append(candidates)
    return out
