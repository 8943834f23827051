"""`nextok serve` with a fault injected, for the robustness tests (never used outside tests).

    python -m tests.server.faulty_server request ARGS...  a prompt containing "BOOM" fails inside
                                                        the engine's per-request processing
    python -m tests.server.faulty_server engine ARGS...   a prompt containing "CRASH" makes the
                                                        model step raise: the engine loop dies
"""
from __future__ import annotations

import sys

from nextok import cli
from nextok.engine.engine import LLMEngine


def _marked(engine: LLMEngine, word: str, request_ids) -> bool:
    for rid in request_ids:
        req = engine.requests.get(rid)
        if req is not None and word in engine.tokenizer.decode(req.prompt_token_ids):
            return True
    return False


def main() -> int:
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode == "request":
        original = LLMEngine._detokenize

        def _detokenize(self, req, seq, token, *args, **kwargs):
            if "BOOM" in self.tokenizer.decode(req.prompt_token_ids):
                raise ValueError("injected failure for this request")
            return original(self, req, seq, token, *args, **kwargs)

        LLMEngine._detokenize = _detokenize
    elif mode == "engine":
        original_step = LLMEngine.step

        def step(self):
            if _marked(self, "CRASH", list(self.requests)):
                raise RuntimeError("injected engine failure")
            return original_step(self)

        LLMEngine.step = step
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
