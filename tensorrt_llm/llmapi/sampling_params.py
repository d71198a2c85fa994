"""SamplingParams: how to continue one prompt, as TensorRT-LLM's and vLLM's LLM APIs spell it.

Defaults are greedy (temperature, top_k, top_p unset), as TensorRT-LLM's are. Strings
(`stop`, `bad`) are matched on the text by the LLM (stop) or turned into token sequences
with the tokenizer (bad); token-id forms (`stop_token_ids`, `bad_token_ids`) need none.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

from ..errors import RequestError
from ..runtime.request import Request
from ..runtime.sampler import mix_seed
from ..runtime.sampling import SamplingConfig


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: Optional[float] = None    # None: greedy unless top_k / top_p are set (then 1.0)
    top_k: Optional[int] = None            # None / 0: no limit
    top_p: Optional[float] = None          # None / 1.0: no limit
    seed: Optional[int] = None             # None: a random seed per request
    n: int = 1                             # completions per prompt (each its own seed stream)
    min_tokens: int = 0
    end_id: Optional[int] = None           # None: the tokenizer's EOS
    pad_id: Optional[int] = None
    ignore_eos: bool = False               # run to max_tokens whatever is generated
    stop: Union[str, list[str], None] = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    bad: Union[str, list[str], None] = None
    bad_token_ids: list[int] = field(default_factory=list)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Optional[int] = None         # None: off; k: the chosen token's and k alternatives
    return_context_logits: bool = False
    return_generation_logits: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def bad_strings(self) -> list[str]:
        return [self.bad] if isinstance(self.bad, str) else list(self.bad or [])

    def check(self) -> None:
        """The fields SamplingConfig does not check: RequestError naming the field."""
        def require(ok, name, what):
            if not ok:
                raise RequestError(f"SamplingParams.{name} must be {what}, got {getattr(self, name)!r}")
        require(isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1, "n", "an int >= 1")
        require(self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
                "logprobs", "None or an int >= 0")
        require(all(isinstance(s, str) and s for s in self.stop_strings), "stop",
                "a non-empty string or a list of them")
        require(all(isinstance(s, str) and s for s in self.bad_strings), "bad",
                "a non-empty string or a list of them")

    def to_requests(self, prompt_token_ids: list[int], tokenizer=None) -> list[Request]:
        """The executor requests of one prompt (n of them), checked by SamplingConfig."""
        self.check()
        end_id = self.end_id
        if end_id is None and tokenizer is not None:
            end_id = tokenizer.eos_token_id
        sampling_fields = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        sampled = any(v not in (None, 0, 1.0) for v in (self.top_k, self.top_p)) or self.temperature
        if not sampled:  # greedy
            sampling_fields = dict(top_k=1)
        else:
            sampling_fields = {k: v for k, v in sampling_fields.items() if v is not None}
        config = SamplingConfig(
            end_id=None if self.ignore_eos else end_id, pad_id=self.pad_id,
            random_seed=self.seed, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            min_length=self.min_tokens if end_id is not None and not self.ignore_eos else 0,
            **sampling_fields)
        bad_words = [[t] for t in self.bad_token_ids]
        for text in self.bad_strings:
            if tokenizer is None:
                raise RequestError("SamplingParams.bad needs a tokenizer; pass bad_token_ids instead")
            bad_words.append(tokenizer.encode(text, add_special_tokens=False))
        requests = []
        for i in range(self.n):
            seed = config.random_seed
            if seed is not None and self.n > 1:
                seed = mix_seed(seed, i)
            requests.append(Request(
                list(prompt_token_ids), dataclasses.replace(config, random_seed=seed), self.max_tokens,
                stop_token_ids=tuple(self.stop_token_ids), bad_words=bad_words,
                logprobs=self.logprobs is not None, top_logprobs=self.logprobs or 0,
                return_context_logits=self.return_context_logits,
                return_generation_logits=self.return_generation_logits))
        return requests
