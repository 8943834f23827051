"""The load generator of `nextok bench serve`: streams requests to any OpenAI-compatible server.

One `HttpBackend` speaks one endpoint:
- `completions`: POST /v1/completions (nextok, llama.cpp's llama-server, vLLM, ...);
- `chat`: POST /v1/chat/completions, the prompt as one user message;
- `code`: POST /v1/code/complete (nextok's code completion, with session_id);
- `infill`: POST /infill (llama-server's FIM endpoint; nextok serves it too).

Every request streams, so the client sees each chunk as it arrives: one timestamp per chunk that
carries text. Output tokens come from the server's usage when it reports one (OpenAI
`stream_options.include_usage`, llama.cpp's `tokens_predicted`), else from the count of text
chunks. `run_load` sends a list of requests with Poisson arrivals (or all at once) under an
optional concurrency cap and a wall-clock limit after which nothing new is sent and what is still
in flight is cancelled: a run always ends by itself.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from nextok.bench.serve_metrics import RequestResult

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
             "code": "/v1/code/complete", "infill": "/infill"}


@dataclass
class BenchRequest:
    prompt: str | list[int]       # text, or token ids (completions only)
    prompt_len: int               # tokens, as the dataset counted them
    max_tokens: int
    ignore_eos: bool = False
    suffix: str = ""              # code / infill: the text after the cursor
    session_id: str | None = None  # code: a newer request of the session cancels this one
    language: str = ""
    extra: dict = field(default_factory=dict)  # merged into the JSON body


class HttpBackend:
    def __init__(self, base_url: str, endpoint: str = "completions", api_key: str | None = None,
                 model: str | None = None, timeout: float = 600.0, temperature: float = 0.0):
        import httpx  # the bench extra; `nextok --help` works without it

        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r} ({' | '.join(ENDPOINTS)})")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.endpoint, self.model, self.temperature = endpoint, model, temperature
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(base_url=self.base_url, headers=headers, limits=limits,
                                        timeout=httpx.Timeout(timeout, connect=30.0))

    async def aclose(self) -> None:
        await self.client.aclose()

    async def served_model(self) -> str:
        import httpx

        try:
            r = await self.client.get("/v1/models")
        except httpx.HTTPError as e:
            raise ValueError(f"cannot reach {self.base_url}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise ValueError(f"GET {self.base_url}/v1/models: HTTP {r.status_code}: {_error_message(r.text)}")
        return r.json()["data"][0]["id"]

    def body(self, req: BenchRequest) -> dict:
        common = {"max_tokens": req.max_tokens, "temperature": self.temperature, "stream": True}
        if self.endpoint == "completions":
            body = {**common, "prompt": req.prompt, "stream_options": {"include_usage": True}}
            if req.suffix:
                body["suffix"] = req.suffix
        elif self.endpoint == "chat":
            content = req.prompt if isinstance(req.prompt, str) else None
            if content is None:
                raise ValueError("the chat endpoint takes text prompts, not token ids")
            body = {**common, "messages": [{"role": "user", "content": content}],
                    "stream_options": {"include_usage": True}}
        elif self.endpoint == "code":
            body = {**common, "prefix": req.prompt, "suffix": req.suffix, "language": req.language}
            if req.session_id is not None:
                body["session_id"] = req.session_id
        else:  # llama.cpp /infill
            body = {"input_prefix": req.prompt, "input_suffix": req.suffix, "n_predict": req.max_tokens,
                    "temperature": self.temperature, "stream": True, "cache_prompt": True}
        if self.model and self.endpoint != "infill":
            body["model"] = self.model
        if req.ignore_eos and self.endpoint != "code":  # code completion stops by its own rules
            body["ignore_eos"] = True
        body.update(req.extra)
        return body

    async def send(self, req: BenchRequest, t0: float = 0.0) -> RequestResult:
        """Streams one request; never raises for a server or network error (it is in the result)."""
        import httpx

        res = RequestResult(ok=False, prompt_len=req.prompt_len, start=time.perf_counter() - t0)
        sent = time.perf_counter()
        last = None
        chunks = 0
        try:
            async with self.client.stream("POST", ENDPOINTS[self.endpoint], json=self.body(req)) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    res.error = f"HTTP {r.status_code}: {_error_message(text)}"
                    res.latency = time.perf_counter() - sent
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        res.error = f"stream error: {_error_message(json.dumps(event))}"
                        break
                    text = self._absorb(event, res)
                    if text:
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - sent
                        else:
                            res.itl.append(now - last)
                        last = now
                        chunks += 1
                        res.text += text
        except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
            res.error = f"{type(e).__name__}: {e}"
        res.latency = time.perf_counter() - sent
        if not res.output_len:
            res.output_len = chunks
        if res.finish_reason in ("cancelled", "abort"):
            res.superseded = res.finish_reason == "cancelled"
            res.error = res.error or f"finish_reason={res.finish_reason}"
        res.ok = not res.error
        return res

    def _absorb(self, event: dict, res: RequestResult) -> str:
        """Takes usage and finish reason from one stream event; returns its generated text."""
        usage = event.get("usage")
        if usage:
            res.output_len = usage.get("completion_tokens") or res.output_len
            res.prompt_len = usage.get("prompt_tokens") or res.prompt_len
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                res.cached_tokens = details["cached_tokens"]
        if event.get("cached_tokens") is not None:  # nextok /v1/code/complete
            res.cached_tokens = event["cached_tokens"]
        if self.endpoint == "infill" or "content" in event and "choices" not in event:
            if event.get("stop"):  # llama.cpp's last chunk: counts and timings
                res.output_len = event.get("tokens_predicted") or res.output_len
                res.prompt_len = event.get("tokens_evaluated") or res.prompt_len
                timings = event.get("timings") or {}
                if "cache_n" in timings:
                    res.cached_tokens = timings["cache_n"]
                res.finish_reason = event.get("stop_type") or "stop"
            return event.get("content") or ""
        if self.endpoint == "code" and "choices" not in event:  # {"delta": ...}, final has usage
            res.finish_reason = event.get("finish_reason") or res.finish_reason
            return event.get("delta") or ""
        text = ""
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]
            if "text" in choice:
                text += choice["text"] or ""
            elif "delta" in choice:
                text += choice["delta"].get("content") or ""
        return text


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    except (ValueError, AttributeError):
        return text.strip()[:300]


def arrival_delays(n: int, request_rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Gaps between arrivals: Poisson (gamma, shape `burstiness`) at `request_rate`/s; inf: none."""
    if request_rate == float("inf"):
        return [0.0] * n
    if request_rate <= 0:
        raise ValueError("request rate must be positive")
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    return [0.0] + [rng.gammavariate(burstiness, theta) for _ in range(n - 1)]


async def run_load(backend: HttpBackend, requests: list[BenchRequest], *, request_rate: float = float("inf"),
                   max_concurrency: int | None = None, seed: int = 0, time_limit: float | None = None,
                   progress: bool = False) -> tuple[list[RequestResult], float]:
    """Sends every request (arrival times drawn with `seed`); returns results and the wall time.

    After `time_limit` seconds no request is sent any more and those in flight are cancelled;
    each one left out or cut is a failed result ("time limit"), so it shows in the summary.
    """
    from tqdm import tqdm

    delays = arrival_delays(len(requests), request_rate, seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(requests), disable=not progress, unit="req", leave=False)
    t0 = time.perf_counter()

    async def one(req: BenchRequest) -> RequestResult:
        if sem is None:
            res = await backend.send(req, t0)
        else:
            async with sem:
                res = await backend.send(req, t0)
        bar.update(1)
        return res

    tasks: list[asyncio.Task] = []

    async def dispatch() -> None:
        for req, delay in zip(requests, delays):
            if delay:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req)))
        if tasks:
            await asyncio.wait(tasks)

    try:
        await asyncio.wait_for(dispatch(), timeout=time_limit)
    except asyncio.TimeoutError:
        pass
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    duration = time.perf_counter() - t0
    bar.close()
    results = []
    for i, req in enumerate(requests):
        t = tasks[i] if i < len(tasks) else None
        if t is not None and not t.cancelled() and t.exception() is None:
            results.append(t.result())
        else:
            results.append(RequestResult(ok=False, prompt_len=req.prompt_len, error="time limit"))
    return results, duration
