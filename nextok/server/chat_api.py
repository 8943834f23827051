"""OpenAI-compatible chat completions, plus /v1/models, /tokenize and /detokenize."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from nextok.outputs import CompletionOutput
from nextok.server import protocol as P
from nextok.server.errors import APIError
from nextok.server.openai_api import SSE, sampling_params, sse, state_of, streaming, usage
from nextok.server.state import ServerState, merge

router = APIRouter()


def chat_prompt_ids(state: ServerState, messages: list[P.ChatMessage], add_generation_prompt: bool) -> list[int]:
    msgs = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        msgs.append({"role": m.role, "content": content or "", **({"name": m.name} if m.name else {})})
    try:
        text = state.tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # the template's own raise_exception(), or a template error
        raise APIError(400, f"the chat template rejected these messages: {e}", param="messages") from e
    return state.tokenizer.encode(text, add_special_tokens=False)


def chat_logprobs(state: ServerState, o: CompletionOutput, start: int) -> P.ChatLogprobs:
    tok = state.tokenizer

    def entry(tid: int, lp: float) -> dict:
        text = tok.decode([tid], skip_special_tokens=False)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = [P.ChatTokenLogprob(**entry(lp.token_id, lp.logprob),
                                  top_logprobs=[P.TopLogprob(**entry(t, v)) for t, v in lp.top])
               for lp in (o.logprobs or [])[start:]]
    return P.ChatLogprobs(content=content)


@router.post("/v1/chat/completions", response_model=P.ChatCompletionResponse,
             responses={**P.ERROR_RESPONSES, **SSE})
async def chat_completions(req: P.ChatCompletionRequest, request: Request):
    state = state_of(request)
    state.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    ids = chat_prompt_ids(state, req.messages, req.add_generation_prompt)
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is None:  # as OpenAI: whatever room the context window leaves
        max_tokens = max(1, state.max_model_len - len(ids))
    params = sampling_params(req, max_tokens, (req.top_logprobs or 0) if req.logprobs else None)
    rec = state.record("chatcmpl", "/v1/chat/completions", request.state.caller)
    streams = state.submit(rec, [ids], params, streamed=req.stream)
    created, model = int(time.time()), req.model or state.config.served_model_name
    if req.stream:
        finals: list = [None]
        return streaming(state, rec, _chat_chunks(state, rec, req, streams, created, model, finals), finals)
    outs = await state.collect(request, streams, rec)
    if outs is None:
        state.finish(rec)
        return Response(status_code=499)
    choices = [P.ChatChoice(index=o.index, message=P.ChatResponseMessage(content=o.text),
                            logprobs=chat_logprobs(state, o, 0) if req.logprobs else None,
                            finish_reason=o.finish_reason, stop_reason=o.stop_reason)
               for o in outs[0].outputs]
    state.finish(rec, outs)
    return P.ChatCompletionResponse(id=rec.id, created=created, model=model, choices=choices,
                                    usage=usage(rec, outs))


async def _chat_chunks(state, rec, req, streams, created, model, finals):
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(choices, use=None):
        body = {"id": rec.id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": choices}
        if include_usage:
            body["usage"] = use.model_dump() if use else None
        return sse(body)

    for j in range(req.n):  # OpenAI's first chunk of each choice carries the role
        yield chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
    sent_lp: dict[int, int] = {}
    async for _, out in merge(streams, rec):
        if out is None:
            continue
        finals[0] = out
        for o in out.outputs:
            if not (o.delta_text or o.finished):
                continue
            lp = None
            if req.logprobs:
                lp = chat_logprobs(state, o, sent_lp.get(o.index, 0)).model_dump()
                sent_lp[o.index] = len(o.logprobs or [])
            delta = {"content": o.delta_text} if o.delta_text else {}
            yield chunk([{"index": o.index, "delta": delta, "logprobs": lp,
                          "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}])
    if include_usage:
        yield chunk([], usage(rec, finals))


@router.get("/v1/models", response_model=P.ModelList, responses=P.ERROR_RESPONSES)
async def models(request: Request):
    state = state_of(request)
    return P.ModelList(data=[P.ModelCard(id=state.config.served_model_name, created=state.created,
                                         max_model_len=state.max_model_len)])


@router.post("/tokenize", response_model=P.TokenizeResponse, responses=P.ERROR_RESPONSES)
async def tokenize(req: P.TokenizeRequest, request: Request):
    state = state_of(request)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "send exactly one of prompt or messages", param="prompt")
    if req.messages is not None:
        ids = chat_prompt_ids(state, req.messages, True)
    else:
        ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    return P.TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=ids)


@router.post("/detokenize", response_model=P.DetokenizeResponse, responses=P.ERROR_RESPONSES)
async def detokenize(req: P.DetokenizeRequest, request: Request):
    state = state_of(request)
    state.check_model(req.model)
    state.check_token_ids(req.tokens, "tokens")
    return P.DetokenizeResponse(prompt=state.tokenizer.decode(req.tokens, skip_special_tokens=False))
