"""What every fuzzer here checks: a case ends in a clean result or the project's own error.

`outcome(fn)` runs one case under a wall-clock limit. It returns "ok" or the TrtLlmError's
class name; any other exception, or a case that runs past the limit (a hang), fails the test
with the case's description. Each fuzzer's case count is bounded so the whole fuzzer runs in
about a minute on 2 cores; TRTLLM_FUZZ_EXAMPLES multiplies it (e.g. 10 for a long local run).
"""
from __future__ import annotations

import os
import signal
import traceback
from contextlib import contextmanager

from hypothesis import HealthCheck, event, settings
from hypothesis.errors import InvalidArgument

from tensorrt_llm.errors import TrtLlmError

CASE_SECONDS = 30


def fuzz_settings(examples: int):
    scale = float(os.environ.get("TRTLLM_FUZZ_EXAMPLES", "1"))
    return settings(max_examples=max(1, int(examples * scale)), deadline=None, database=None,
                    derandomize=not os.environ.get("TRTLLM_FUZZ_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise Hang(f"no result after {seconds} s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(fn, describe: str = "") -> str:
    """'ok' or the name of the TrtLlmError raised; anything else fails with the case named.
    Under hypothesis the result is recorded as an event (pytest --hypothesis-show-statistics)."""
    result = _outcome(fn, describe)
    try:
        event(result)
    except InvalidArgument:  # not inside a hypothesis test
        pass
    return result


def _outcome(fn, describe: str) -> str:
    try:
        with time_limit(CASE_SECONDS):
            fn()
    except TrtLlmError as e:
        assert str(e).strip(), f"{describe}: {type(e).__name__} without a message"
        # the error's kind and the first words of its reason: which check caught the case
        return f"{type(e).__name__}: {' '.join(str(e).split()[1:4])[:40]}"
    except Hang as e:
        raise AssertionError(f"{describe}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the property under test
        raise AssertionError(f"{describe}: {type(e).__name__} escaped instead of a TrtLlmError:\n"
                             f"{traceback.format_exc()}") from None
    return "ok"
