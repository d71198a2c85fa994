"""The op library: every op by name (`F.rms_norm(x, w, eps=1e-6)`, `F.linear(x, w)`), the
rotary tables, and `Tensor` (whose operators, `x + y`, `x.view(shape)`, the ops give it).

Each op is defined once, in tensorrt_llm/ops/ (its shape rule, reference and implementations;
see tensorrt_llm/ops/op.py); calling it here appends one layer to the default network, infers
its outputs' dtypes and shapes there and then, and raises ValueError naming the op and the
offending shapes/dtypes on a mismatch. Dynamic dims are -1 and propagate.

`record_signature` records the signature of an op of one's own, so that graph rewriting can
read its layers back (graph_rewriting.FLayerInfo), as every op here is recorded.
"""
from __future__ import annotations

from .network import Tensor
from .ops import OP_SIGNATURES, OPS, record_signature, rope_cos_sin_cache, rope_inv_freq

__all__ = ["OP_SIGNATURES", "Tensor", "record_signature", "rope_cos_sin_cache", "rope_inv_freq", *OPS]

# Every op, by its name.
globals().update(OPS)
