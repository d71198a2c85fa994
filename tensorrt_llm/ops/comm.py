"""Communication between the ranks of a multi-rank engine: allreduce and allgather over the
tensor-parallel group, send and recv between pipeline stages.

They run on torch.distributed (NCCL for CUDA tensors, gloo for CPU ones) in the groups
`tensorrt_llm.distributed.init` made for the engine's mapping; their references are their only
implementation, on every device, and can be captured in a CUDA graph (NCCL collectives and
point-to-point calls are, once the communicator exists: `distributed.init` runs a first
collective). A failed or timed-out call raises `DistributedError` naming this rank.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import distributed
from .._utils import canonical_dtype, str_dtype_to_torch
from ..network import Tensor
from .op import REFERENCE, add_layer, check_int, define, norm_dim


@define
def allreduce(x: Tensor) -> Tensor:
    """Sum over the tensor-parallel group (identity at world size 1)."""
    return add_layer("allreduce", [x], [(x.dtype, x.shape)])


@allreduce.implementation(REFERENCE)
def allreduce_reference(x):
    """Sum over this process's tensor-parallel group once torch.distributed runs."""
    if not distributed.is_initialized():
        return x
    out = x.clone()
    try:
        torch.distributed.all_reduce(out, group=distributed.tp_group())
    except Exception as e:
        raise distributed.failed("allreduce", e) from None
    return out


@define
def allgather(x: Tensor, *, dim: int, group_size: int) -> Tensor:
    """The tensor-parallel group's `x`es concatenated along `dim`, rank order (the vocabulary
    slices of a parallel LM head). `group_size` is the group's size, known when the network
    is built."""
    dim = norm_dim("allgather", dim, x.ndim)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"allgather: group_size must be a positive integer, got {group_size!r}")
    shape = list(x.shape)
    if shape[dim] != -1:
        shape[dim] *= group_size
    return add_layer("allgather", [x], [(x.dtype, tuple(shape))], dim=dim, group_size=group_size)


@allgather.implementation(REFERENCE)
def allgather_reference(x, *, dim, group_size):
    if group_size == 1:
        return x
    group = distributed.tp_group()
    if group is None or torch.distributed.get_world_size(group) != group_size:
        raise distributed.DistributedError(
            f"allgather over {group_size} ranks needs a process group of {group_size} ranks "
            f"(launch the engine's ranks with torchrun or mpirun)")
    x = x.contiguous()
    try:
        if torch.distributed.get_backend(group) == "nccl":
            # One buffer, one collective (CUDA-graph friendly); slices stacked on a new dim 0.
            out = torch.empty((group_size,) + tuple(x.shape), dtype=x.dtype, device=x.device)
            torch.distributed.all_gather_into_tensor(out, x, group=group)
            parts = out.unbind(0)
        else:
            parts = [torch.empty_like(x) for _ in range(group_size)]
            torch.distributed.all_gather(parts, x, group=group)
    except Exception as e:
        raise distributed.failed("allgather", e) from None
    return torch.cat(parts, dim=dim)


@define(side_effects=True)
def send(x: Tensor, *, peer: int) -> Tensor:
    """Send `x` to global rank `peer` (the next pipeline stage); returns `x`, which a later
    `recv` may take as `after` to be ordered behind the send."""
    if not isinstance(peer, int) or peer < 0:
        raise ValueError(f"send: peer must be a rank (an integer >= 0), got {peer!r}")
    return add_layer("send", [x], [(x.dtype, x.shape)], peer=peer)


@send.implementation(REFERENCE)
def send_reference(x, *, peer):
    try:
        torch.distributed.send(x.contiguous(), dst=peer)
    except Exception as e:
        raise distributed.failed(f"sending to rank {peer}", e) from None
    return x


@define(side_effects=True)
def recv(like: Tensor, after: Optional[Tensor] = None, *, peer: int, dtype: str,
         tail: Sequence[int]) -> Tensor:
    """Receive from global rank `peer` a tensor [like.shape[0], *tail] of `dtype` (`like`: a
    tensor of this step with as many rows, e.g. input_ids). `after`: an output of this rank's
    own `send`, so the receive is ordered after it."""
    check_int("recv", like, "like")
    if not isinstance(peer, int) or peer < 0:
        raise ValueError(f"recv: peer must be a rank (an integer >= 0), got {peer!r}")
    tail = [int(d) for d in tail]
    if any(d < 1 for d in tail):
        raise ValueError(f"recv: tail dims must be positive, got {tail}")
    dtype = canonical_dtype(dtype)
    return add_layer("recv", [like, after], [(dtype, (like.shape[0], *tail))], peer=peer, dtype=dtype,
                     tail=tail)


@recv.implementation(REFERENCE)
def recv_reference(like, after=None, *, peer, dtype, tail):
    out = torch.empty((like.shape[0], *tail), dtype=str_dtype_to_torch(dtype), device=like.device)
    try:
        torch.distributed.recv(out, src=peer)
    except Exception as e:
        raise distributed.failed(f"receiving from rank {peer}", e) from None
    return out
