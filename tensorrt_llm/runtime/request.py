"""One generation request of the executor: what was asked, and its state as it runs.

A request is a sequence of tokens (its prompt, then what it generates) and a count of how
many of them are in the KV cache (`num_computed`). Every step computes some of the rest: a
chunk of the prompt, or the one token sampled last (a decode). When a step computes up to
the last token, that step's logits give the next token. Sampled tokens reach the host a
step late (the executor launches the next step first), so a request may hold one token
whose value is still on the device (`num_pending`).
"""
from __future__ import annotations

import enum
import itertools
import numbers
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..errors import RequestError
from .sampling import SamplingConfig


@dataclass
class ModelLimits:
    """What the engine was built for; every request is checked against it before work."""
    vocab_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int = 1



class RequestState(enum.Enum):
    WAITING = "waiting"    # queued, or preempted: holds no KV blocks
    RUNNING = "running"    # holds KV blocks, scheduled every step
    LEAVING = "leaving"    # reached max_new_tokens: out of the batch, last token on its way
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """A prompt and how to continue it. Checked by the executor's `add_request`.

    stop_words: token sequences that end the request once its output ends with one (kept in
    the output); `end_id` (in `sampling`) and `stop_token_ids` end it too. bad_words: token
    sequences never generated (see word_lists.py). logprobs: the log-probability of every
    generated token is recorded (under the processed logits), with the `top_logprobs` most
    likely alternatives. The random draws of a sampling request depend only on its seed and
    the index of the token drawn, never on the other requests of a batch.
    """
    prompt_token_ids: list[int]
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(top_k=1))
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    return_context_logits: bool = False
    return_generation_logits: bool = False
    request_id: int = field(default_factory=lambda: next(_ids))

    # -- state, kept by the executor --------------------------------------------------------
    state: RequestState = RequestState.WAITING
    tokens: list[int] = field(default_factory=list)   # prompt + generated values known on the host
    num_pending: int = 0                               # sampled tokens still on the device
    num_computed: int = 0                              # tokens whose K/V are in the cache
    arrival: int = 0                                   # admission order: preemption takes the youngest
    finish_reason: Optional[str] = None                # "stop", "length", "abort" or "error"
    error: Optional[str] = None
    log_probs: list[float] = field(default_factory=list)
    top_log_probs: list[dict[int, float]] = field(default_factory=list)
    context_logits: list[torch.Tensor] = field(default_factory=list)     # chunks, [n, V] each
    generation_logits: list[torch.Tensor] = field(default_factory=list)  # [V] per generated token
    num_preemptions: int = 0
    reused_tokens: int = 0                             # prompt tokens taken from the block cache
    seed: int = 0                                      # the draw seed (sampling.random_seed or random)

    def __post_init__(self):
        self.tokens = list(self.prompt_token_ids)
        seed = self.sampling.random_seed
        self.seed = secrets.randbits(63) if seed is None else seed % 2**64

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens so far, pending ones included."""
        return len(self.tokens) + self.num_pending

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def in_prefill(self) -> bool:
        """More than one token to compute: the prompt (or, after preemption, everything so
        far) is not yet in the cache."""
        return self.num_tokens - self.num_computed > 1

    @property
    def needs_token_values(self) -> bool:
        """Whether sampling reads the token values so far (penalties, multi-token bad
        words): then a step cannot be launched before the last one's tokens are known."""
        s = self.sampling
        return (s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
                or any(len(w) > 1 for w in self.bad_words))

    def stopped_by(self, token: int) -> bool:
        """Whether the request ends after `token` was appended (end_id, stop ids, stop words)."""
        if token == self.sampling.end_id or token in self.stop_token_ids:
            return True
        # A word may begin in the prompt, as transformers' stop strings may.
        return any(self.tokens[-len(word):] == word for word in self.stop_words)


def check_prompt(i: int, ids, limits: ModelLimits) -> list[int]:
    """Prompt i's token ids as a list of ints, or a RequestError naming prompt i: a 1-D
    sequence (list of ints, integer tensor or array) of ids in [0, vocab_size), not empty,
    within max_input_len. Ids are checked before any cast, so nothing wraps."""
    ids, n, lo, hi = _prompt_ids(i, ids)
    if n == 0:
        raise RequestError(f"prompt {i} is empty")
    if n > limits.max_input_len:
        raise RequestError(f"prompt {i} has {n} tokens, more than the engine's max_input_len "
                           f"{limits.max_input_len}; rebuild with a larger --max_input_len")
    if lo < 0 or hi >= limits.vocab_size:
        bad = lo if lo < 0 else hi
        raise RequestError(f"prompt {i} holds token id {bad}, outside the vocabulary "
                           f"[0, {limits.vocab_size})")
    if isinstance(ids, list):
        return list(map(int, ids))  # numpy integers too; in range, checked above
    return _as_int32(ids).tolist()


def check_length(i: int, prompt_len: int, max_new_tokens, limits: ModelLimits) -> int:
    """max_new_tokens as an int, or a RequestError: >= 1, and prompt i plus it within
    max_seq_len."""
    if not _is_integer(max_new_tokens) or max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be >= 1 and an integer, got {max_new_tokens!r}")
    if prompt_len + max_new_tokens > limits.max_seq_len:
        raise RequestError(f"prompt {i} ({prompt_len} tokens) + max_new_tokens {max_new_tokens} exceeds "
                           f"the engine's max_seq_len {limits.max_seq_len}")
    return int(max_new_tokens)


def check_token_ids(name: str, ids, limits: ModelLimits) -> None:
    """end_id / pad_id / stop ids are tokens of the vocabulary."""
    for value in ids:
        if value is not None and not 0 <= value < limits.vocab_size:
            raise RequestError(f"{name} {value} is outside the vocabulary [0, {limits.vocab_size})")


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
    if set(map(type, ids)) <= {int}:  # the common case, checked at C speed (bool is not int here)
        return (ids, len(ids), min(ids), max(ids)) if ids else (ids, 0, 0, -1)
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
