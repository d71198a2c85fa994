"""Choosing the next token from logits: penalties, then greedy or random sampling.

Order, as in Hugging Face transformers (processors before warpers):
  1. repetition / presence / frequency penalties and min_length, on the raw logits;
  2. greedy rows take the argmax;
  3. sampling rows: temperature, top-k, top-p (nucleus), then one random draw.
Tokens tied at the top-k or top-p threshold are all kept (transformers' top-k does the same).
Everything is computed in float32 on the logits' device, without host syncs. Step 3 is one
launch of kernels.top_k_top_p_sample (greedy rows included; the CUDA kernel on a GPU, its
reference elsewhere) that draws with one uniform number per row, from sampling_distribution().
"""

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from .. import kernels
from ..errors import RequestError
from ..ops.launch import cuda_kernels_available


@dataclass
class SamplingConfig:
    """How to pick tokens for one request.

    Greedy decoding is `top_k == 1` or `temperature == 0`. Otherwise tokens are drawn from
    softmax(logits / temperature), restricted to the `top_k` most likely tokens (0: no
    limit) and then to the smallest set whose probability reaches `top_p` (1.0 or 0.0: no
    limit; 0.0 is accepted as "off" as TensorRT-LLM spells it); tokens tied with the last one
    either limit keeps are kept too. The draw uses `random_seed` (None: a nondeterministic
    seed); the same seed draws the same tokens again on the same device.

    Penalties look at the prompt and the tokens generated so far:
      repetition_penalty: seen logits l become l / p if l > 0 else l * p (transformers'
        RepetitionPenaltyLogitsProcessor); 1.0 is off.
      presence_penalty: subtracted once from every seen token's logit; 0.0 is off.
      frequency_penalty: subtracted once per occurrence of a token; 0.0 is off.
    min_length: `end_id` cannot be chosen before this many tokens have been generated
      (transformers' MinNewTokensLengthLogitsProcessor).

    Beam search (num_beams > 1, see beam_search.py) keeps the num_beams best sequences by
    summed log-probability and does not sample: temperature, top_k and top_p must be left
    off. A finished sequence scores sum / generated_tokens ** length_penalty;
    early_stopping is True (stop once num_beams sequences finished), False (stop when no
    running beam can beat the finished ones, judged at the current length) or "never"
    (judged at the longest length when length_penalty > 0), as in transformers.
    """
    end_id: int | None = None  # None: no end token, generation runs to max_new_tokens
    pad_id: int | None = None  # None: end_id, or 0 without one
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    random_seed: int | None = None
    num_beams: int = 1
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_length: int = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self):
        """Checks every field's type and range: a RequestError (a ValueError) naming it."""
        if self.pad_id is None:
            self.pad_id = self.end_id if self.end_id is not None else 0
        _require(self.end_id is None or (_is_int(self.end_id) and self.end_id >= 0), "end_id",
                 "None or an int >= 0", self.end_id)
        _require(_is_int(self.pad_id) and self.pad_id >= 0, "pad_id", "an int >= 0", self.pad_id)
        _require(_is_real(self.temperature) and math.isfinite(self.temperature)
                 and self.temperature >= 0, "temperature", "a finite number >= 0", self.temperature)
        _require(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an int >= 0", self.top_k)
        _require(_is_real(self.top_p) and 0.0 <= self.top_p <= 1.0, "top_p", "a number in [0, 1]",
                 self.top_p)
        _require(self.random_seed is None or (_is_int(self.random_seed)
                                              and -2**63 <= self.random_seed < 2**64),
                 "random_seed", "None or an int in [-2**63, 2**64)", self.random_seed)
        _require(_is_int(self.num_beams) and self.num_beams >= 1, "num_beams", "an int >= 1",
                 self.num_beams)
        _require(_is_real(self.repetition_penalty) and math.isfinite(self.repetition_penalty)
                 and self.repetition_penalty > 0,
                 "repetition_penalty", "a finite number > 0", self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty", "length_penalty"):
            value = getattr(self, name)
            _require(_is_real(value) and math.isfinite(value), name, "a finite number", value)
        _require(_is_int(self.min_length) and self.min_length >= 0, "min_length",
                 "an int >= 0", self.min_length)
        _require(self.min_length == 0 or self.end_id is not None, "min_length",
                 "0 when there is no end_id", self.min_length)
        _require(isinstance(self.early_stopping, bool) or self.early_stopping == "never",
                 "early_stopping", 'True, False or "never"', self.early_stopping)
        # Plain Python numbers from here on (numpy scalars are accepted above).
        for name in ("end_id", "pad_id", "top_k", "random_seed", "num_beams", "min_length"):
            if getattr(self, name) is not None:
                setattr(self, name, int(getattr(self, name)))
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "length_penalty"):
            setattr(self, name, float(getattr(self, name)))
        samples = (self.temperature not in (0.0, 1.0) or self.top_k > 1
                   or 0.0 < self.top_p < 1.0)
        _require(self.num_beams == 1 or not samples, "num_beams",
                 "1 when sampling (beam search takes no temperature, top_k > 1 or top_p)",
                 self.num_beams)

    @property
    def is_greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0.0


def _is_int(value) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    """A Python or numpy int or float, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require(ok: bool, name: str, what: str, value) -> None:
    if not ok:
        raise RequestError(f"SamplingConfig.{name} must be {what}, got {value!r}")


def make_generator(random_seed: int | None, device) -> torch.Generator:
    """A generator on `device` (sampling draws on the logits' device) seeded with
    `random_seed`, or nondeterministically when it is None."""
    generator = torch.Generator(device=device)
    if random_seed is None:
        generator.seed()
    else:
        generator.manual_seed(random_seed)
    return generator


Configs = SamplingConfig | Sequence[SamplingConfig]


def _per_row(values: list, device, dtype):
    """A Python scalar when every row agrees (broadcasts for free), else a [B, 1] tensor."""
    if all(v == values[0] for v in values):
        return values[0]
    return _to_device(torch.tensor(values, dtype=dtype), device).unsqueeze(1)


def _row_tensor(values: list, device, dtype) -> torch.Tensor:
    """The per-row values as a [B] tensor on `device`."""
    per_row = _per_row(values, device, dtype)
    if isinstance(per_row, torch.Tensor):
        return per_row.squeeze(1)
    return torch.full((len(values),), per_row, dtype=dtype, device=device)


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A CPU tensor on `device`. A GPU gets it from pinned memory without a host sync (a plain
    copy from pageable memory would wait for the work queued before it)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _as_list(config: Configs, batch_size: int) -> list[SamplingConfig]:
    if isinstance(config, SamplingConfig):
        return [config] * batch_size
    configs = list(config)
    if len(configs) != batch_size:
        raise ValueError(f"got {len(configs)} sampling configs for {batch_size} rows of logits")
    return configs


def _token_counts(token_ids: torch.Tensor, sequence_lengths: torch.Tensor,
                  vocab_size: int) -> torch.Tensor:
    """float32 [B, V]: occurrences of each token in token_ids[b, :sequence_lengths[b]]."""
    ids = token_ids.long()
    positions = torch.arange(ids.shape[1], device=ids.device)
    valid = (positions < sequence_lengths.to(ids.device).unsqueeze(1)) & (ids >= 0) & (ids < vocab_size)
    # Ignored entries are counted in an extra column that is dropped.
    ids = torch.where(valid, ids, vocab_size)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.float32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def process_logits(logits: torch.Tensor, config: Configs, *, token_ids: torch.Tensor | None = None,
                   context_lengths: torch.Tensor | None = None,
                   sequence_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Apply penalties and min_length. Returns float32 logits [B, V]; the input is unchanged.

    token_ids [B, S]: row b holds its prompt and generated tokens in
    token_ids[b, :sequence_lengths[b]]; the first context_lengths[b] of them are the prompt.
    Needed only when a penalty (token_ids, sequence_lengths) or min_length
    (context_lengths, sequence_lengths) is active.
    """
    logits = logits.float()
    batch_size, vocab_size = logits.shape
    configs = _as_list(config, batch_size)
    device = logits.device
    repetition = _per_row([c.repetition_penalty for c in configs], device, torch.float32)
    presence = _per_row([c.presence_penalty for c in configs], device, torch.float32)
    frequency = _per_row([c.frequency_penalty for c in configs], device, torch.float32)
    min_length = _per_row([c.min_length for c in configs], device, torch.int64)

    if not (_is_off(repetition, 1.0) and _is_off(presence, 0.0) and _is_off(frequency, 0.0)):
        if token_ids is None or sequence_lengths is None:
            raise ValueError("penalties need token_ids and sequence_lengths")
        counts = _token_counts(token_ids, sequence_lengths, vocab_size)
        seen = counts > 0
        penalised = torch.where(logits < 0, logits * repetition, logits / repetition)
        logits = torch.where(seen, penalised, logits)
        logits = logits - presence * seen - frequency * counts

    if not _is_off(min_length, 0):
        if context_lengths is None or sequence_lengths is None:
            raise ValueError("min_length needs context_lengths and sequence_lengths")
        generated = (sequence_lengths.to(device) - context_lengths.to(device)).long().unsqueeze(1)
        # A row without an end id has min_length 0: its placeholder 0 is never masked.
        end_ids = torch.tensor([c.end_id if c.end_id is not None else 0 for c in configs],
                               device=device).unsqueeze(1)
        too_short = generated < min_length
        end_logits = logits.gather(1, end_ids).masked_fill(too_short, -math.inf)
        logits = logits.scatter(1, end_ids, end_logits)
    return logits


def _is_off(param, off_value) -> bool:
    return not isinstance(param, torch.Tensor) and param == off_value


def _kept_probs(logits: torch.Tensor, configs: list[SamplingConfig]) -> torch.Tensor:
    """float32 [B, V]: each sampling row's probabilities after temperature and top-k, zeroed
    outside what top-p keeps too (not renormalised after top-p).

    Top-k keeps the tokens whose logit is at least the k-th largest; top-p keeps those whose
    more likely (strictly larger logit) tokens hold less than top_p of the top-k probability,
    so the most likely token always stays. Ties at either threshold are kept, as by the CUDA
    kernel (kernels.reference.top_k_top_p_masses states its integer version of this rule).
    The full vocabulary is sorted only for top-p in a row without a top-k limit.
    """
    device = logits.device
    vocab = logits.shape[1]
    top_ks = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    top_ps = [c.top_p if 0.0 < c.top_p < 1.0 else math.inf for c in configs]
    # Greedy rows (temperature 0) are answered by argmax; 1.0 only keeps them finite here.
    temperature = _per_row([c.temperature or 1.0 for c in configs], device, torch.float32)
    scaled = logits / temperature
    width = max(top_ks)
    limits_p = any(p != math.inf for p in top_ps)
    if min(top_ks) == vocab and not limits_p:
        return torch.softmax(scaled, dim=-1)
    if width < vocab:
        values, ids = torch.topk(logits, width, dim=-1)
    else:
        values, ids = torch.sort(logits, dim=-1, descending=True)

    top_k = _per_row(top_ks, device, torch.int64)
    kth = values[:, width - 1:] if _is_off(top_k, width) else values.gather(1, top_k - 1)
    probs = torch.softmax(scaled.masked_fill(logits < kth, -math.inf), dim=-1)
    if limits_p:
        top_p = _per_row(top_ps, device, torch.float32)
        ranked = probs.gather(1, ids)
        # The probability strictly above a token: what is ranked before the first of its ties.
        first_of_tie = torch.searchsorted(-values, -values)
        above = (ranked.cumsum(dim=-1) - ranked).gather(1, first_of_tie)
        # A prefix (`above` never decreases), never empty: a top_p that is 0 in float32 (1e-107)
        # still keeps the most likely token.
        kept = (above < top_p).sum(dim=-1, keepdim=True).clamp_(min=1)
        probs = probs.masked_fill(logits < values.gather(1, kept - 1), 0.0)
    return probs


def sample(logits: torch.Tensor, config: Configs, generator: torch.Generator | None = None, *,
           token_ids: torch.Tensor | None = None, context_lengths: torch.Tensor | None = None,
           sequence_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Next token of each row: int32 [B] on the logits' device.

    `config` is one SamplingConfig for all rows or one per row. `generator` must live on
    the logits' device (see make_generator); all rows draw from it. See process_logits for
    the other arguments.
    """
    logits = process_logits(logits, config, token_ids=token_ids,
                            context_lengths=context_lengths, sequence_lengths=sequence_lengths)
    uniform = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    return choose(logits, config, uniform)


def choose(logits: torch.Tensor, config: Configs, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """`sample` on logits that process_logits has already processed: row b draws with
    `uniform[b]` in [0, 1) (float32 [B] on the logits' device; unused when every row is
    greedy). One launch of kernels.top_k_top_p_sample (its CUDA kernel, or its reference
    off the GPU): the same uniforms pick the same tokens."""
    configs = _as_list(config, logits.shape[0])
    if all(c.is_greedy for c in configs):
        return argmax_rows(logits)
    if uniform is None:
        raise ValueError("sampling rows need one uniform number each")
    device = logits.device
    vocab = logits.shape[1]
    # Greedy rows: temperature 0 (the kernel keeps their argmax only).
    temperature = _row_tensor([0.0 if c.is_greedy else c.temperature for c in configs], device,
                              torch.float32)
    top_k = _row_tensor([min(c.top_k, vocab) for c in configs], device, torch.int32)
    top_p = _row_tensor([c.top_p for c in configs], device, torch.float32)
    return kernels.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)


@functools.lru_cache(maxsize=None)
def _argmax_chunk(vocab: int) -> int:
    """The chunk width of argmax_rows: a divisor of the vocabulary in [512, 2048] when one
    exists (no tail to treat apart), else 1024. Cached: greedy decoding asks at every step."""
    return next((c for c in range(1024, 2049) if vocab % c == 0),
                next((c for c in range(1023, 511, -1) if vocab % c == 0), 1024))


def argmax_rows(logits: torch.Tensor, out: Optional[torch.Tensor] = None,
                advance: Optional[torch.Tensor] = None, host_out: Optional[torch.Tensor] = None,
                host_slot: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int32 [B]: each row's first largest logit, torch.argmax's answer (NaN counts as the
    largest), on the path of every greedy decode step; written into `out` when given, and with
    `advance` (int32 [B], a greedy step's sequence lengths) each entry + 1. On a GPU the compiled
    kernels (kernels.argmax_rows: blocks over chunks of each row, then the best chunk, which also
    writes `out` and advances); without them two passes of PyTorch: the largest of every chunk of
    about a thousand logits (torch.max over [B, chunks, width], the first index on ties), then the
    first best chunk. torch.argmax reduces a row in one long pass: 28 us for a 128,256-token
    vocabulary on an H100; the two passes 25 us in five launches (two reductions, a gather, an
    add, a cast). `host_out` and `host_slot`: kernels.argmax_rows's (the compiled kernels only)."""
    if logits.is_cuda and cuda_kernels_available():
        return kernels.argmax_rows(logits, out, advance, host_out, host_slot)
    if host_out is not None:
        raise ValueError("argmax_rows: host_out needs the compiled CUDA kernels")
    width = _argmax_chunk(logits.shape[1])
    if not logits.is_cuda or logits.shape[1] < 2 * width:
        tokens = logits.argmax(dim=-1).int()
    else:
        tokens = argmax_by_chunks(logits, width)
    if advance is not None:
        advance.add_(1)
    return tokens if out is None else out.copy_(tokens)


def argmax_by_chunks(logits: torch.Tensor, width: int) -> torch.Tensor:
    """argmax_rows' two passes over chunks of `width` logits (any device; at least one chunk)."""
    b, v = logits.shape
    n = v // width
    head = n * width
    values, within = logits[:, :head].reshape(b, n, width).max(dim=-1)
    chunk = values.argmax(dim=-1, keepdim=True)
    token = within.gather(1, chunk).add_(chunk, alpha=width)
    if head < v:  # the logits after the last whole chunk: a later index wins only when larger
        best = values.gather(1, chunk)
        tail_value, tail_index = logits[:, head:].max(dim=-1, keepdim=True)
        later = (tail_value > best) | (tail_value.isnan() & ~best.isnan())
        token = torch.where(later, tail_index + head, token)
    return token.squeeze(1).int()


def sampling_distribution(logits: torch.Tensor, config: Configs, **history) -> torch.Tensor:
    """float32 [B, V]: the probabilities `sample` draws each row's token from (one-hot for
    greedy rows), on every device: the CUDA kernel's integer masses differ from these by float
    rounding only. `history`: process_logits' keyword arguments."""
    configs = _as_list(config, logits.shape[0])
    logits = process_logits(logits, configs, **history)
    probs = _kept_probs(logits, configs)
    dist = probs / probs.sum(dim=-1, keepdim=True)
    greedy = torch.zeros_like(logits).scatter(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    rows = torch.tensor([c.is_greedy for c in configs], device=logits.device).unsqueeze(1)
    return torch.where(rows, greedy, dist)
