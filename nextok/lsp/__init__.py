"""`nextok lsp`: completions from a nextok server in any LSP editor (see server.py).

The parser lives here so `nextok --help` works without pygls installed (the `lsp` extra)."""
from __future__ import annotations

import argparse
import os


def add_parser(sub) -> None:
    p = sub.add_parser("lsp", help="a stdio language server (inline completion) backed by a nextok server",
                       description="Language server over stdio: textDocument/inlineCompletion and "
                                   "textDocument/completion from a nextok server's /v1/code/complete.")
    p.add_argument("--server-url", default="http://127.0.0.1:8000", help="the nextok server (default: %(default)s)")
    p.add_argument("--api-key", default=None, help="API key (default: $NEXTOK_API_KEY)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per completion (default: the server's, 64 single-line / 256 multi-line)")
    p.add_argument("--prefix-lines", type=int, default=200, help="lines above the cursor sent as prefix")
    p.add_argument("--suffix-lines", type=int, default=50, help="lines below the cursor sent as suffix")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a completion")
    p.set_defaults(func=_cmd_lsp)


def _cmd_lsp(args: argparse.Namespace) -> int:
    from nextok.lsp.backend import BackendConfig

    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    if args.prefix_lines < 0 or args.suffix_lines < 0:
        raise ValueError("--prefix-lines and --suffix-lines must be >= 0")
    if not args.server_url.startswith(("http://", "https://")):
        raise ValueError(f"--server-url must be an http(s) URL, not {args.server_url!r}")
    config = BackendConfig(server_url=args.server_url, api_key=args.api_key or os.environ.get("NEXTOK_API_KEY"),
                           model=args.model, max_tokens=args.max_tokens, prefix_lines=args.prefix_lines,
                           suffix_lines=args.suffix_lines, timeout_s=args.timeout)
    from nextok.lsp.server import run

    return run(config)
