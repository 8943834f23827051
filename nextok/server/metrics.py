"""Prometheus metrics, with vLLM's meanings under a `nextok:` prefix.

Engine-side metrics are fed by `observe_step`, which the engine thread calls after every step
(prometheus_client is thread-safe); HTTP-side ones by the handlers. Each server has its own
registry, so tests can run several apps in one process.
"""
from __future__ import annotations

import sys
import time

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from nextok.outputs import RequestOutput

# Buckets as vLLM's: latency-oriented, from milliseconds to minutes.
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 20.0, 40.0, 80.0, 160.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        lbl = ["model_name"]
        self.model_name = model_name
        self.running = Gauge("nextok:num_requests_running", "Requests in the running batch.", lbl, registry=r)
        self.waiting = Gauge("nextok:num_requests_waiting", "Requests waiting to be scheduled.", lbl, registry=r)
        self.kv_usage = Gauge("nextok:kv_cache_usage_perc", "KV cache usage, 1 = full.", lbl, registry=r)
        self.prefix_queries = Counter("nextok:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", lbl, registry=r)
        self.prefix_hits = Counter("nextok:prefix_cache_hits", "Prompt tokens served from the prefix cache.", lbl, registry=r)
        self.preemptions = Counter("nextok:num_preemptions", "Preemptions (a request's KV freed to make room).", lbl, registry=r)
        self.prompt_tokens = Counter("nextok:prompt_tokens", "Prefilled prompt tokens.", lbl, registry=r)
        self.generation_tokens = Counter("nextok:generation_tokens", "Generated tokens.", lbl, registry=r)
        self.request_success = Counter("nextok:request_success", "Finished requests by finish reason.",
                                       lbl + ["finished_reason"], registry=r)
        self.ttft = Histogram("nextok:time_to_first_token_seconds", "Time to first token.", lbl, buckets=_TTFT, registry=r)
        self.itl = Histogram("nextok:inter_token_latency_seconds", "Time between output tokens of streamed requests "
                             "(one not streamed comes out once, finished).", lbl, buckets=_ITL, registry=r)
        self.tpot = Histogram("nextok:request_time_per_output_token_seconds", "Mean time per output token of a request.",
                              lbl, buckets=_ITL, registry=r)
        self.e2e = Histogram("nextok:e2e_request_latency_seconds", "Request latency, arrival to finish.", lbl, buckets=_E2E, registry=r)
        self.queue_time = Histogram("nextok:request_queue_time_seconds", "Time waiting before first scheduled.",
                                    lbl, buckets=_E2E, registry=r)
        self.http_requests = Counter("nextok:http_requests", "HTTP requests by route and status.",
                                     ["route", "status"], registry=r)
        # Speculative decoding (per method): drafts proposed and verified, drafts accepted, verify
        # steps; mean accepted length = accepted / steps (+1 for the step's own token).
        spec = lbl + ["method"]
        self.spec_proposed = Counter("nextok:spec_decode_num_draft_tokens", "Draft tokens verified.",
                                     spec, registry=r)
        self.spec_accepted = Counter("nextok:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                     spec, registry=r)
        self.spec_steps = Counter("nextok:spec_decode_num_verify_steps", "Verify steps (one per "
                                  "speculating sequence and step).", spec, registry=r)
        r.register(DeviceMemoryCollector())
        self._prev = {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0,
                      "spec_proposed_tokens": 0, "spec_accepted_tokens": 0, "spec_verify_steps": 0}
        self._last_token: dict[str, tuple[float, int]] = {}  # request id -> (time, tokens so far)

    def _l(self, metric, **extra):
        return metric.labels(model_name=self.model_name, **extra)

    # ---- engine thread ------------------------------------------------------------------
    def observe_step(self, outputs: list[RequestOutput], stats: dict) -> None:
        self._l(self.running).set(stats["num_running"])
        self._l(self.waiting).set(stats["num_waiting"])
        self._l(self.kv_usage).set(stats["kv_cache_usage"])
        for key, counter in (("prefix_cache_queries", self.prefix_queries),
                             ("prefix_cache_hits", self.prefix_hits),
                             ("num_preemptions", self.preemptions)):
            delta = stats[key] - self._prev[key]
            if delta > 0:
                self._l(counter).inc(delta)
            self._prev[key] = stats[key]
        if stats.get("spec_method"):
            for key, counter in (("spec_proposed_tokens", self.spec_proposed),
                                 ("spec_accepted_tokens", self.spec_accepted),
                                 ("spec_verify_steps", self.spec_steps)):
                delta = stats[key] - self._prev[key]
                if delta > 0:
                    self._l(counter, method=stats["spec_method"]).inc(delta)
                self._prev[key] = stats[key]
        now = time.monotonic()
        for out in outputs:
            self._observe_request(out, now)

    def _observe_request(self, out: RequestOutput, now: float) -> None:
        if out.error is not None:
            self._l(self.request_success, finished_reason="error").inc()
            self._last_token.pop(out.request_id, None)
            return
        m = out.metrics
        ntok = sum(len(o.token_ids) for o in out.outputs)
        prev = self._last_token.get(out.request_id)
        if prev is None:
            self._l(self.prompt_tokens).inc(len(out.prompt_token_ids))
            if "first_token" in m:
                self._l(self.ttft).observe(m["first_token"] - m["arrival"])
            if "scheduled" in m:
                self._l(self.queue_time).observe(m["scheduled"] - m["arrival"])
            new = ntok
        else:
            new = ntok - prev[1]
            if new > 0:
                self._l(self.itl).observe((now - prev[0]) / new)
        if new > 0:
            self._l(self.generation_tokens).inc(new)
        self._last_token[out.request_id] = (now, ntok)
        if out.finished:
            self._last_token.pop(out.request_id, None)
            for o in out.outputs:
                self._l(self.request_success, finished_reason=o.finish_reason or "stop").inc()
            end = m.get("finished", now)
            self._l(self.e2e).observe(end - m["arrival"])
            n_out = max(len(o.token_ids) for o in out.outputs) if out.outputs else 0
            if n_out > 1 and "first_token" in m:
                self._l(self.tpot).observe((end - m["first_token"]) / (n_out - 1))

    # ---- event loop -----------------------------------------------------------------------
    def observe_abort(self, request_id: str, reason: str) -> None:
        self._last_token.pop(request_id, None)
        self._l(self.request_success, finished_reason=reason).inc()

    def observe_http(self, route: str, status: int) -> None:
        self.http_requests.labels(route=route, status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class DeviceMemoryCollector:
    """`nextok:device_memory_{used,total}_bytes` by device, sampled at scrape time.

    device="cpu": the process's resident set against the host's RAM (on a CPU server that is where
    the weights and the KV pool live). device="cuda:N": bytes the caching allocator holds against
    the GPU's capacity, for each GPU this process has touched; torch is read only if the engine
    already imported it, so scraping never initialises CUDA.
    """

    def collect(self):
        used = GaugeMetricFamily("nextok:device_memory_used_bytes",
                                 "Memory held: process RSS (cpu), allocator-reserved bytes (cuda).",
                                 labels=["device"])
        total = GaugeMetricFamily("nextok:device_memory_total_bytes",
                                  "Memory capacity: host RAM (cpu), device memory (cuda).",
                                  labels=["device"])
        for device, u, t in device_memory():
            used.add_metric([device], u)
            total.add_metric([device], t)
        yield used
        yield total


def device_memory() -> list[tuple[str, int, int]]:
    """(device, used bytes, total bytes) for the CPU and every initialised CUDA device."""
    rows = [("cpu", psutil.Process().memory_info().rss, psutil.virtual_memory().total)]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            rows.append((f"cuda:{i}", torch.cuda.memory_reserved(i),
                         torch.cuda.get_device_properties(i).total_memory))
    return rows
