"""A CPU decode step recorded once and replayed: the CPU's counterpart of a CUDA graph.

On the CPU a decode step of a small model is mostly Python: some 250 op calls, each a few
microseconds of argument handling around a host kernel of tens. A tape runs the step once while
recording, in order, every host-kernel call (its arguments converted once, ops/launch.py) and
every PyTorch op that computes something (in its `out=` form, writing into the tensor the
recorded step made); replaying it makes those calls again and nothing else, on the same
tensors, which the tape keeps alive. Views and allocations need no replay: their tensors stay
where they are. Host-kernel calls in a row are bound and checked once, at capture
(bindings.prepare_host_calls), and replayed by one call.

What cannot be replayed is refused at capture, with the reason: a PyTorch op that reads a
value back into Python (`.item()`), or makes a new tensor and has no `out=` form, or a tape
whose first replay (on the recorded inputs) fails or gives another output. A value read
that PyTorch does not dispatch (`.tolist()`) would be frozen into the tape unseen, so the first
replays of every tape are checked against the step run as usual (DecodeGraphs: VERIFY_STEPS).
"""
from __future__ import annotations

import builtins
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..ops import launch as launch_module


class TapeRefused(RuntimeError):
    """The step does something a tape cannot replay."""


# Allocations: their contents are undefined until an op writes them, which the tape replays.
_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                torch.ops.aten.empty_strided.default}


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    """Appends each computing PyTorch op of the step to `entries` as (op, args, kwargs, None),
    the list launch() appends the host calls to: one list, in the step's order."""

    def __init__(self, entries: list):
        super().__init__()
        self.entries = entries
        self.refused: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refused is not None or func in _ALLOCATIONS:
            return out
        outputs = _tensors(out)
        if not outputs:
            self.refused = f"{func} reads a value into Python"
        elif func._schema.is_mutable:  # in place, or an out= form: it writes what it is given again
            self.entries.append((func, args, kwargs, None))
        elif {_storage(t) for t in outputs} <= {_storage(t) for t in _tensors(args) + _tensors(list(kwargs.values()))}:
            pass  # a view: its tensor stays a view of the same memory
        elif isinstance(out, torch.Tensor) and hasattr(func.overloadpacket, "out"):
            self.entries.append((func.overloadpacket.out, args, dict(kwargs, out=out), None))
        else:
            self.refused = f"{func} makes a new tensor and has no out= form"
        return out


def _prepared(entries: list) -> list[tuple[Callable, tuple, dict]]:
    """The recorded entries as the replay makes them: each run of host-kernel calls in a row
    bound and checked once (bindings.prepare_host_calls), one call from Python, where each of
    them spent several microseconds binding its arguments again; PyTorch's ops as recorded."""
    calls: list[tuple[Callable, tuple, dict]] = []
    run: list[tuple[str, tuple, dict]] = []
    for fn, args, kwargs, tensors in entries:
        # tensors: a launch() of a binding entry (the bindings are there), None: a PyTorch op
        if tensors is not None and fn.__name__ in launch_module.get_bindings().HOST_ENTRIES:
            run.append((fn.__name__, args, kwargs))
            continue
        if run:
            calls.append((launch_module.get_bindings().prepare_host_calls(run), (), {}))
            run = []
        calls.append((fn, args, kwargs))
    if run:
        calls.append((launch_module.get_bindings().prepare_host_calls(run), (), {}))
    return calls


class HostTape:
    """One CPU decode step, recorded by `capture` and replayed by `replay`."""

    def __init__(self):
        self.calls: list[tuple[Callable, tuple, dict]] = []
        self._keep: list = []  # the recorded calls' tensors: their memory is the tape's
        self.output: torch.Tensor | None = None  # the recorded step's output, rewritten by every replay

    def capture(self, step: Callable[[], torch.Tensor], plan_globals: dict) -> torch.Tensor:
        """Runs `step` once, recording it; returns its output, which every replay rewrites in
        place. plan_globals: the globals of the session's plan, given `__import__` while
        recording (PyTorch's dispatch to a Python mode imports through the calling frame's
        builtins, and the plan has none)."""
        entries: list = []
        recorder = _Recorder(entries)
        own_builtins = plan_globals["__builtins__"]
        plan_globals["__builtins__"] = dict(own_builtins, __import__=builtins.__import__)
        launch_module.recording = entries
        try:
            with torch.inference_mode(), recorder:
                output = step()
        finally:
            launch_module.recording = None
            plan_globals["__builtins__"] = own_builtins
        if recorder.refused is not None:
            raise TapeRefused(recorder.refused)
        self.calls = _prepared(entries)
        for _, args, kwargs, tensors in entries:
            self._keep.append((args, kwargs) if tensors is None else tensors)
        self.output = output
        # Replayed once on the same inputs: every call must go through (an out= form may refuse
        # an argument its functional form took) and give the recorded output again.
        recorded = output.clone()
        try:
            self.replay()
        except Exception as e:  # noqa: BLE001 (any failure of a recorded call refuses the tape)
            raise TapeRefused(f"its replay failed: {type(e).__name__}: {e}") from e
        if not torch.equal(output, recorded):
            raise TapeRefused("its replay gave another output on the same inputs")
        return output

    def replay(self) -> None:
        with torch.inference_mode():
            for fn, args, kwargs in self.calls:
                fn(*args, **kwargs)
