"""What every handler shares: the engine, limits, metrics, and the submit / collect helpers.

A handler turns its request into token-id prompts and `SamplingParams`, then:
    rec = state.record(...); streams = state.submit(rec, prompts, params)
and either `await state.collect(request, streams)` or iterates `merge(streams)` for SSE.
"""
from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from starlette.requests import Request

from nextok.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
from nextok.errors import InvalidRequestError
from nextok.outputs import RequestOutput
from nextok.sampling_params import SamplingParams
from nextok.server.config import ServerConfig
from nextok.server.errors import APIError
from nextok.server.logs import log_request
from nextok.server.metrics import ServerMetrics
from nextok.server.security import Authenticator, Caller, RateLimiter


@dataclass
class RequestRecord:
    """One HTTP request's bookkeeping, for the access log and the token rate limit."""

    id: str
    route: str
    caller: Caller
    start: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token: float | None = None
    finish_reason: str | None = None
    status: int = 200
    charge: list | None = None  # the rate limiter's token charge, settled at the end
    done: bool = False


class ServerState:
    def __init__(self, engine: AsyncEngine, config: ServerConfig, metrics: ServerMetrics):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.auth = Authenticator(config)
        self.limiter = RateLimiter()
        self.model_names = {config.served_model_name, *config.model_aliases}
        self.created = int(time.time())
        self.draining = False  # set on SIGTERM: no new requests, in-flight ones finish
        self._ids = itertools.count()
        self.sessions: dict[tuple[str, str], RequestStream] = {}  # (caller, session id) -> latest

    # ---- admission ----------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                f"{self.config.served_model_name!r}", param="model", code="model_not_found")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"

    def record(self, prefix: str, route: str, caller: Caller) -> RequestRecord:
        return RequestRecord(self.new_id(prefix), route, caller)

    def check_token_ids(self, ids: list[int], param: str, what: str = "token id") -> None:
        """400 for an id outside the vocabulary, before anything decodes it (the tokenizer
        raises OverflowError on one past 64 bits)."""
        vocab = self.engine.engine.config.model.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{what} {bad} is outside the vocabulary [0, {vocab})", param=param)

    def submit(self, rec: RequestRecord, prompts: list[list[int]], params: SamplingParams,
               streamed: bool = True) -> list[RequestStream]:
        """Admits and queues one engine request per prompt; all or none are queued.
        streamed=False (a response sent whole, read by `collect`): each stream yields only the
        finished output, so the engine builds no output step by step, nor (without stop strings)
        decodes text."""
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.engine.dead is not None or not self.engine.is_running:
            raise APIError(503, "the engine is not running", code="engine_dead")
        limit = self.config.max_prompt_tokens
        for ids in prompts:
            if limit is not None and len(ids) > limit:
                raise APIError(400, f"the prompt has {len(ids)} tokens; this server accepts at most "
                                    f"{limit}", param="prompt", code="prompt_too_long")
        queued = self.config.max_queued_requests
        if queued is not None and self.engine.num_waiting + len(prompts) > queued:
            raise APIError(503, f"the server is overloaded: {self.engine.num_waiting} requests are "
                                "waiting; retry later", code="queue_full", headers={"Retry-After": "1"})
        for ids in prompts:  # validate all before queueing any (-> 400)
            self.engine.engine.validate(ids, params)
        most = sum(len(ids) + params.n * (params.max_tokens or self.max_model_len - len(ids))
                   for ids in prompts)
        rec.charge = self.limiter.charge_tokens(rec.caller, most)
        rec.prompt_tokens = sum(len(ids) for ids in prompts)
        streams = []
        try:
            for i, ids in enumerate(prompts):
                streams.append(self.engine.add(f"{rec.id}-{i}", ids, params, streamed))
        except EngineDeadError as e:
            for s in streams:
                s.abort()
            raise APIError(503, str(e), code="engine_dead") from e
        except InvalidRequestError:
            for s in streams:
                s.abort()
            raise
        return streams

    # ---- results ------------------------------------------------------------------------
    async def collect(self, request: Request, streams: list[RequestStream],
                      rec: RequestRecord) -> list[RequestOutput] | None:
        """Waits for every stream to finish; None if the client went away (all aborted)."""
        async def consume():
            async for _ in merge(streams, rec):
                pass

        try:
            if not await run_unless_disconnected(request, consume()):
                rec.finish_reason, rec.status = "abort", 499
                return None
            return [s.last for s in streams]
        finally:
            for s in streams:
                s.abort()

    def finish(self, rec: RequestRecord, outputs: list[RequestOutput | None] = ()) -> None:
        """Access log, token accounting and HTTP metrics; once per request."""
        if rec.done:
            return
        rec.done = True
        if outputs:
            rec.completion_tokens = sum(len(o.token_ids) for out in outputs if out for o in out.outputs)
            reasons = [o.finish_reason for out in outputs if out for o in out.outputs]
            rec.finish_reason = rec.finish_reason or (reasons[0] if reasons else None)
        self.limiter.settle(rec.charge, rec.prompt_tokens + rec.completion_tokens)
        self.metrics.observe_http(rec.route, rec.status)
        end = time.monotonic()
        log_request(id=rec.id, route=rec.route, key=rec.caller.name, status=rec.status,
                    prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens,
                    ttft_ms=None if rec.first_token is None else round((rec.first_token - rec.start) * 1e3, 1),
                    total_ms=round((end - rec.start) * 1e3, 1), finish_reason=rec.finish_reason)


def _mark_first_token(rec: RequestRecord | None, out: RequestOutput | None) -> None:
    if rec is not None and rec.first_token is None and out is not None and \
            any(o.token_ids for o in out.outputs):
        now = time.monotonic()  # (one not streamed comes once, finished: its own time)
        rec.first_token = out.metrics.get("first_token", now) if out.finished else now


async def merge(streams: list[RequestStream], rec: RequestRecord | None = None
                ) -> AsyncIterator[tuple[int, RequestOutput | None]]:
    """Outputs of several streams as they come: (stream index, output); (index, None) when that
    stream was aborted. Aborts every stream still running if the consumer stops early."""
    if len(streams) == 1:
        # One stream (n = 1, one prompt: nearly every request) is read directly: a queue and a
        # pump task cost a put, a get and a task switch per SSE chunk
        stream = streams[0]
        try:
            async for out in stream:
                _mark_first_token(rec, out)
                yield 0, out
            if stream.aborted is not None:
                yield 0, None
        finally:
            stream.abort()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out, None))
            if stream.aborted is not None:
                queue.put_nowait((i, None, None))
            queue.put_nowait((i, StopAsyncIteration, None))
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            queue.put_nowait((i, None, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, out, exc = await queue.get()
            if exc is not None:
                raise exc
            if out is StopAsyncIteration:
                remaining -= 1
                continue
            _mark_first_token(rec, out)
            yield i, out
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def run_unless_disconnected(request: Request, work) -> bool:
    """Runs the coroutine `work`; False (and `work` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            return False
        task.result()  # re-raise what the work raised
        return True
    finally:
        task.cancel()
        gone.cancel()


async def wait_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
