"""The LLM API: LLM(model) over an engine folder, a checkpoint, a Hugging Face folder or a GGUF file."""
from .llm import LLM, CompletionOutput, GenerationResult, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "GenerationResult"]
