"""`AsyncEngine`: the synchronous `LLMEngine` stepping in its own thread, fed from asyncio.

    HTTP handler --add()--> inbox (deque) --engine thread: engine.step()--> outputs
                 <--RequestStream (asyncio.Queue per request)-- loop.call_soon_threadsafe

The engine thread never waits on a client: outputs go into unbounded per-request queues, so a
slow reader only grows its own queue. The thread owns the engine; the event loop only touches the
inbox and the per-request queues. torch releases the GIL during kernels, so HTTP work overlaps the
model's compute.

The server builds the engine in the very thread that then steps it (`build_in_thread`): an
OpenMP team belongs to the thread that starts it, and a model loaded in the main thread leaves
that thread's team behind. With more OpenMP threads than cores, libgomp stops spinning between
parallel regions, and on 2 cores every CPU kernel call then waits on a futex wake-up: decode ran
1.6x slower (the default model, 2-core Xeon: 4.0 s against 2.4 s for 128 tokens).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
import traceback
from typing import Callable

from nextok.engine.engine import LLMEngine
from nextok.errors import NextokError
from nextok.outputs import RequestOutput
from nextok.sampling_params import SamplingParams

log = logging.getLogger("nextok.engine")


def _join(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """`newer` (cumulative) carrying the deltas of both: one output for the two steps."""
    deltas = {o.index: o for o in older.outputs}
    outputs = [dataclasses.replace(o, delta_text=deltas[o.index].delta_text + o.delta_text,
                                   delta_token_ids=deltas[o.index].delta_token_ids + o.delta_token_ids)
               if o.index in deltas else o for o in newer.outputs]
    return dataclasses.replace(newer, outputs=outputs)


class EngineDeadError(NextokError):
    """The engine loop stopped on an unexpected error; no request can be served any more."""


class RequestStream:
    """The outputs of one request, as an async iterator of cumulative `RequestOutput`s.

    Iteration ends after the finished output, or early when the request is aborted; then
    `aborted` holds the reason ("abort", "cancelled", ...). Raises EngineDeadError or
    RuntimeError (a failure inside the engine for this request only).

    A reader that fell behind gets what queued up meanwhile as one output: the newest, with the
    deltas of those it stands for joined (`_join`). Why: at hundreds of streams the event loop
    spends ~0.1 ms on each SSE chunk it sends; a GPU step of a small model is shorter than the
    chunks of one step take, and a queue per stream would then grow without end, every token
    reaching its client later than the one before.
    """

    def __init__(self, engine: "AsyncEngine", request_id: str):
        self.engine = engine
        self.request_id = request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.aborted: str | None = None
        self.finished = False
        self.last: RequestOutput | None = None
        self._next = None  # an item taken from the queue while joining, not yet returned

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = self._next if self._next is not None else await self.queue.get()
        self._next = None
        while isinstance(item, RequestOutput) and item.error is None and not self.queue.empty():
            newer = self.queue.get_nowait()
            if not isinstance(newer, RequestOutput) or newer.error is not None:
                self._next = newer  # an abort or a failure: returned (raised) next time
                break
            item = _join(item, newer)
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if isinstance(item, str):  # an abort reason, put by AsyncEngine.abort
            self.finished = True
            self.aborted = item
            raise StopAsyncIteration
        if item.error is not None:
            self.finished = True
            raise RuntimeError(item.error)
        self.last = item
        self.finished = item.finished
        return item

    def abort(self, reason: str = "abort") -> None:
        """Stops the request (client gone, superseded); a no-op once it has finished."""
        if not self.finished:
            self.engine.abort(self.request_id, reason)


StepObserver = Callable[[list[RequestOutput], dict], None]


class AsyncEngine:
    def __init__(self, engine: LLMEngine, on_step: StepObserver | None = None,
                 on_abort: Callable[[str, str], None] | None = None, idle_wait_s: float = 0.5):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._on_step = on_step  # runs in the engine thread after each step: metrics
        self._on_abort = on_abort  # runs in the event loop: metrics of aborts by reason
        self._idle_wait_s = idle_wait_s
        self._inbox: collections.deque = collections.deque()  # ("add"|"abort", ...) commands
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead: BaseException | None = None
        self.on_dead: Callable[[BaseException], None] | None = None
        self.num_pending_adds = 0  # added but not yet seen by the engine thread
        self.last_stats: dict = engine.stats()
        self.last_step_time = time.monotonic()
        self._go: threading.Event | None = None  # build_in_thread: start() lets its thread run
        self._started = False

    @classmethod
    def build_in_thread(cls, build: Callable[[], LLMEngine], **kwargs) -> "AsyncEngine":
        """Runs build() in a new thread, which then waits for start() and steps the engine.
        Returns once the engine is built; build()'s error is raised here. kwargs: __init__'s."""
        box: dict = {}
        built, go = threading.Event(), threading.Event()

        def boot() -> None:
            try:
                box["engine"] = build()
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                box["error"] = e
                return
            finally:
                built.set()
            go.wait()
            if not box["self"]._stopping:
                box["self"]._run()

        thread = threading.Thread(target=boot, name="nextok-engine", daemon=True)
        thread.start()
        built.wait()
        if "error" in box:
            thread.join()
            raise box["error"]
        self = box["self"] = cls(box["engine"], **kwargs)
        self._thread, self._go = thread, go
        return self

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._started = True
        if self._go is not None:  # built in its thread: let it step
            self._go.set()
            return
        self._thread = threading.Thread(target=self._run, name="nextok-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._go is not None:
            self._go.set()  # (a thread that was never started returns at once)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return (self._started and self._thread is not None and self._thread.is_alive()
                and self.dead is None)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_waiting(self) -> int:
        """Requests queued but not yet running: the engine's waiting queue plus the inbox."""
        return self.last_stats.get("num_waiting", 0) + self.num_pending_adds

    # ---- requests (event loop thread) -----------------------------------------------------
    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            streamed: bool = True) -> RequestStream:
        """Validates and queues a request. Raises InvalidRequestError (-> HTTP 400) at once.
        streamed=False: the stream yields only the finished output, and the engine saves a step's
        output building (and, without stop strings, its detokenizing) for this request."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine loop has stopped: {self.dead}")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.engine.validate(prompt_token_ids, params)
        stream = RequestStream(self, request_id)
        self._streams[request_id] = stream
        self.num_pending_adds += 1
        self._inbox.append(("add", request_id, list(prompt_token_ids), params, streamed, time.monotonic()))
        self._wake.set()
        return stream

    def abort(self, request_id: str, reason: str = "abort") -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        stream.queue.put_nowait(reason)
        self._inbox.append(("abort", request_id))
        self._wake.set()
        if self._on_abort is not None:
            self._on_abort(request_id, reason)

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_inbox()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(self._idle_wait_s)
                    self._wake.clear()
                    self.last_step_time = time.monotonic()  # idle, but alive (for /ready)
                    continue
                outputs = self.engine.step()
                self.last_step_time = time.monotonic()
                self._observe(outputs)
                if outputs:
                    self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except BaseException as e:  # noqa: BLE001 - whatever it was, every waiter must learn of it
            log.error("engine loop died:\n%s", traceback.format_exc())
            self.dead = e
            self._loop.call_soon_threadsafe(self._fail_all, e)

    def _drain_inbox(self) -> None:
        failed = []
        changed = False
        while self._inbox:
            cmd = self._inbox.popleft()
            changed = True
            if cmd[0] == "add":
                _, rid, ids, params, streamed, arrival = cmd
                try:
                    self.engine.add_request(rid, ids, params, stream=streamed, arrival=arrival)
                except Exception as e:  # validated already; a race (duplicate id) lands here
                    failed.append(RequestOutput(rid, None, ids, [], finished=True, error=str(e)))
                finally:
                    self._loop.call_soon_threadsafe(self._added)
            else:
                self.engine.abort_request(cmd[1])
        if changed:
            self._observe(failed)
        if failed:
            self._loop.call_soon_threadsafe(self._dispatch, failed)

    def _observe(self, outputs: list[RequestOutput]) -> None:
        self.last_stats = self.engine.stats()
        if self._on_step is not None:
            try:
                self._on_step(outputs, self.last_stats)
            except Exception:  # metrics must never stop the engine
                log.exception("step observer failed")

    # ---- back on the event loop -----------------------------------------------------------
    def _added(self) -> None:
        self.num_pending_adds -= 1

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile
            stream.queue.put_nowait(out)
            if out.finished:
                del self._streams[out.request_id]

    def _fail_all(self, exc: BaseException) -> None:
        err = EngineDeadError(f"the engine loop has stopped: {type(exc).__name__}: {exc}")
        for stream in self._streams.values():
            stream.queue.put_nowait(err)
        self._streams.clear()
        if self.on_dead is not None:
            self.on_dead(exc)
