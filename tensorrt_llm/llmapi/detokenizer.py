"""Incremental detokenisation: text grows token by token and never splits a character.

Decoding one token at a time is wrong for byte-level and SentencePiece tokenizers: a
multi-byte character may span tokens, and a token's leading space depends on its left
neighbour. So each step decodes a short window of tokens twice (with and without the new
ones) and emits the difference, holding it back while it ends in an incomplete character
(U+FFFD). Work per token is constant: the window restarts after each emitted piece, keeping the
last piece as left context.
"""
from __future__ import annotations

# Tokens of left context kept when decoding a new piece (spacing rules look back a few).
_CONTEXT = 5


class IncrementalDetokenizer:

    def __init__(self, tokenizer, prompt_token_ids: list[int] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        # The window: tokens[prefix:read] were decoded and emitted; read: tokens so far.
        self._tokens = list(prompt_token_ids[-_CONTEXT:])
        self._prefix = 0
        self._read = len(self._tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; returns the text they complete (possibly empty)."""
        self._tokens.extend(token_ids)
        before = self._decode(self._tokens[self._prefix:self._read])
        after = self._decode(self._tokens[self._prefix:])
        if after.endswith("\ufffd") or len(after) < len(before):
            return ""  # a character still incomplete: wait for the next token
        new = after[len(before):]
        self._prefix, self._read = self._read, len(self._tokens)
        self.text += new
        return new

    def flush(self) -> str:
        """At the end: whatever is held back (an incomplete character stays U+FFFD)."""
        before = self._decode(self._tokens[self._prefix:self._read])
        after = self._decode(self._tokens[self._prefix:])
        new = after[len(before):] if after.startswith(before) else ""
        self._read = len(self._tokens)
        self.text += new
        return new
