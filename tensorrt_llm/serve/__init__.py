"""An OpenAI-compatible HTTP server over the LLM API (trtllm-serve, commands/serve.py)."""
from .openai_server import OpenAIServer

__all__ = ["OpenAIServer"]
