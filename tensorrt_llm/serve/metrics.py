"""The server's Prometheus metrics (GET /metrics), in a registry of its own (so that several
servers in one process, as in tests, keep theirs apart).

Gauges are read from the engine when scraped: requests running (in the executor's batch) and
waiting (admitted by the server, not yet in the batch), KV-cache blocks used and total. Counters
and histograms are kept as requests run: prompt and generated tokens (as `usage` counts them),
finished completions by finish reason, time to first token, time per output token after the
first, and end-to-end latency, all per completion (a request with n=2 is two).
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

PREFIX = "trtllm"

# vLLM's buckets: a GPU serves tokens in milliseconds, a CPU in tens of them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0)


class EngineCollector:
    """The gauges, read at scrape time from `read()`: {name: (help, value)}."""

    def __init__(self, read: Callable[[], dict[str, tuple[str, float]]]):
        self.read = read

    def collect(self):
        for name, (doc, value) in self.read().items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class ServerMetrics:

    def __init__(self, read_engine: Callable[[], dict[str, tuple[str, float]]]):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(read_engine))
        r = self.registry
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "tokens generated", registry=r)
        self.finished = Counter(f"{PREFIX}_request_finished", "completions finished, by finish reason "
                                "(stop, length, abort: the client left or the server stopped, error)",
                                ["finish_reason"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "arrival to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(f"{PREFIX}_time_per_output_token_seconds",
                              "mean time per output token after the first, per completion",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds", "arrival to last token",
                             buckets=E2E_BUCKETS, registry=r)

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_finish(self, reason: str, num_tokens: int, ttft: float | None, e2e: float) -> None:
        self.finished.labels(finish_reason=reason).inc()
        if reason in ("stop", "length"):
            self.e2e.observe(e2e)
            if ttft is not None and num_tokens > 1:
                self.tpot.observe((e2e - ttft) / (num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
