"""The project's error classes: what a user's input or file can make go wrong.

Every error a user can cause (a bad engine, checkpoint, config, request or option) is a
`TrtLlmError`; the CLIs print it as one `error: ...` line (tensorrt_llm/cli.py). Anything
else that escapes is a bug in this project and keeps its traceback. The classes that replace
a former ValueError also derive from ValueError, so existing callers' `except ValueError`
keeps working.
"""
from __future__ import annotations


class TrtLlmError(Exception):
    """Base of every error a user's input can cause; the message is one line that says what to do."""


class EngineError(TrtLlmError, RuntimeError):
    """An engine that cannot be used as it is: the message says what to rebuild."""


class CheckpointError(TrtLlmError, ValueError):
    """A checkpoint, model folder, GGUF or safetensors file that cannot be converted or loaded."""


class ConfigError(TrtLlmError, ValueError):
    """A configuration (BuildConfig, PretrainedConfig, an option) outside what is supported."""


class RequestError(TrtLlmError, ValueError):
    """A generation request whose inputs or parameters are refused before any work."""
