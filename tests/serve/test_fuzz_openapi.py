"""Schemathesis fuzzes the live server from its own OpenAPI schema (/openapi.json): bodies that fit
the schema and bodies that break it, for every operation. No answer may be a 5xx.

Bounded: a fixed number of cases per operation and mode, derandomized (the same cases every run,
so CI is stable), and each case made cheap to run before it is sent: max_tokens at most 4 (4 when
none is given), n at most 2, at most 2 prompts (the values' types are left alone, so a negative
case stays negative); a positive case names the served model.
"""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

from .conftest import MODEL_NAME  # noqa: E402

CASES_PER_OPERATION = {"POST": 50, "GET": 10}   # per generation mode
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2, "min_tokens": 4, "best_of": 2}


def _cheap(body, path: str, positive: bool):
    """Large counts cut down (only where they are integers), a length given where none is (chat's
    default is the rest of the context); a positive case names the served model (else nearly all
    would stop at 404)."""
    if isinstance(body, dict):
        if positive and isinstance(body.get("model"), str):
            body["model"] = MODEL_NAME
        length = "max_tokens" if path == "/v1/completions" else "max_completion_tokens"
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body[length] = CAPS[length]
        for key, cap in CAPS.items():
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                body[key] = cap
        for key in ("prompt", "messages"):
            if isinstance(body.get(key), list) and len(body[key]) > 2:
                body[key] = body[key][:2]
    return body


def test_openapi_fuzzing_finds_no_server_error(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    tried, statuses, server_errors = 0, {}, []
    start = time.perf_counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=CASES_PER_OPERATION.get(operation.method.upper(), 10), deadline=None,
                      derandomize=True, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                nonlocal tried
                case.body = _cheap(case.body, case.path, mode is GenerationMode.POSITIVE)
                response = case.call(base_url=server.url, timeout=120)
                tried += 1
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    server_errors.append(f"{case.method} {case.path} {case.body!r} -> {response.status_code} "
                                         f"{response.text[:300]}")

            try:
                run()
            except Unsatisfiable:
                # Nothing in a request without a body can break the schema (any path string is a name).
                if mode is not GenerationMode.NEGATIVE or operation.method.upper() == "POST":
                    raise
    wall = time.perf_counter() - start
    print(f"\nOpenAPI fuzzing: {tried} cases over {len(list(schema.get_all_operations()))} operations in {wall:.0f} s; "
          f"statuses {dict(sorted(statuses.items()))}; {len(server_errors)} 5xx")
    assert tried >= 100
    assert not server_errors, "\n".join(server_errors[:10])
    assert any(400 <= s < 500 for s in statuses) and 200 in statuses  # both kinds of case reached the server
