"""The `keystroke` workload of `nextok bench serve`: editors typing through real files.

    nextok bench serve --base-url http://127.0.0.1:8000 --dataset keystroke --num-sessions 4

Sessions (`keystroke_sessions.py`) type spans of real source files at a typing pace and ask for a
completion every few characters with their session id, several editors at once. Against nextok
(--endpoint code) a newer request of a session makes the server cancel the older one; against a
peer without sessions (infill, completions) the client aborts the older request, as llama.vim
does, and the server stops on the disconnect. Either way it counts as superseded.

The report: completion latency of the requests that completed (what an editor shows), the share
superseded, and the prefix-cache hit rate the server saw (the delta of its /metrics counters over
the run, else the cached tokens its responses reported), overall and per language.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from nextok.bench.keystroke_sessions import (LANGUAGES, Keystroke, Session, TypingSpec,
                                             build_sessions, candidate_files)
from nextok.bench.load import BenchRequest, HttpBackend
from nextok.bench.serve_metrics import RequestResult, distribution


# ---- running --------------------------------------------------------------------------------
@dataclass
class KeystrokeResult:
    session: int        # index into the sessions
    language: str
    typed: int
    result: RequestResult


def _request(s: Session, ks: Keystroke, endpoint: str, max_tokens: int, tokenizer) -> BenchRequest:
    prompt_len = len(tokenizer.encode(ks.prefix + ks.suffix, add_special_tokens=False)) if tokenizer else 0
    code = endpoint == "code"
    return BenchRequest(prompt=ks.prefix, prompt_len=prompt_len, max_tokens=max_tokens, suffix=ks.suffix,
                        session_id=s.session_id if code else None, language=s.language,
                        extra={"filepath": s.filepath} if code else {})


async def run_keystroke(backend: HttpBackend, sessions: list[Session], *, max_tokens: int = 32,
                        time_limit: float | None = None, concurrent_sessions: int | None = None,
                        tokenizer=None) -> tuple[list[KeystrokeResult], float]:
    """Types every session (at most `concurrent_sessions` at once); returns one result per request
    sent and the wall time. On /v1/code/complete the server cancels a session's older request;
    on other endpoints the client aborts it when the next keystroke's request goes out. After
    `time_limit` seconds what is still in flight is cancelled (a "time limit" failure)."""
    if backend.endpoint == "chat":
        raise ValueError("the keystroke workload needs a code endpoint: code, infill or completions")
    client_abort = backend.endpoint != "code"
    requests = [[_request(s, ks, backend.endpoint, max_tokens, tokenizer) for ks in s.keystrokes]
                for s in sessions]
    sem = asyncio.Semaphore(concurrent_sessions or len(sessions))
    sent: list[tuple[int, Keystroke, asyncio.Task]] = []
    aborted: set[asyncio.Task] = set()
    t0 = time.perf_counter()

    async def type_session(i: int) -> None:
        async with sem:
            began = time.perf_counter()
            mine: list[asyncio.Task] = []
            for ks, req in zip(sessions[i].keystrokes, requests[i]):
                delay = began + ks.at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if client_abort and mine and not mine[-1].done():
                    aborted.add(mine[-1])
                    mine[-1].cancel()
                mine.append(asyncio.create_task(backend.send(req, t0)))
                sent.append((i, ks, mine[-1]))
            # every outcome counts: an older request's "cancelled" may come after the last's end
            await asyncio.wait(mine)

    try:
        await asyncio.wait_for(asyncio.gather(*(type_session(i) for i in range(len(sessions)))), time_limit)
    except asyncio.TimeoutError:
        pass
    finally:
        for _, _, task in sent:
            task.cancel()
        await asyncio.gather(*(t for _, _, t in sent), return_exceptions=True)
    duration = time.perf_counter() - t0
    return [KeystrokeResult(i, sessions[i].language, ks.typed, _outcome(task, task in aborted))
            for i, ks, task in sent], duration


def _outcome(task: asyncio.Task, aborted: bool) -> RequestResult:
    if task.cancelled():
        if aborted:
            return RequestResult(ok=False, superseded=True, error="aborted by the next keystroke")
        return RequestResult(ok=False, error="time limit")
    if task.exception() is not None:
        return RequestResult(ok=False, error=f"{type(task.exception()).__name__}: {task.exception()}")
    return task.result()


# ---- prefix cache ---------------------------------------------------------------------------
def parse_prefix_cache_counters(text: str) -> dict[str, float] | None:
    """{'hits', 'queries'} in tokens from Prometheus text: `nextok:prefix_cache_*_total` (vLLM's
    `vllm:` ones too), summed over labels; None when the server exports neither. A labelled
    counter has no sample before its first increment, only its TYPE line: that reads as 0."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            m = re.fullmatch(r"# TYPE (?:\w+:)?prefix_cache_(hits|queries)(?:_total)? counter", line.strip())
            if m:
                totals.setdefault(m.group(1), 0.0)
            continue
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        m = re.fullmatch(r"(?:\w+:)?prefix_cache_(hits|queries)_total", name)
        if m:
            totals[m.group(1)] = totals.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return totals if "queries" in totals else None


async def read_prefix_cache_counters(backend: HttpBackend) -> dict[str, float] | None:
    import httpx

    try:
        r = await backend.client.get("/metrics")
    except httpx.HTTPError:
        return None
    return parse_prefix_cache_counters(r.text) if r.status_code == 200 else None


def prefix_cache_report(before: dict | None, after: dict | None, results: list[RequestResult]) -> dict:
    """The hit rate the server saw: its counters' delta over the run (every request counts, the
    superseded ones too, and any other client's: the server's view), else the cached share of
    the prompt tokens the completed responses reported."""
    reported = [r for r in results if r.ok and r.cached_tokens is not None and r.prompt_len]
    from_responses = (sum(r.cached_tokens for r in reported) / sum(r.prompt_len for r in reported)
                      if reported else None)
    out = {"hit_rate": from_responses, "source": "responses" if reported else None,
           "responses_cached_share": from_responses}
    if before is not None and after is not None:
        queries, hits = after["queries"] - before["queries"], after.get("hits", 0) - before.get("hits", 0)
        out.update(queries_tokens=queries, hits_tokens=hits)
        if queries > 0:
            out.update(hit_rate=hits / queries, source="server /metrics")
    return out


# ---- report ---------------------------------------------------------------------------------
def _figures(records: list[KeystrokeResult], percentiles: tuple[float, ...]) -> dict:
    results = [r.result for r in records]
    done = [r for r in results if r.ok]
    superseded = sum(r.superseded for r in results)
    failed = [r for r in results if not r.ok and not r.superseded]
    return {
        "num_requests": len(results), "completed": len(done), "superseded": superseded,
        "failed": len(failed), "superseded_share": superseded / len(results) if results else None,
        "latency_ms": distribution([r.latency for r in done], percentiles),
        # to the first text shown: a completion that stopped at once (empty) has none
        "ttft_ms": distribution([r.ttft for r in done if r.text], percentiles),
        "errors": dict(Counter((r.error or "unknown").splitlines()[0][:120] for r in failed)),
    }


def summarize_keystroke(records: list[KeystrokeResult], sessions: list[Session], duration: float,
                        cache: dict, percentiles: tuple[float, ...] = (50, 90, 99)) -> dict:
    """Latency of the completions an editor would show (completed, not superseded), the share
    superseded, the server's prefix-cache hit rate, and the same figures per language."""
    by_lang: dict[str, list[KeystrokeResult]] = {}
    for r in records:
        by_lang.setdefault(r.language, []).append(r)
    per_language = {lang: {"sessions": sum(s.language == lang for s in sessions), **_figures(rs, percentiles)}
                    for lang, rs in by_lang.items()}
    planned = sum(len(s.keystrokes) for s in sessions)  # more than sent when the time limit hit
    return {"duration_s": duration, "num_sessions": len(sessions), "planned_requests": planned,
            **_figures(records, percentiles),
            "prefix_cache_hit_rate": cache["hit_rate"], "prefix_cache": cache, "by_language": per_language}


def format_summary(s: dict) -> str:
    lines = [f"{'=' * 18} Keystroke benchmark {'=' * 18}"]

    def row(label, value, fmt="{:.2f}"):
        lines.append(f"{label:<40}{fmt.format(value) if value is not None else 'n/a':>12}")

    row("Sessions:", s["num_sessions"], "{:d}")
    row("Requests:", s["num_requests"], "{:d}")
    row("Completed:", s["completed"], "{:d}")
    row("Superseded share:", s["superseded_share"], "{:.1%}")
    row("Failed:", s["failed"], "{:d}")
    row("Prefix cache hit rate:", s["prefix_cache_hit_rate"], "{:.1%}")
    for key, name in (("latency_ms", "Completion latency (ms)"), ("ttft_ms", "TTFT (ms)")):
        lines.append(f"{'-' * 14}{name}{'-' * 14}")
        for stat, v in s[key].items():
            if stat not in ("std", "median"):  # median is p50
                row(f"{stat}:", v)
    for lang, f in s["by_language"].items():
        row(f"{lang} P50 latency (ms):", f["latency_ms"]["median"])
    lines += [f"error x{n}: {err}" for err, n in s["errors"].items()]
    lines.append("=" * 57)
    return "\n".join(lines)


# ---- CLI ------------------------------------------------------------------------------------
def add_args(p) -> None:
    g = p.add_argument_group("keystroke dataset (--num-requests is ignored; --seed and --time-limit apply)")
    g.add_argument("--num-sessions", type=int, default=4, help="editor sessions (default 4)")
    g.add_argument("--session-languages", default=None,
                   help=f"comma-separated, from {','.join(LANGUAGES)} (default: all that have files here)")
    g.add_argument("--concurrent-sessions", type=int, default=None, help="sessions typing at once (default: all)")
    g.add_argument("--keystroke-every", type=int, default=3, help="characters typed between requests")
    g.add_argument("--typing-cps", type=float, default=8.0, help="typing pace, characters per second")
    g.add_argument("--typed-chars", default="150:400",
                   help="MIN:MAX characters typed per session (to the end of a line; several lines)")
    g.add_argument("--line-pause", type=float, default=1.0,
                   help="seconds the typist stops after each newline (where completions get read)")
    g.add_argument("--prefix-chars", type=int, default=4000, help="editor window before the cursor")
    g.add_argument("--suffix-chars", type=int, default=1000, help="editor window after the cursor")
    g.add_argument("--keystroke-max-tokens", type=int, default=32, help="max_tokens of each completion")


def _files_by_language(requested: str | None) -> dict[str, list[str]]:
    languages = [x.strip() for x in requested.split(",") if x.strip()] if requested else list(LANGUAGES)
    files = {}
    for lang in languages:
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r} in --session-languages ({', '.join(LANGUAGES)})")
        paths = candidate_files(lang)
        if paths:
            files[lang] = paths
        elif requested:
            raise ValueError(f"no {lang} source files found on this machine")
        else:
            print(f"warning: keystroke: no {lang} source files found, skipping {lang}", file=sys.stderr)
    return files


def _typing_spec(args) -> TypingSpec:
    lo, _, hi = args.typed_chars.partition(":")
    try:
        lo_hi = (int(lo), int(hi or lo))
    except ValueError:
        raise ValueError(f"--typed-chars wants MIN:MAX, got {args.typed_chars!r}") from None
    return TypingSpec(every=args.keystroke_every, cps=args.typing_cps, line_pause=args.line_pause, min_chars=lo_hi[0],
                      max_chars=lo_hi[1], prefix_chars=args.prefix_chars, suffix_chars=args.suffix_chars)


async def run_from_args(args, backend: HttpBackend, tokenizer) -> dict:
    spec = _typing_spec(args)
    if args.concurrent_sessions is not None and args.concurrent_sessions < 1:
        raise ValueError("--concurrent-sessions must be at least 1")
    sessions = build_sessions(args.num_sessions, _files_by_language(args.session_languages), spec,
                              args.seed, id_prefix=f"keystroke-{uuid.uuid4().hex[:8]}")
    before = await read_prefix_cache_counters(backend)
    records, duration = await run_keystroke(backend, sessions, max_tokens=args.keystroke_max_tokens,
                                            time_limit=args.time_limit, tokenizer=tokenizer,
                                            concurrent_sessions=args.concurrent_sessions)
    after = await read_prefix_cache_counters(backend)
    cache = prefix_cache_report(before, after, [r.result for r in records])
    pcts = tuple(float(x) for x in args.percentiles.split(","))
    out = {"summary": summarize_keystroke(records, sessions, duration, cache, pcts),
           "settings": {**dataclasses.asdict(spec), "max_tokens": args.keystroke_max_tokens, "seed": args.seed,
                        "concurrent_sessions": args.concurrent_sessions or len(sessions),
                        "client_abort": backend.endpoint != "code"},
           "files": sorted({s.path for s in sessions}),
           "sessions": [{"session_id": s.session_id, "language": s.language, "path": s.path,
                         "start": s.start, "typed_chars": s.end - s.start,
                         "requests": len(s.keystrokes), "typing_s": s.keystrokes[-1].at}
                        for s in sessions]}
    if getattr(args, "save_requests", False):
        out["requests"] = [{"session": r.session, "typed": r.typed, **r.result.to_json()} for r in records]
    return out
