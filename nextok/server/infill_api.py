"""`POST /infill`, wire-compatible with llama.cpp's server, so llama.vim and llama.vscode work.

Request: input_prefix, input_suffix, input_extra [{filename, text}], prompt (the typed part of the
cursor line, appended to the prefix), n_predict, n_indent, t_max_predict_ms, stop, sampling
fields, samplers, n_cmpl, stream, response_fields. The response is llama.cpp's completion object
as compact JSON (llama.vim matches `"content":"` literally); with n_cmpl > 1 a JSON array;
streamed, one `data:` object per token and a final object with `stop: true`, no `[DONE]`.

Unlike llama.cpp, a model without FIM tokens is not refused (501): it gets the same prefix-only
prompt as /v1/code/complete.
"""
from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nextok.sampling_params import SamplingParams
from nextok.server.code_api import code_prompt, code_stop_ids
from nextok.server.errors import APIError, error_body
from nextok.server.openai_api import state_of
from nextok.server.protocol import ERROR_RESPONSES
from nextok.server.state import RequestRecord, ServerState, merge, run_unless_disconnected

router = APIRouter()


class InfillChunk(BaseModel):
    model_config = ConfigDict(extra="ignore")  # llama.vim adds "time"
    text: str
    filename: str = "tmp"


class InfillRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillChunk] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1, validation_alias=AliasChoices("n_predict", "max_tokens"))
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int = -1
    temperature: float = Field(0.8, ge=0.0, le=100.0)
    top_k: int = Field(40, ge=0)
    top_p: float = Field(0.95, ge=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    seed: int = Field(-1, ge=-1, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list)
    samplers: list[str] | str | None = None
    n_cmpl: int = Field(1, ge=1, le=16, validation_alias=AliasChoices("n_cmpl", "n"))
    stream: bool = False
    return_tokens: bool = False
    response_fields: list[str] = Field(default_factory=list)
    model: str | None = None


def infill_sampling(req: InfillRequest, max_tokens: int, stop_ids: list[int]) -> SamplingParams:
    """llama.cpp's sampler chain: a sampler left out of `samplers` is off (then the final draw
    is at temperature 1 from whatever the chain kept)."""
    chain = req.samplers
    names = set(chain) if isinstance(chain, list) else None
    if isinstance(chain, str):  # one letter per sampler: k=top_k p=top_p m=min_p t=temperature
        names = {{"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature"}.get(c, c) for c in chain}

    def on(name: str) -> bool:
        return names is None or name in names

    try:
        return SamplingParams(
            temperature=req.temperature if on("temperature") else 1.0,
            top_k=req.top_k if on("top_k") and req.top_k > 0 else -1,
            top_p=req.top_p if on("top_p") and req.top_p > 0 else 1.0,
            min_p=req.min_p if on("min_p") else 0.0,
            seed=None if req.seed < 0 else req.seed, n=req.n_cmpl, max_tokens=max_tokens,
            stop=[s for s in req.stop if s] or None, stop_token_ids=stop_ids)
    except ValueError as e:
        raise APIError(400, str(e)) from e


class IndentStop:
    """llama.cpp's n_indent and t_max_predict_ms rules, applied to the growing text."""

    def __init__(self, n_indent: int, t_max_predict_ms: int):
        self.n_indent = n_indent
        self.t_max_s = t_max_predict_ms / 1e3 if t_max_predict_ms > 0 else None
        self.start: float | None = None

    def cut(self, text: str, new_text: str) -> int | None:
        """-> where to end the completion (text[:cut]), or None to go on."""
        now = time.monotonic()
        self.start = self.start or now
        if self.n_indent > 0 and "\n" in text:
            pos = text.index("\n") + 1
            while pos < len(text):  # each line after the first: is it indented enough?
                end = text.find("\n", pos)
                line = text[pos:] if end < 0 else text[pos:end + 1]
                stripped = line.lstrip(" \t")
                if stripped and len(line) - len(stripped) < self.n_indent:
                    return pos + len(line) - len(stripped)
                if end < 0:
                    break
                pos = end + 1
        if self.t_max_s is not None and "\n" in new_text and now - self.start > self.t_max_s:
            return len(text)
        return None


def pick_fields(obj: dict, fields: list[str]) -> dict:
    """llama.cpp's response_fields: "a/b" walks nested objects; the key is the path itself."""
    out = {}
    for path in fields:
        value, ok = obj, bool(path)
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                ok = False
                break
            value = value[part]
        if ok:
            out[path] = value
    return out


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@router.post("/infill", responses={**ERROR_RESPONSES, 200: {
    "description": "llama.cpp's completion object (an array when n_cmpl > 1), or SSE with stream",
    "content": {"application/json": {"schema": {"type": ["object", "array"]}}, "text/event-stream": {}}}})
async def infill(req: InfillRequest, request: Request):
    state = state_of(request)
    n_ctx = state.max_model_len
    max_tokens = req.n_predict if req.n_predict > 0 else (1 if req.n_predict == 0 else max(1, n_ctx // 4))
    extra = [{"filepath": c.filename, "content": c.text} for c in req.input_extra]
    prompt = code_prompt(state, req.input_prefix + req.prompt, req.input_suffix, extra_context=extra,
                         max_new_tokens=max_tokens)
    ids = state.tokenizer.encode(prompt.text)
    params = infill_sampling(req, max_tokens, code_stop_ids(state))
    rec = state.record("infill", "/infill", request.state.caller)
    stoppers = [IndentStop(req.n_indent, req.t_max_predict_ms) for _ in range(req.n_cmpl)]
    run = InfillRun(state, rec, req, ids, prompt.text, params, stoppers)
    if not ids:  # nothing before or after the cursor (a warm-up call): nothing to complete
        state.finish(rec)
        results = [run.result(i) for i in range(req.n_cmpl)]
        if req.stream:
            return StreamingResponse(iter(["data: " + compact(r) + "\n\n" for r in results]),
                                     media_type="text/event-stream")
        return JSONResponse(results[0] if req.n_cmpl == 1 else results)
    stream = state.submit(rec, [ids], params)[0]
    if req.stream:
        return StreamingResponse(run.sse(stream), media_type="text/event-stream")
    try:
        if not await run_unless_disconnected(request, run.consume(stream)):
            rec.finish_reason, rec.status = "abort", 499
            return Response(status_code=499)
    finally:
        stream.abort()
        state.finish(rec, [run.last])
    results = [run.result(i) for i in range(req.n_cmpl)]
    body = results[0] if req.n_cmpl == 1 else results
    return JSONResponse(body)


class InfillRun:
    def __init__(self, state: ServerState, rec: RequestRecord, req: InfillRequest, ids: list[int],
                 prompt_text: str, params: SamplingParams, stoppers: list[IndentStop]):
        self.state, self.rec, self.req, self.ids = state, rec, req, ids
        self.prompt_text, self.params, self.stoppers = prompt_text, params, stoppers
        self.texts = [""] * req.n_cmpl
        self.cut_at: list[int | None] = [None] * req.n_cmpl
        self.sent = [0] * req.n_cmpl
        self.sent_tokens = [0] * req.n_cmpl
        self.last = None
        self.first_token: float | None = None

    def _update(self, out) -> list[int]:
        """Applies the indent/time rules; -> indices whose text changed."""
        self.last = out
        if self.first_token is None and any(o.token_ids for o in out.outputs):
            self.first_token = time.monotonic()
        changed = []
        for o in out.outputs:
            i = o.index
            if self.cut_at[i] is not None:
                continue
            new = o.text[len(self.texts[i]):]
            self.texts[i] = o.text
            cut = self.stoppers[i].cut(o.text, new)
            if cut is not None:
                self.cut_at[i] = cut
                self.texts[i] = o.text[:cut]
            changed.append(i)
        return changed

    def _all_done(self) -> bool:
        return all(c is not None or o.finished for c, o in zip(self.cut_at, self.last.outputs))

    async def consume(self, stream) -> None:
        async for _, out in merge([stream], self.rec):
            self._update(out)
            if self._all_done():
                break

    async def sse(self, stream):
        try:
            async for _, out in merge([stream], self.rec):
                for i in self._update(out):
                    o = out.outputs[i]
                    piece = self.texts[i][self.sent[i]:]
                    self.sent[i] = len(self.texts[i])
                    tokens = o.token_ids[self.sent_tokens[i]:]
                    self.sent_tokens[i] = len(o.token_ids)
                    yield "data: " + compact({"index": i, "content": piece, "tokens": tokens, "stop": False,
                                              "id_slot": -1, "tokens_predicted": len(o.token_ids),
                                              "tokens_evaluated": len(self.ids)}) + "\n\n"
                if self._all_done():
                    break
            for i in range(self.req.n_cmpl):
                yield "data: " + compact({**self.result(i), "content": "", "tokens": []}) + "\n\n"
        except Exception as e:  # noqa: BLE001 - reported in-stream, as llama.cpp does
            self.rec.status = 500
            yield "data: " + compact(error_body(500, f"generation failed: {e}")) + "\n\n"
        finally:
            stream.abort()
            self.state.finish(self.rec, [self.last])

    def result(self, i: int) -> dict:
        """llama.cpp's final completion object for completion `i`."""
        req, out = self.req, self.last
        o = out.outputs[i] if out is not None else None
        text = self.texts[i]
        n_pred = len(o.token_ids) if o else 0
        if self.cut_at[i] is not None:
            stop_type, word = "limit", ""
        elif o is not None and o.finish_reason == "stop":
            stop_type = "word" if isinstance(o.stop_reason, str) else "eos"
            word = o.stop_reason if isinstance(o.stop_reason, str) else ""
        else:
            stop_type, word = ("limit" if o and o.finish_reason == "length" else "none"), ""
        m = out.metrics if out is not None else {}
        cached = out.num_cached_tokens if out is not None else 0
        start = m.get("scheduled", m.get("arrival", time.monotonic()))
        first = m.get("first_token", start)
        end = m.get("finished", time.monotonic())
        prompt_n = max(0, len(self.ids) - cached)
        prompt_ms = max((first - start) * 1e3, 1e-3)
        predicted_ms = max((end - first) * 1e3, 1e-3)
        obj = {
            "index": i, "content": text, "tokens": list(o.token_ids) if (o and req.return_tokens) else [],
            "id_slot": 0, "stop": True, "model": self.state.config.served_model_name,
            "tokens_predicted": n_pred, "tokens_evaluated": len(self.ids),
            "generation_settings": {
                "n_ctx": self.state.max_model_len, "n_predict": self.params.max_tokens,
                "max_tokens": self.params.max_tokens, "temperature": self.params.temperature,
                "top_k": self.params.top_k, "top_p": self.params.top_p, "min_p": self.params.min_p,
                "seed": req.seed if req.seed >= 0 else 4294967295, "stop": req.stop, "stream": req.stream,
                "n_indent": req.n_indent, "t_max_predict_ms": req.t_max_predict_ms,
                "samplers": req.samplers if isinstance(req.samplers, list) else ["top_k", "top_p", "min_p", "temperature"]},
            "prompt": self.prompt_text, "has_new_line": "\n" in text, "truncated": False,
            "stop_type": stop_type, "stopping_word": word,
            "tokens_cached": len(self.ids) + max(0, n_pred - 1),
            "timings": {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                        "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
                        "prompt_per_second": 1e3 / prompt_ms * prompt_n, "predicted_n": n_pred,
                        "predicted_ms": predicted_ms, "predicted_per_token_ms": predicted_ms / max(n_pred, 1),
                        "predicted_per_second": 1e3 / predicted_ms * n_pred},
        }
        return pick_fields(obj, req.response_fields) if req.response_fields else obj

