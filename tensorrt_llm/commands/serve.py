"""trtllm-serve: one model behind an OpenAI-compatible HTTP API.

    trtllm-serve SmolLM2-135M-Instruct.Q4_1.gguf --port 8000
    curl http://127.0.0.1:8000/v1/completions -H "Content-Type: application/json" \\
        -d '{"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "prompt": "The capital of France is", "max_tokens": 8}'

MODEL is what LLM(...) takes: an engine folder, a checkpoint folder, a Hugging Face folder or a
GGUF file (the last three are built once into the engine cache, $TRTLLM_CACHE_DIR). The port is
taken first, then the engine loaded; one line says where the server listens once it answers.
Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics (Prometheus), GET /version, and the OpenAPI schema at /openapi.json.

The engine runs in a child process (the LLM API's engine process, llmapi/engine_process.py);
this process serves HTTP, tokenizes and detokenizes. Ctrl-C or SIGTERM stops taking connections,
lets the running requests finish (at most --shutdown_timeout seconds, then aborts them), stops the
engine process and exits 0. If the engine process dies, open requests end with an error and
/health answers 503. A bad model or option ends in one
"error:" line (exit code 2); --debug shows its traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Optional

from ..errors import ConfigError

PROG = "trtllm-serve"
API_KEY_ENV = "TRTLLM_API_KEY"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="engine folder, checkpoint folder, Hugging Face folder or .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (the one taken is printed)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or .gguf file (default: the model's)")
    p.add_argument("--max_batch_size", type=int, default=None,
                   help="sequences per step (built into an engine made from MODEL; at most the engine's)")
    p.add_argument("--max_num_tokens", type=int, default=None, help="tokens per step (as --max_batch_size)")
    p.add_argument("--max_seq_len", type=int, default=None, help="when MODEL is built: prompt + output tokens")
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9,
                   help="share of the free GPU memory the KV cache takes")
    p.add_argument("--max_queue_size", type=int, default=None,
                   help="requests waiting for the batch beyond which new ones get 503 (default: no limit)")
    p.add_argument("--api_key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1/... (default: ${API_KEY_ENV}, else none)")
    p.add_argument("--served_model_name", default=None, help="the model's name in the API (default: MODEL as given)")
    p.add_argument("--log_level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--shutdown_timeout", type=float, default=30.0,
                   help="seconds running requests get to finish after Ctrl-C / SIGTERM")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--tp_size", type=int, default=None,
                   help="tensor-parallel ranks (one engine process per rank, started by the server; "
                        "default: an engine or checkpoint folder's own split, else 1)")
    p.add_argument("--pp_size", type=int, default=None,
                   help="pipeline-parallel stages (LLaMA family; default as --tp_size)")
    from ..cli import add_debug_argument
    add_debug_argument(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    if not 0 < args.kv_cache_free_gpu_memory_fraction <= 1:
        raise ConfigError(f"--kv_cache_free_gpu_memory_fraction must be in (0, 1], "
                          f"got {args.kv_cache_free_gpu_memory_fraction}")
    for name in ("max_batch_size", "max_num_tokens", "max_seq_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be >= 1, got {value}")
    if args.max_queue_size is not None and args.max_queue_size < 1:
        raise ConfigError(f"--max_queue_size must be >= 1 (leave it out for no limit), got {args.max_queue_size}")
    if args.shutdown_timeout < 0:
        raise ConfigError(f"--shutdown_timeout must be >= 0, got {args.shutdown_timeout}")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api_key is empty")


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, taken before the engine loads (a busy port fails at once)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _serve(app, sock: socket.socket, args: argparse.Namespace, name: str) -> None:
    import uvicorn
    config = uvicorn.Config(app, log_level=args.log_level, lifespan="off",
                            timeout_graceful_shutdown=args.shutdown_timeout)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        print(f"{PROG}: serving {name} at {url_of(sock)} (OpenAI API under /v1; Ctrl-C stops)", flush=True)
    await serving


def main(argv=None) -> int:
    args = parse_args(argv)
    check_args(args)
    logging.getLogger("tensorrt_llm").setLevel(args.log_level.upper())
    sock = bind(args.host, args.port)
    from ..llmapi import LLM
    from ..serve import OpenAIServer
    name = args.served_model_name or args.model
    with LLM(args.model, tokenizer=args.tokenizer, device=args.device, max_batch_size=args.max_batch_size,
             max_num_tokens=args.max_num_tokens, max_seq_len=args.max_seq_len,
             kv_cache_free_gpu_memory_fraction=args.kv_cache_free_gpu_memory_fraction,
             tensor_parallel_size=args.tp_size, pipeline_parallel_size=args.pp_size) as llm:
        server = OpenAIServer(llm, name, max_queue_size=args.max_queue_size, api_key=args.api_key)
        # uvicorn handles SIGINT/SIGTERM while it serves (a graceful shutdown), then raises the
        # signal again into the handlers it found: these make that a normal exit.
        previous = _absorb_signals()
        try:
            asyncio.run(_serve(server.app, sock, args, name))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print(f"{PROG}: stopped", flush=True)
    return 0


def _absorb_signals() -> dict[int, object]:
    return {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}


def cli(argv: Optional[list[str]] = None) -> int:
    """The trtllm-serve console script: main() through tensorrt_llm.cli.run_cli (one "error:"
    line for a user error, exit code 2)."""
    from ..cli import run_cli
    return run_cli(main, PROG, argv)


if __name__ == "__main__":
    sys.exit(cli())
