"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models, tokenize."""
from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from nextok.engine.async_engine import EngineDeadError
from nextok.outputs import CompletionOutput, RequestOutput
from nextok.sampling_params import SamplingParams
from nextok.server import protocol as P
from nextok.server.errors import APIError, error_body
from nextok.server.state import RequestRecord, ServerState, merge

router = APIRouter()
SSE = {200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks with stream=true"}}


def state_of(request: Request) -> ServerState:
    return request.app.state.nextok


def sampling_params(req: P.SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """The request's sampling fields as engine parameters; a bad combination is a 400."""
    try:
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k, min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            logit_bias={_token_key(k): v for k, v in (req.logit_bias or {}).items()} or None,
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=req.stop,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens)
    except ValueError as e:
        raise APIError(400, str(e)) from e


def _token_key(key: str) -> int:
    if not key.lstrip("-").isdigit():
        raise APIError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
    return int(key)


def usage(rec: RequestRecord, outputs: list[RequestOutput | None]) -> P.Usage:
    done = sum(len(o.token_ids) for out in outputs if out for o in out.outputs)
    cached = sum(out.num_cached_tokens for out in outputs if out)
    return P.Usage(prompt_tokens=rec.prompt_tokens, completion_tokens=done,
                   total_tokens=rec.prompt_tokens + done,
                   prompt_tokens_details={"cached_tokens": cached})


def sse(obj) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(exclude_none=False)
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def sse_guard(state: ServerState, rec: RequestRecord, body: AsyncIterator[str],
                    finals: list) -> AsyncIterator[str]:
    """Wraps an SSE body: an engine failure becomes an error event, and [DONE] always ends it."""
    try:
        async for chunk in body:
            yield chunk
    except (EngineDeadError, RuntimeError) as e:
        rec.status = 500
        yield sse(error_body(500, f"generation failed: {e}"))
    yield "data: [DONE]\n\n"
    state.finish(rec, finals)


def streaming(state: ServerState, rec: RequestRecord, body: AsyncIterator[str], finals: list):
    async def guarded():
        try:
            async for chunk in sse_guard(state, rec, body, finals):
                yield chunk
        finally:  # the client went away mid-stream: merge() has aborted the requests
            if not rec.done:
                rec.finish_reason, rec.status = rec.finish_reason or "abort", 499
                state.finish(rec, finals)

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---- /v1/completions ------------------------------------------------------------------------
def completion_prompts(state: ServerState, req: P.CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of every prompt; with `suffix`, the model's FIM prompt."""
    p = req.prompt
    if isinstance(p, str):
        texts = [p]
    elif p and all(isinstance(x, str) for x in p):
        texts = list(p)
    elif p and all(isinstance(x, int) for x in p):
        texts = None
        ids = [list(p)]
    elif p and all(isinstance(x, list) for x in p):
        texts = None
        ids = [list(x) for x in p]
    else:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if req.suffix is not None:
        if texts is None:
            raise APIError(400, "suffix needs a text prompt, not token ids", param="suffix")
        from nextok.server.code_api import fim_prompt_ids

        ids = [fim_prompt_ids(state, t, req.suffix, req.max_tokens or 16) for t in texts]
    elif texts is not None:
        ids = [state.tokenizer.encode(t) for t in texts]
    if any(not x for x in ids):
        raise APIError(400, "prompt must not be empty", param="prompt")
    if texts is None:
        for x in ids:
            state.check_token_ids(x, "prompt", "prompt token id")
    texts = texts or [state.tokenizer.decode(x, skip_special_tokens=False) for x in ids]
    return ids, texts


def completion_logprobs(state: ServerState, o: CompletionOutput, start: int, offset: int) -> P.CompletionLogprobs:
    """OpenAI's legacy logprobs for o.logprobs[start:]; text offsets count from `offset`."""
    tok = state.tokenizer
    lps = (o.logprobs or [])[start:]
    tokens = [tok.decode([lp.token_id], skip_special_tokens=False) for lp in lps]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = [{tok.decode([tid], skip_special_tokens=False): v for tid, v in lp.top} for lp in lps]
    return P.CompletionLogprobs(tokens=tokens, token_logprobs=[lp.logprob for lp in lps],
                                top_logprobs=tops, text_offset=offsets)


@router.post("/v1/completions", response_model=P.CompletionResponse,
             responses={**P.ERROR_RESPONSES, **SSE})
async def completions(req: P.CompletionRequest, request: Request):
    state = state_of(request)
    state.check_model(req.model)
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of different from n is not supported", param="best_of")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs needs prompt logprobs, which are not supported",
                       param="echo")
    ids, texts = completion_prompts(state, req)
    params = sampling_params(req, req.max_tokens, req.logprobs)
    rec = state.record("cmpl", "/v1/completions", request.state.caller)
    streams = state.submit(rec, ids, params, streamed=req.stream)
    created, model = int(time.time()), req.model or state.config.served_model_name
    if req.stream:
        finals: list = [None] * len(streams)
        return streaming(state, rec, _completion_chunks(state, rec, req, streams, texts, created,
                                                        model, finals), finals)
    outs = await state.collect(request, streams, rec)
    if outs is None:
        state.finish(rec)
        return Response(status_code=499)  # nobody is listening any more
    choices = []
    for i, out in enumerate(outs):
        for o in out.outputs:
            echo = texts[i] if req.echo else ""
            lp = completion_logprobs(state, o, 0, 0) if req.logprobs is not None else None
            choices.append(P.CompletionChoice(index=i * req.n + o.index, text=echo + o.text, logprobs=lp,
                                              finish_reason=o.finish_reason, stop_reason=o.stop_reason))
    state.finish(rec, outs)
    return P.CompletionResponse(id=rec.id, created=created, model=model, choices=choices,
                                usage=usage(rec, outs))


async def _completion_chunks(state, rec, req, streams, texts, created, model, finals):
    def chunk(choices, use=None):
        return sse({"id": rec.id, "object": "text_completion", "created": created, "model": model,
                    "choices": choices, **({"usage": use.model_dump()} if use else {})})

    if req.echo:
        for i, text in enumerate(texts):
            for j in range(req.n):
                yield chunk([{"index": i * req.n + j, "text": text, "logprobs": None, "finish_reason": None}])
    sent_lp = {}
    async for i, out in merge(streams, rec):
        if out is None:
            continue
        finals[i] = out
        for o in out.outputs:
            if not (o.delta_text or o.finished):
                continue
            index = i * req.n + o.index
            lp = None
            if req.logprobs is not None:
                start = sent_lp.get(index, 0)
                lp = completion_logprobs(state, o, start, len(o.text) - len(o.delta_text)).model_dump()
                sent_lp[index] = len(o.logprobs or [])
            yield chunk([{"index": index, "text": o.delta_text, "logprobs": lp,
                          "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}])
    if req.stream_options and req.stream_options.include_usage:
        yield chunk([], usage(rec, finals))
