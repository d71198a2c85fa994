"""tensorrt_llm: convert, build and run LLMs on our own engine backend."""
from . import functional
from .builder import BuildConfig, Engine, build
from .llmapi import LLM, SamplingParams
from .mapping import Mapping
from .module import Module, ModuleList
from .network import Network, default_net, net_guard
from .parameter import Parameter
from .version import __version__

__all__ = ["Network", "net_guard", "default_net", "Module", "ModuleList", "Parameter", "functional",
           "BuildConfig", "Engine", "build", "Mapping", "LLM", "SamplingParams", "__version__"]
