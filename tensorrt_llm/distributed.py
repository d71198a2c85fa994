"""The processes of a multi-rank engine: who this process is, and its torch.distributed groups.

A tensor- or pipeline-parallel engine runs one process per rank (docs/architecture.md,
"Multi-rank engines"). Each finds its rank from its launcher's environment:

- torchrun (and anything speaking its protocol): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  MASTER_PORT;
- mpirun (Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; MPICH and Intel MPI: PMI_RANK /
  PMI_SIZE / MPI_LOCALRANKID): the rendezvous address comes from MASTER_ADDR / MASTER_PORT when
  set, else rank 0 chooses one and mpi4py broadcasts it.

`init(mapping, device)` joins the process group (NCCL for a CUDA device, gloo for the CPU)
with a timeout on every collective (TRTLLM_DIST_TIMEOUT seconds, default 300), so a rank whose
peer died ends with an error instead of hanging, and makes the tensor- and pipeline-parallel
groups of the mapping. The graph's communication ops (ops/comm.py) read the groups from here.

NVLink multicast stays off in every process that imports this module and in every process it
starts (they inherit the environment): NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1; nothing here uses PyTorch's symmetric memory.
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
from dataclasses import dataclass
from typing import Optional

import torch

from .errors import ConfigError, TrtLlmError
from .logger import logger
from .mapping import Mapping

# NVLink SHARP / multicast off, for NCCL, PyTorch's symmetric memory and NVSHMEM.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
DEFAULT_TIMEOUT_S = 300.0


def disable_multicast(env=None) -> None:
    """Set the NO_MULTICAST_ENV variables in `env` (default os.environ); a different value is
    overridden, with a warning."""
    env = os.environ if env is None else env
    for key, value in NO_MULTICAST_ENV.items():
        if env.get(key, value) != value:
            logger.warning(f"{key}={env[key]} overridden to {value}: NVLink multicast stays off")
        env[key] = value


disable_multicast()


class DistributedError(TrtLlmError, RuntimeError):
    """A collective with the other ranks failed: a rank died, timed out, or was never started."""


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun", "mpirun" or "none"


def _int_env(env, *names) -> Optional[int]:
    for name in names:
        if env.get(name, "") != "":
            try:
                return int(env[name])
            except ValueError:
                raise ConfigError(f"{name}={env[name]!r} is not an integer") from None
    return None


def launch_info(env=None) -> LaunchInfo:
    """This process's rank, world size and local rank, from the launcher's environment
    (a single process: rank 0 of 1)."""
    env = os.environ if env is None else env
    for launcher, rank_keys, size_keys, local_keys in (
            ("torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",)),
            ("mpirun", ("OMPI_COMM_WORLD_RANK", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
             ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MPI_LOCAL_RANK"))):
        rank, size = _int_env(env, *rank_keys), _int_env(env, *size_keys)
        if rank is None or size is None:
            continue
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"{launcher}'s environment gives rank {rank} of {size} processes")
        local = _int_env(env, *local_keys)
        return LaunchInfo(rank, size, rank if local is None else local, launcher)
    return LaunchInfo(0, 1, 0, "none")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _mpi_rendezvous(env) -> None:
    """MASTER_ADDR / MASTER_PORT for an mpirun launch: rank 0's host and a free port of it,
    broadcast with mpi4py (unless both are set already)."""
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return
    try:
        from mpi4py import MPI
    except ImportError:
        raise ConfigError("launched by mpirun without MASTER_ADDR / MASTER_PORT: install mpi4py "
                          "(rank 0 then chooses the address) or set both") from None
    comm = MPI.COMM_WORLD
    addr = None
    if comm.Get_rank() == 0:
        host = env.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        addr = (host, env.get("MASTER_PORT") or str(_free_port()))
    env["MASTER_ADDR"], env["MASTER_PORT"] = comm.bcast(addr, root=0)
    local = _int_env(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    if env["MASTER_ADDR"].startswith("127.") and local is not None and local < comm.Get_size():
        raise ConfigError(f"rank 0's host name resolves to {env['MASTER_ADDR']}, which the other machines "
                          f"cannot reach: set MASTER_ADDR to its address (mpirun -x MASTER_ADDR=...)")


def timeout_seconds(env=None) -> float:
    env = os.environ if env is None else env
    value = env.get("TRTLLM_DIST_TIMEOUT", "")
    try:
        seconds = float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"TRTLLM_DIST_TIMEOUT={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ConfigError(f"TRTLLM_DIST_TIMEOUT must be > 0 seconds, got {value!r}")
    return seconds


class _State:
    mapping: Optional[Mapping] = None
    backend: Optional[str] = None
    tp_group = None
    pp_group = None
    logits_group = None  # the pipeline group's twin that carries the logits back (pipeline.py)
    cpu_group = None  # gloo over the world: host-side agreement (ints, objects)
    groups: dict = {}  # (kind, ranks) -> group, made once per process


_state = _State()


def is_initialized() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return torch.distributed.get_world_size() if is_initialized() else 1


def rank() -> int:
    return torch.distributed.get_rank() if is_initialized() else 0


def device_for(info: LaunchInfo, device=None) -> torch.device:
    """The device of this rank: `device` as given, else its local GPU where there are GPUs,
    else the CPU. A bare "cuda" becomes this rank's local GPU."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", info.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _group(kind: str, ranks: list[int], backend: str):
    """The group of `ranks`; every rank calls this for every group in the same order
    (torch.distributed.new_group is collective over the whole world)."""
    key = (kind, tuple(ranks), backend)
    if key not in _state.groups:
        _state.groups[key] = torch.distributed.new_group(ranks, backend=backend)
    return _state.groups[key]


def join(device: torch.device, info: Optional[LaunchInfo] = None) -> None:
    """Join the process group of this launch's ranks (once per process): NCCL for a CUDA
    device, gloo for the CPU, with TRTLLM_DIST_TIMEOUT on every collective."""
    info = info or launch_info()
    dist = torch.distributed
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not is_initialized():
        if info.launcher == "mpirun":
            _mpi_rendezvous(os.environ)
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(key):
                raise ConfigError(f"{key} is not set: launch the ranks with torchrun or mpirun "
                                  f"(or set MASTER_ADDR and MASTER_PORT)")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = datetime.timedelta(seconds=timeout_seconds())
        try:
            kwargs = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group(backend, init_method="env://", rank=info.rank,
                                    world_size=info.world_size, timeout=timeout, **kwargs)
        except Exception as e:  # a peer that never came, a port in use
            raise DistributedError(f"rank {info.rank}: joining {info.world_size} ranks at "
                                   f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} failed: "
                                   f"{' '.join(str(e).split())[:300]}") from None
        atexit.register(shutdown)
        _state.backend = backend
        logger.info(f"rank {info.rank} of {info.world_size} joined ({backend}, timeout {timeout})")
        # Host-side agreement (pool sizes, seeds, commands) over gloo, whatever the device.
        _state.cpu_group = _group("cpu", list(range(info.world_size)), "gloo")
    elif dist.get_backend() != backend:
        raise ConfigError(f"torch.distributed runs {dist.get_backend()}, but a {device.type} engine needs {backend}")


def init(mapping: Mapping, device: torch.device, info: Optional[LaunchInfo] = None) -> None:
    """Join the process group of `mapping.world_size` ranks (once per process) and make the
    tensor- and pipeline-parallel groups of `mapping` current. A world of one does nothing."""
    if mapping.world_size == 1:
        _state.mapping = mapping
        return
    join(device, info)
    dist = torch.distributed
    backend = _state.backend or dist.get_backend()
    if dist.get_world_size() != mapping.world_size or dist.get_rank() != mapping.rank:
        raise ConfigError(f"this process is rank {dist.get_rank()} of {dist.get_world_size()}, "
                          f"not the mapping's rank {mapping.rank} of {mapping.world_size}")
    # Every group of the mapping, made in one order on every rank.
    tp_groups = [[p * mapping.tp_size + t for t in range(mapping.tp_size)] for p in range(mapping.pp_size)]
    pp_groups = [[p * mapping.tp_size + t for p in range(mapping.pp_size)] for t in range(mapping.tp_size)]
    tp = {tuple(r): _group("tp", r, backend) for r in tp_groups}
    pp = {tuple(r): _group("pp", r, backend) for r in pp_groups}
    _state.tp_group = tp[tuple(mapping.tp_group)]
    _state.pp_group = pp[tuple(mapping.pp_group)]
    # The logits go back to the earlier stages on a communicator of their own: NCCL runs one
    # communicator's operations in issue order, so sharing the hidden states' would queue a
    # stage's next send behind its wait for the logits.
    logits = {tuple(r): _group("pp_logits", r, backend) for r in pp_groups} if mapping.pp_size > 1 else {}
    _state.logits_group = logits.get(tuple(mapping.pp_group))
    _state.mapping = mapping
    # The first collective outside any CUDA graph capture (NCCL sets its communicators up here).
    barrier()


def tp_group():
    """The tensor-parallel group of this process (None: no process group)."""
    return _state.tp_group if is_initialized() else None


def pp_group():
    return _state.pp_group if is_initialized() else None


def logits_group():
    """The group of this process's pipeline stages that carries the logits from the last stage
    to the earlier ones (None: no pipeline)."""
    return _state.logits_group if is_initialized() else None


def failed(what: str, e: Exception) -> DistributedError:
    """The error of a failed collective: which rank, what, and the backend's words."""
    return DistributedError(f"rank {rank()}: {what} with the other ranks failed (a rank exited, or "
                            f"none answered within TRTLLM_DIST_TIMEOUT={timeout_seconds():g} s): "
                            f"{' '.join(str(e).split())[:300]}")


def barrier() -> None:
    if is_initialized():
        try:
            torch.distributed.barrier(group=_state.cpu_group)
        except Exception as e:
            raise failed("a barrier", e) from None


def agree_min(value: int) -> int:
    """The smallest of every rank's `value` (a pool size each rank measured on its own GPU)."""
    if not is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    try:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=_state.cpu_group)
    except Exception as e:
        raise failed("agreeing on a value", e) from None
    return int(t.item())


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s `obj` on every rank (pickled, over the host group)."""
    if not is_initialized():
        return obj
    box = [obj]
    try:
        torch.distributed.broadcast_object_list(box, src=src, group=_state.cpu_group)
    except Exception as e:
        raise failed("a broadcast", e) from None
    return box[0]


def shutdown() -> None:
    """Leave the process group (at exit, or before a new one)."""
    if is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except Exception:  # a peer already gone: nothing left to tidy
            pass
    _state.tp_group = _state.pp_group = _state.logits_group = _state.cpu_group = _state.mapping = None
    _state.groups = {}
