"""The ladder's baseline: `transformers` generate() behind the OpenAI completions API, naively.

    python -m nextok.bench.hf_server --model MODEL.gguf --port 8100 --num-threads 2

What a first deployment of a model often is: one `generate()` call per request, and one request
at a time. An asyncio lock serialises the requests; the others wait in line, so a queue forms as
soon as requests arrive faster than one is served. There is no batching, no KV cache kept
between requests, no prefix reuse. It is a benchmark baseline, not a server to deploy.

It speaks just enough of the API for `nextok bench serve`/`ladder` (the same `HttpBackend`
measures every row): POST /v1/completions with a text or token-id prompt, `max_tokens`,
`temperature` (0: greedy), `ignore_eos`, `stream` with `stream_options.include_usage`; the SSE
chunks have the shape nextok's server sends. GET /v1/models, /health and /ready.

Text <-> token ids go through nextok's GGUF tokenizer: it yields the same ids as transformers'
tokenizer for these models and loads in a second instead of ~20 s; what is measured is generate().
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import anyio
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


class SerialGenerator:
    """One transformers model; `generate` streams token ids through a callback, in a worker thread."""

    def __init__(self, model, eos_token_ids: list[int]):
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.active = 0       # generations running now
        self.max_active = 0   # the most ever running at once: 1, or the lock is broken
        self._count_lock = threading.Lock()

    def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, ignore_eos: bool,
                 on_token, cancelled: threading.Event) -> tuple[int, str]:
        """Runs generate(); calls on_token(id) per new token. Returns (tokens, finish reason)."""
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        class Sink(BaseStreamer):
            def __init__(self):
                self.seen_prompt = False
                self.count = 0

            def put(self, value):  # first call: the prompt; then one new token per call
                if not self.seen_prompt:
                    self.seen_prompt = True
                    return
                for t in value.reshape(-1).tolist():
                    self.count += 1
                    on_token(int(t))

            def end(self):
                pass

        class StopWhenCancelled(StoppingCriteria):  # the client left: stop at the next token
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancelled.is_set(), dtype=torch.bool)

        sink = Sink()
        ids = torch.tensor([prompt_ids], device=self.model.device)
        if temperature == 0:
            sampling = {"do_sample": False}
        else:  # plain temperature sampling, as nextok's defaults (no top-k / top-p)
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        eos = self.eos_token_ids or None
        with self._count_lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            with torch.inference_mode():
                # ignore_eos: min_new_tokens masks EOS until max_tokens, as nextok's ignore_eos does
                self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                    min_new_tokens=max_tokens if ignore_eos else None, streamer=sink,
                                    stopping_criteria=StoppingCriteriaList([StopWhenCancelled()]),
                                    pad_token_id=eos[0] if eos else 0, eos_token_id=eos, **sampling)
        finally:
            with self._count_lock:
                self.active -= 1
        if cancelled.is_set():
            return sink.count, "abort"
        return sink.count, "length" if sink.count >= max_tokens else "stop"


class IncrementalText:
    """Token ids in, new text out; holds back a trailing partial UTF-8 character.

    Decodes the whole output each time: quadratic, but outputs here are tens of tokens.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta, self.sent = text[len(self.sent):], text
        return delta


def build_app(generator: SerialGenerator, tokenizer, model_name: str):
    app = FastAPI(title="transformers baseline (one request at a time)")
    lock = asyncio.Lock()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
    app.state.generator = generator

    @app.get("/health")
    @app.get("/ready")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "transformers"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            ids = prompt_ids(body.get("prompt"), tokenizer)
            max_tokens = int(body.get("max_tokens") or 16)
            temperature = float(1.0 if body.get("temperature") is None else body["temperature"])
            if max_tokens < 1 or temperature < 0:
                raise ValueError("max_tokens must be >= 1 and temperature >= 0")
        except (ValueError, TypeError, json.JSONDecodeError) as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error"}}, 400)
        job = {"ids": ids, "max_tokens": max_tokens, "temperature": temperature,
               "ignore_eos": bool(body.get("ignore_eos")),
               "usage": not body.get("stream") or bool((body.get("stream_options") or {}).get("include_usage"))}
        meta = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion",
                "created": int(time.time()), "model": body.get("model") or model_name}
        events = _events(job, meta, generator, tokenizer, lock, executor)
        if body.get("stream"):
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(events, meta)

    return app


def prompt_ids(prompt, tokenizer) -> list[int]:
    """A string, token ids, or a one-element list of either (this server takes one prompt)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenizer.encode(prompt)  # as nextok's server does: BOS where the model wants one
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return list(prompt)
    raise ValueError("prompt must be a non-empty string or list of token ids (one prompt)")


async def _events(job: dict, meta: dict, generator: SerialGenerator, tokenizer, lock: asyncio.Lock,
                  executor: ThreadPoolExecutor):
    """SSE chunks of one request; waits for the lock first (the naive deployment's queue)."""
    def chunk(choices, usage=None) -> str:
        return f"data: {json.dumps({**meta, 'choices': choices, **({'usage': usage} if usage else {})})}\n\n"

    async with lock:
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | None] = asyncio.Queue()
        cancelled = threading.Event()

        def run():
            try:
                return generator.generate(job["ids"], job["max_tokens"], job["temperature"], job["ignore_eos"],
                                          lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t), cancelled)
            finally:
                loop.call_soon_threadsafe(tokens.put_nowait, None)

        future = loop.run_in_executor(executor, run)
        text = IncrementalText(tokenizer)
        try:
            while (token := await tokens.get()) is not None:
                delta = text.add(token)
                if delta:
                    yield chunk([{"index": 0, "text": delta, "logprobs": None, "finish_reason": None,
                                  "stop_reason": None}])
            count, reason = await future
            yield chunk([{"index": 0, "text": text.flush(), "logprobs": None, "finish_reason": reason,
                          "stop_reason": None}])
            if job["usage"]:
                n_in = len(job["ids"])
                yield chunk([], {"prompt_tokens": n_in, "completion_tokens": count, "total_tokens": n_in + count,
                                 "prompt_tokens_details": {"cached_tokens": 0}})
            yield "data: [DONE]\n\n"
        finally:
            # Keep the lock until generate() has really stopped, or two would run at once.
            # Starlette cancels through anyio, whose cancellation hits every later await: shield it.
            cancelled.set()
            with anyio.CancelScope(shield=True):
                try:
                    await future
                except Exception:  # noqa: BLE001  the request is gone; its error goes with it
                    pass


async def _collect(events, meta: dict) -> dict:
    text, reason, usage = "", None, None
    async for line in events:
        data = line[len("data: "):].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        usage = event.get("usage") or usage
        for c in event["choices"]:
            text += c["text"]
            reason = c["finish_reason"] or reason
    return {**meta, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
            "usage": usage}


def load_model(path: str, dtype: str):
    """The model through transformers' own loader (the helper `nextok bench throughput` uses)."""
    from types import SimpleNamespace

    from nextok.bench.throughput import load_hf

    return load_hf(SimpleNamespace(model_path=path, dtype=dtype, device="cpu", load_format="auto"))


def main(argv: list[str] | None = None) -> int:
    import os

    import uvicorn

    from nextok import hub
    from nextok.tokenizer import Tokenizer

    p = argparse.ArgumentParser(prog="python -m nextok.bench.hf_server", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: nextok's default model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--served-model-name", default=None)
    args = p.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    path = hub.resolve_model(args.model)
    tokenizer = Tokenizer.from_gguf(path) if os.path.isfile(path) else Tokenizer.from_dir(path)
    model = load_model(path, args.dtype)
    eos = list(tokenizer.eos_token_ids) or [model.config.eos_token_id]
    name = args.served_model_name or os.path.basename(path).removesuffix(".gguf")
    app = build_app(SerialGenerator(model, eos), tokenizer, name)
    print(f"transformers baseline serving {name!r} at http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
