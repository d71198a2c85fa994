"""The ops: each op's one definition (op.py says what that holds), by family.

    from tensorrt_llm.ops import OPS
    OPS["rms_norm"](x, w, eps=1e-6)            # adds a layer (the shape rule); also F.rms_norm
    OPS["rms_norm"].reference(x, w, eps=1e-6)  # the meaning, on torch tensors
    implementations(torch.device("cuda"))      # op -> {"cuda": ..., "reference": ...}

This package sits below the builder and the runtime, which choose among the implementations
registered here; `tensorrt_llm.functional` is every op by name, and `tensorrt_llm.kernels`
the compiled kernels as torch.library custom ops.
"""
from ..network import Tensor
from . import (  # noqa: F401
    activation,
    attention,
    attention_cuda,
    comm,
    elementwise,
    fp8_linear,
    linear,
    norm,
    quantized_linear,
    rotary,
    tensor,
)
from .op import (
    CPU,
    CUDA,
    IMPLEMENTATION_ATTR,
    IMPLEMENTATIONS,
    OP_SIGNATURES,
    OPS,
    REFERENCE,
    Op,
    call_arguments,
    default_implementations,
    define,
    implementations,
    record_signature,
    references,
    signature_of,
)
from .rotary import rope_cos_sin_cache, rope_inv_freq

__all__ = [
    "CPU", "CUDA", "IMPLEMENTATION_ATTR", "IMPLEMENTATIONS", "OPS", "OP_SIGNATURES", "REFERENCE", "Op",
    "call_arguments", "default_implementations", "define",
    "implementations", "record_signature", "references", "rope_cos_sin_cache", "rope_inv_freq", "signature_of",
]

# ---- Tensor's operators ----------------------------------------------------------------------
# network.Tensor is the graph's handle; the ops are its operators and method forms here, so
# that the graph layer below knows no op.

_TENSOR_METHODS = {
    "__add__": OPS["add"], "__radd__": lambda self, other: OPS["add"](other, self),
    "__sub__": OPS["sub"], "__rsub__": lambda self, other: OPS["sub"](other, self),
    "__mul__": OPS["mul"], "__rmul__": lambda self, other: OPS["mul"](other, self),
    "__truediv__": OPS["div"], "__rtruediv__": lambda self, other: OPS["div"](other, self),
    "__matmul__": OPS["matmul"], "__neg__": lambda self: OPS["mul"](self, -1), "__pow__": OPS["pow"],
    "view": OPS["view"], "permute": OPS["permute"], "transpose": OPS["transpose"], "unsqueeze": OPS["unsqueeze"],
    "squeeze": OPS["squeeze"], "cast": OPS["cast"], "split": OPS["split"],
}
for _name, _method in _TENSOR_METHODS.items():
    setattr(Tensor, _name, _method)
