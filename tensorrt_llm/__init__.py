"""tensorrt_llm: convert, build and run LLMs on our own engine backend."""
from . import functional
from .module import Module, ModuleList
from .network import Network, default_net, net_guard
from .parameter import Parameter
from .version import __version__

# Build and runtime entry points (builder.py, mapping.py, runtime/) are exported here:
# build, BuildConfig, Engine, Mapping.

__all__ = ["Network", "net_guard", "default_net", "Module", "ModuleList", "Parameter", "functional",
           "__version__"]
