"""`nextok serve`: bind the port, load the model, run uvicorn; SIGTERM drains and exits 0.

The port is bound before the model loads, so a busy port fails in a second rather than after the
load; the engine dying makes the process exit 1 instead of serving errors forever.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket

log = logging.getLogger("nextok.server")


def add_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None,
                   help="the model name clients send and responses carry (default: the --model value)")
    g.add_argument("--api-key", action="append", default=[],
                   help="accepted API key (repeatable; NEXTOK_API_KEY is read too)")
    g.add_argument("--api-key-file", default=None,
                   help="file of keys, one per line: KEY [name=NAME] [rpm=N] [tpm=N]")
    g.add_argument("--rate-limit-rpm", type=int, default=None, help="requests per minute per key")
    g.add_argument("--rate-limit-tpm", type=int, default=None, help="tokens per minute per key")
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="answer 503 when this many requests already wait (default: no bound)")
    g.add_argument("--max-request-body-bytes", type=int, default=4 << 20)
    g.add_argument("--max-prompt-tokens", type=int, default=None)
    g.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin (repeatable)")
    g.add_argument("--log-format", choices=["text", "json"], default="text")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for in-flight requests")
    g.add_argument("--fim-format", default=None, help="FIM family, if not detected from the vocabulary")
    g.add_argument("--fim-order", choices=["psm", "spm"], default="psm")
    g.add_argument("--code-context-tokens", type=int, default=1024,
                   help="token budget for extra_context on /v1/code/complete")
    add_engine_args(p)
    p.set_defaults(func=run_server)


def server_config(args: argparse.Namespace):
    from nextok import hub
    from nextok.server.config import ApiKey, ServerConfig, key_id, parse_key_file

    keys = [ApiKey(k, key_id(k)) for k in args.api_key]
    if os.environ.get("NEXTOK_API_KEY"):
        keys.append(ApiKey(os.environ["NEXTOK_API_KEY"], key_id(os.environ["NEXTOK_API_KEY"])))
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            keys.extend(parse_key_file(f.read()))
    for name, value in (("--rate-limit-rpm", args.rate_limit_rpm), ("--rate-limit-tpm", args.rate_limit_tpm),
                        ("--max-request-body-bytes", args.max_request_body_bytes),
                        ("--max-prompt-tokens", args.max_prompt_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1")
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        raise ValueError("--max-queued-requests must be >= 0")
    model = args.model or hub.DEFAULT_MODEL
    stem = os.path.basename(model.rstrip("/"))
    stem = stem[:-len(".gguf")] if stem.endswith(".gguf") else stem
    name = args.served_model_name or stem  # a path's last part, not the whole path
    aliases = tuple(sorted({model, stem, os.path.basename(model)} - {name}))
    return ServerConfig(
        host=args.host, port=args.port, served_model_name=name, model_aliases=aliases,
        api_keys=tuple(keys), rate_limit_rpm=args.rate_limit_rpm, rate_limit_tpm=args.rate_limit_tpm,
        max_queued_requests=args.max_queued_requests, max_request_body_bytes=args.max_request_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens, cors_origins=tuple(args.cors_origin),
        log_format=args.log_format, shutdown_timeout_s=args.shutdown_timeout,
        fim_format=args.fim_format, fim_order=args.fim_order, code_context_tokens=args.code_context_tokens)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise OSError(f"port {port} on {host} is already in use (choose another with --port)") from None
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(args: argparse.Namespace) -> int:
    from nextok.server.launcher import launch  # needs the server extra; imported only to serve

    return launch(args)
