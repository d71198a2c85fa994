"""The OpenAI API's bodies (completions, chat completions, models, errors) as pydantic models.

FastAPI validates every request against these before a handler runs, and publishes them as the
server's OpenAPI schema (/openapi.json). Requests are strict, as OpenAI's are: no unknown fields,
no "5" for 5, OpenAI's documented ranges (temperature in [0, 2], top_p in (0, 1], at most 4 stop
strings, ...). What depends on the engine (prompt length, max_tokens against max_seq_len) is
checked by the engine's own request checks when the request is submitted (runtime/request.py).

Beyond OpenAI's fields, vLLM's sampling extensions that clients and benchmarks send are accepted:
top_k, min_tokens, ignore_eos, repetition_penalty.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..llmapi import SamplingParams

MAX_STOP_STRINGS = 4      # OpenAI's limit
MAX_LOGPROBS = 20         # OpenAI's limit for chat's top_logprobs; completions' logprobs take the same
MAX_N = 128               # OpenAI's limit
LOGPROB_FLOOR = -9999.0   # stands for -inf (JSON has no infinity), as vLLM does


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# -- requests ---------------------------------------------------------------------------------


class OpenAIRequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(OpenAIRequestModel):
    include_usage: bool = False


Stop = Union[str, list[str]]


class SamplingRequest(OpenAIRequestModel):
    """The fields completions and chat completions share."""
    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: Optional[float] = Field(None, ge=0, le=2, description="default 1; 0 is greedy")
    top_p: Optional[float] = Field(None, gt=0, le=1)
    seed: Optional[int] = Field(None, ge=-(2**63), lt=2**64)
    stop: Optional[Stop] = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logit_bias: Optional[dict[str, float]] = Field(None, description="not supported: must be empty")
    user: Optional[str] = None
    # vLLM's extensions
    top_k: Optional[int] = Field(None, ge=-1, description="0 or -1: no limit")
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    repetition_penalty: float = Field(1.0, gt=0, le=10)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop):
        strings = [stop] if isinstance(stop, str) else list(stop or [])
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(strings)}")
        if any(not s for s in strings):
            raise ValueError("a stop string must not be empty")
        return stop

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self, max_tokens: int, logprobs: Optional[int],
                        prompt_logits: bool = False) -> SamplingParams:
        """The LLM API's parameters for one prompt. Temperature 0 is greedy whatever top_p and
        top_k say (as in vLLM); otherwise OpenAI's default temperature is 1."""
        greedy = self.temperature == 0
        top_k = None if greedy or self.top_k in (None, 0, -1) else self.top_k
        return SamplingParams(
            max_tokens=max_tokens, n=self.n, seed=self.seed,
            temperature=None if greedy else (1.0 if self.temperature is None else self.temperature),
            top_p=None if greedy else self.top_p, top_k=top_k,
            stop=self.stop_strings or None, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, logprobs=logprobs,
            return_context_logits=prompt_logits)


TokenIds = list[int]
Prompt = Union[str, list[str], TokenIds, list[TokenIds]]


class CompletionRequest(SamplingRequest):
    prompt: Prompt = Field(description="a string, a list of strings, token ids, or a list of token-id lists")
    max_tokens: int = Field(16, ge=1)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: Optional[int] = Field(None, ge=1, description="not supported beyond best_of == n")
    suffix: Optional[str] = Field(None, description="not supported")

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_clear_error(cls, value, handler):
        """One message for the four forms, not one per form."""
        try:
            return handler(value)
        except ValidationError:
            raise ValueError("prompt must be a string, a list of strings, a list of token ids "
                             "(integers) or a list of such lists") from None

    def prompts(self) -> list[Union[str, TokenIds]]:
        """The prompts, one item each (a text or token ids)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class TextContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIRequestModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextContentPart]]
    name: Optional[str] = None

    def for_template(self) -> dict:
        """The message as chat templates read it: a role (developer is the newer name of
        system) and one string."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1, description="deprecated name of max_completion_tokens")
    max_completion_tokens: Optional[int] = Field(None, ge=1, description="default: the rest of the context")
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)


# -- responses --------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class ChatLogProb(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogProb(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatChoiceLogProbs(BaseModel):
    content: Optional[list[ChatTokenLogProb]] = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatChoiceLogProbs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: Optional[UsageInfo] = None


class DeltaMessage(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatChoiceLogProbs] = None
    finish_reason: Optional[str] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Optional[UsageInfo] = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tensorrt_llm"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class HealthResponse(BaseModel):
    status: str


class VersionResponse(BaseModel):
    version: str
