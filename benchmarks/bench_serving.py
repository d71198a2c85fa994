"""Online serving benchmark of trtllm-serve (or any OpenAI-compatible server): what vLLM's
benchmark_serving.py measures.

    # a server already running
    python benchmarks/bench_serving.py --base_url http://127.0.0.1:8000 --num_prompts 200 --request_rate 4
    # start trtllm-serve on a model (engine folder, checkpoint, Hugging Face folder or GGUF) for the run
    python benchmarks/bench_serving.py --model engines/llama-3.1-8b --num_prompts 500 --request_rate 1 4 16 inf

Requests: --num_prompts prompts of --input_len random token ids (seeded), each asking for
--output_len tokens (exactly: ignore_eos), or with --range_ratio R lengths drawn uniformly from
[len * (1 - R), len * (1 + R)]. They go to POST /v1/completions as token-id prompts, streamed
(stream_options.include_usage), arriving as a Poisson process at --request_rate requests/s ("inf":
all at once); several rates make a sweep, each rate one run on the same prompts. --max_concurrency
caps the requests in flight.

Per request: TTFT (time to the first text), ITL (the gaps between later text chunks), TPOT
((latency - TTFT) / (output tokens - 1)) and end-to-end latency; per run: request and token
throughput and each latency's mean, median and p99, and the failed requests (with the first
errors). A table is printed per run (and one line per rate for a sweep); everything is written
to --output_json. Exit code 1 when a run completes no request.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

READY = re.compile(r"trtllm-serve: serving \S+ at (http://\S+) ")


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int               # asked for
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    prompt_tokens: int = 0        # as the server's usage counted them
    output_tokens: int = 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base_url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--model", help="start trtllm-serve on this model for the run (a loopback port)")
    p.add_argument("--served_model_name", default=None, help="the model's name in requests (default: the server's)")
    p.add_argument("--serve_args", default="", help="more trtllm-serve options with --model, e.g. "
                                                     "'--max_batch_size 64 --max_num_tokens 8192'")
    p.add_argument("--tokenizer", default=None, help="for the vocabulary size (default: --model's)")
    p.add_argument("--vocab_size", type=int, default=None,
                   help="token ids are drawn below this (default: the tokenizer's; 32000 without one)")
    p.add_argument("--num_prompts", type=int, default=100)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--output_len", type=int, default=128)
    p.add_argument("--range_ratio", type=float, default=0.0, help="0: fixed lengths; R: uniform in len*(1±R)")
    p.add_argument("--request_rate", nargs="+", default=["inf"],
                   help="requests/s of the Poisson arrivals, or inf; several values: a sweep")
    p.add_argument("--max_concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--num_warmups", type=int, default=1, help="requests sent (and not counted) before each run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api_key", default=os.environ.get("TRTLLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take")
    p.add_argument("--output_json", default="bench_serving.json")
    args = p.parse_args(argv)
    try:
        args.request_rate = [float(r) for r in args.request_rate]
    except ValueError:
        p.error(f"--request_rate takes numbers or inf, got {args.request_rate}")
    if any(r <= 0 for r in args.request_rate):
        p.error("--request_rate must be > 0")
    if args.num_prompts < 1 or args.input_len < 1 or args.output_len < 1:
        p.error("--num_prompts, --input_len and --output_len must be >= 1")
    if not 0 <= args.range_ratio < 1:
        p.error("--range_ratio must be in [0, 1)")
    return args


# -- the requests ---------------------------------------------------------------------------


def vocab_size(args) -> int:
    """Token ids of the prompts are drawn below this: --vocab_size, else the tokenizer's
    (--tokenizer, else --model's: an engine folder built from a model holds its tokenizer)."""
    if args.vocab_size:
        return args.vocab_size
    source = args.tokenizer or args.model
    if source is not None:
        from tensorrt_llm.tokenizer_utils import load_tokenizer
        try:
            return len(load_tokenizer(source))
        except (OSError, ValueError) as e:
            print(f"bench_serving: no tokenizer in {source} ({e}); drawing ids below 32000", file=sys.stderr)
    return 32000


def make_requests(args, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request, the same for every rate of a sweep."""
    rng = np.random.default_rng(args.seed)

    def lengths(n: int) -> np.ndarray:
        lo, hi = max(1, int(n * (1 - args.range_ratio))), max(1, int(n * (1 + args.range_ratio)))
        return rng.integers(lo, hi + 1, size=args.num_prompts)

    inputs, outputs = lengths(args.input_len), lengths(args.output_len)
    return [(rng.integers(0, vocab, size=int(n)).tolist(), int(m)) for n, m in zip(inputs, outputs)]


async def send(session, url: str, model: str, prompt: list[int], output_len: int, headers: dict,
               timeout: float) -> RequestResult:
    import aiohttp
    result = RequestResult(len(prompt), output_len)
    payload = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=payload, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return result
            async for line in response.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", ())):
                    now = time.perf_counter()
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        result.ok = result.ttft > 0 and result.output_tokens > 0
        if not result.ok:
            result.error = "the stream ended without text or usage"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


async def run_at_rate(args, url: str, model: str, requests: list[tuple[list[int], int]], rate: float):
    import aiohttp
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rng = random.Random(args.seed)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap beyond --max_concurrency
    async with aiohttp.ClientSession(connector=connector) as session:
        for prompt, n in requests[:args.num_warmups]:
            warm = await send(session, url, model, prompt, min(n, 16), headers, args.timeout)
            if not warm.ok:
                print(f"bench_serving: the warm-up request failed: {warm.error}", file=sys.stderr)

        async def one(prompt, n):
            if limit is None:
                return await send(session, url, model, prompt, n, headers, args.timeout)
            async with limit:
                return await send(session, url, model, prompt, n, headers, args.timeout)

        tasks = []
        start = time.perf_counter()
        for prompt, n in requests:
            tasks.append(asyncio.ensure_future(one(prompt, n)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return results, duration


# -- the figures ----------------------------------------------------------------------------


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    a = np.asarray(values) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def _rate(rate: float):
    """A rate as JSON can hold it."""
    return "inf" if rate == float("inf") else rate


def summarize(results: list[RequestResult], duration: float, rate: float) -> dict:
    done = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in done)
    inputs = sum(r.prompt_tokens for r in done)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "request_rate": _rate(rate), "duration_s": duration, "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": inputs, "total_output_tokens": output,
        "request_throughput": len(done) / duration, "output_throughput": output / duration,
        "total_token_throughput": (inputs + output) / duration,
        "ttft_ms": _stats([r.ttft for r in done]),
        "tpot_ms": _stats([(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]),
        "itl_ms": _stats([gap for r in done for gap in r.itl]),
        "e2el_ms": _stats([r.latency for r in done]),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
    }


def print_run(s: dict) -> None:
    rate = f"{s['request_rate']:g}" if s["request_rate"] != "inf" else "inf"
    rows = [("Request rate (req/s)", rate), ("Successful requests", s["completed"]),
            ("Failed requests", s["failed"]), ("Benchmark duration (s)", f"{s['duration_s']:.2f}"),
            ("Total input tokens", s["total_input_tokens"]), ("Total output tokens", s["total_output_tokens"]),
            ("Request throughput (req/s)", f"{s['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{s['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{s['total_token_throughput']:.2f}")]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize() if stat != 'p99' else 'P99'} {name} (ms)", f"{s[key][stat]:.2f}"))
    print("=" * 22 + " Serving Benchmark Result " + "=" * 22)
    for name, value in rows:
        print(f"{name:<40}{value:>30}")
    for error, count in s["errors"].items():
        print(f"  failed x{count}: {error[:200]}")
    print("=" * 70, flush=True)


def print_sweep(summaries: list[dict]) -> None:
    head = (f"{'rate':>6} {'done':>6} {'fail':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT mean/p50/p99 ms':>24} "
            f"{'TPOT mean/p50/p99 ms':>24} {'ITL mean/p50/p99 ms':>24}")
    print(head)
    for s in summaries:
        rate = f"{s['request_rate']:g}" if s["request_rate"] != "inf" else "inf"
        lat = [f"{s[k]['mean']:.1f}/{s[k]['median']:.1f}/{s[k]['p99']:.1f}" for k in ("ttft_ms", "tpot_ms", "itl_ms")]
        print(f"{rate:>6} {s['completed']:>6} {s['failed']:>5} {s['request_throughput']:>7.2f} "
              f"{s['output_throughput']:>10.1f} {lat[0]:>24} {lat[1]:>24} {lat[2]:>24}", flush=True)


# -- the server -----------------------------------------------------------------------------


class Server:
    """trtllm-serve on a loopback port for the run, its output in a temporary file."""

    def __init__(self, model: str, extra: list[str], timeout: float = 1800.0):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="trtllm-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "tensorrt_llm.commands.serve", model, "--host", "127.0.0.1", "--port", "0",
               "--log_level", "warning", *extra]
        print(f"bench_serving: starting {' '.join(cmd)} (log: {self.log.name})", flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            text = Path(self.log.name).read_text(errors="replace")
            match = READY.search(text)
            if match:
                self.url = match.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"bench_serving: trtllm-serve did not start:\n{text[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def served_model(url: str, api_key: Optional[str]) -> str:
    import urllib.request
    request = urllib.request.Request(f"{url}/v1/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["data"][0]["id"]


def main(argv=None) -> int:
    args = parse_args(argv)
    requests = make_requests(args, vocab_size(args))
    server = Server(args.model, args.serve_args.split()) if args.model else None
    try:
        url = (server.url if server else args.base_url).rstrip("/")
        model = args.served_model_name or served_model(url, args.api_key)
        print(f"bench_serving: {args.num_prompts} requests to {url}/v1/completions (model {model}), input "
              f"{args.input_len} / output {args.output_len} tokens, range ratio {args.range_ratio}", flush=True)
        summaries = []
        for rate in args.request_rate:
            results, duration = asyncio.run(run_at_rate(args, f"{url}/v1/completions", model, requests, rate))
            summaries.append(summarize(results, duration, rate))
            print_run(summaries[-1])
    finally:
        if server is not None:
            server.stop()
    if len(summaries) > 1:
        print_sweep(summaries)
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    config["request_rate"] = [_rate(r) for r in args.request_rate]
    Path(args.output_json).write_text(json.dumps({"config": config, "runs": summaries}, indent=2) + "\n")
    print(f"bench_serving: wrote {args.output_json}")
    return 0 if all(s["completed"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
