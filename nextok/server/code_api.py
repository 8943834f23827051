"""Code completion: /v1/code/complete and llama.cpp's /infill, on one path.

    request -> prefix/suffix (split a document at the cursor) -> the family's FIM prompt with
    repository context -> engine stream -> stop rules (line / block end) -> completion

A request carrying a `session_id` cancels that session's earlier request: editors send one per
keystroke and only the newest matters.
"""
from __future__ import annotations

import asyncio
import functools
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from nextok.engine.async_engine import EngineDeadError, RequestStream
from nextok.sampling_params import SamplingParams
from nextok.server import protocol as P
from nextok.server.errors import APIError, error_body
from nextok.server.openai_api import SSE, sse, state_of
from nextok.server.state import RequestRecord, ServerState, run_unless_disconnected

router = APIRouter()
DEFAULT_MAX_TOKENS = {"single_line": 64, "multi_line": 256}


def fim_of(state: ServerState):
    """The model's FIM family (detected from the vocabulary once; --fim-format overrides)."""
    if not hasattr(state, "fim_format"):
        from nextok.server import fim

        state.fim_format = fim.resolve_fim_format(state.tokenizer, state.config.fim_format)
    return state.fim_format


def token_counter(state: ServerState):
    """count_tokens(text) with a cache: a keystroke re-counts mostly the same line groups."""
    if not hasattr(state, "count_tokens"):
        encode = state.tokenizer.encode
        state.count_tokens = functools.lru_cache(maxsize=8192)(
            lambda text: len(encode(text, add_special_tokens=False)))
    return state.count_tokens


def code_prompt(state: ServerState, prefix: str, suffix: str, language: str = "",
                filepath: str | None = None, extra_context=(), max_new_tokens: int = 1):
    from nextok.server import fim

    if max_new_tokens >= state.max_model_len:
        raise APIError(400, f"max_tokens ({max_new_tokens}) leaves no room for the prompt in the "
                            f"context window of {state.max_model_len} tokens", param="max_tokens")
    return fim.build_code_prompt(
        fim_of(state), prefix, suffix, count_tokens=token_counter(state), language=language or None,
        filepath=filepath, extra_context=list(extra_context),
        order=state.config.fim_order, max_prompt_tokens=state.max_model_len - max(1, max_new_tokens),
        context_tokens=state.config.code_context_tokens)


def fim_prompt_ids(state: ServerState, prefix: str, suffix: str, max_new_tokens: int = 16) -> list[int]:
    """OpenAI `suffix` on /v1/completions (Continue's FIM): the same FIM layout."""
    prompt = code_prompt(state, prefix, suffix, max_new_tokens=max_new_tokens)
    return state.tokenizer.encode(prompt.text)  # with BOS where the family's tokenizer adds one


def code_stop_ids(state: ServerState) -> list[int]:
    from nextok.server import fim

    if not hasattr(state, "code_stop_ids"):
        state.code_stop_ids = fim.stop_token_ids(fim_of(state), state.tokenizer)
    return state.code_stop_ids


class CodeRun:
    """One code completion in flight: feeds the stop rules and knows what is safe to stream."""

    def __init__(self, stream: RequestStream, stopper, mode: str, typed_indent: str = ""):
        self.stream = stream
        self.stopper = stopper
        self.mode = mode
        self.typed_indent = typed_indent  # the cursor line, when it holds only indentation
        self.text = ""
        self.sent = 0
        self.cut: int | None = None
        self.finish_reason: str | None = None
        self.out = None

    def feed(self, out) -> None:
        self.out = out
        o = out.outputs[0]
        self.text = self._at_cursor(o.text, o.finished)
        self.cut = self.stopper.feed(self.text)
        if self.cut is not None:
            self.text = self.text[:self.cut]
            self.finish_reason = "stop"
            self.stream.abort("stop")  # the block ended: stop generating now
        elif o.finished:
            self.text = self.stopper.finish(self.text)
            self.finish_reason = o.finish_reason

    def _at_cursor(self, generated: str, finished: bool) -> str:
        """The generated text as inserted at the cursor. On a line holding only indentation, a
        plain LM (prompted with trailing spaces, an unusual token split) often ends that line
        and writes the code on the next one, re-indented; inserted as is, that would leave a
        blank line behind. Such a start is moved up onto the cursor's line."""
        indent = self.typed_indent
        if not indent or not generated.startswith(("\n", "\r\n")):
            return generated
        rest = generated.split("\n", 1)[1]
        if rest.startswith(indent):
            return rest[len(indent):]
        if indent.startswith(rest) and not finished:
            return ""  # not enough yet to tell
        return rest.lstrip(" \t")

    def safe_delta(self) -> str:
        """Text that no later stop-rule cut can take back (all of it once finished)."""
        end = len(self.text) if self.finish_reason else self.stopper.safe_length(self.text)
        delta = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta


def document_parts(req: P.CodeCompleteRequest) -> tuple[str, str]:
    """(prefix, suffix) from either request shape."""
    from nextok.server.code_context import split_document

    if req.prefix is not None:
        if req.code is not None or req.position is not None:
            raise APIError(400, "send either prefix/suffix or code/position, not both", param="prefix")
        return req.prefix, req.suffix
    if req.code is None or req.position is None:
        raise APIError(400, "send prefix (and suffix), or code with position", param="prefix")
    try:
        return split_document(req.code, req.position.line, req.position.character)
    except ValueError as e:
        raise APIError(400, str(e), param="position") from e


def typed_indent(prefix: str) -> str:
    """The cursor line's text when it is only indentation, else ""."""
    head = prefix[prefix.rfind("\n") + 1:]
    return head if head and not head.strip() else ""


def start(state: ServerState, rec: RequestRecord, ids: list[int], params: SamplingParams,
          stopper, mode: str, session: str | None, typed_indent: str = "") -> CodeRun:
    """Queues the completion; a newer request of the same session cancels the older one."""
    run = CodeRun(state.submit(rec, [ids], params)[0], stopper, mode, typed_indent)
    if session is not None:
        key = (rec.caller.name, session)
        old = state.sessions.get(key)
        if old is not None:
            old.abort("cancelled")  # superseded by this keystroke
        state.sessions[key] = run.stream
    return run


async def drive(run: CodeRun, rec: RequestRecord, on_step=None) -> None:
    """Runs the completion to its end: the engine's stop, a stop rule's cut, or cancellation."""
    async for out in run.stream:
        if rec.first_token is None and out.outputs and out.outputs[0].token_ids:
            rec.first_token = time.monotonic()
        run.feed(out)
        if on_step is not None:
            await on_step(run)
        if run.finish_reason is not None:
            break
    if run.finish_reason is None:  # the stream ended early: aborted
        run.finish_reason = run.stream.aborted or "abort"
        run.text = run.text[:run.stopper.safe_length(run.text)]


def release(state: ServerState, rec: RequestRecord, session: str | None, run: CodeRun) -> None:
    run.stream.abort()
    if session is not None and state.sessions.get((rec.caller.name, session)) is run.stream:
        del state.sessions[(rec.caller.name, session)]
    rec.finish_reason = rec.finish_reason or run.finish_reason
    rec.completion_tokens = len(run.out.outputs[0].token_ids) if run.out and run.out.outputs else 0
    state.finish(rec)


@router.post("/v1/code/complete", response_model=P.CodeCompleteResponse, responses={**P.ERROR_RESPONSES, **SSE})
async def code_complete(req: P.CodeCompleteRequest, request: Request):
    """Completes code at the cursor, with the model's FIM layout, stop rules and cancellation."""
    from nextok.server.code_stops import CodeStopper, default_mode

    state = state_of(request)
    state.check_model(req.model)
    prefix, suffix = document_parts(req)
    mode = default_mode(suffix) if req.mode == "auto" else req.mode
    max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS[mode]
    context = [c.model_dump() for c in req.extra_context]
    prompt = code_prompt(state, prefix, suffix, req.language, req.filepath, context, max_tokens)
    ids = state.tokenizer.encode(prompt.text)  # with BOS where the family's tokenizer adds one
    try:
        params = SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                                max_tokens=max_tokens, stop=req.stop, stop_token_ids=code_stop_ids(state))
        stopper = CodeStopper(mode, req.language or None, prefix, suffix, req.filepath)
    except ValueError as e:
        raise APIError(400, str(e)) from e
    rec = state.record("code", "/v1/code/complete", request.state.caller)
    model = req.model or state.config.served_model_name
    if not ids:  # an empty file and no FIM tokens: nothing to continue from
        state.finish(rec)
        return {"id": rec.id, "object": "code_completion", "model": model, "completion": "",
                "finish_reason": "stop", "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                "cached_tokens": 0, "fim": prompt.fim, "mode": mode}
    run = start(state, rec, ids, params, stopper, mode, req.session_id, typed_indent(prefix))

    def body(chunk: bool = False) -> dict:
        o = run.out.outputs[0] if run.out and run.out.outputs else None
        done = len(o.token_ids) if o else 0
        return {"id": rec.id, "object": "code_completion" + (".chunk" if chunk else ""), "model": model,
                "completion": run.text, "finish_reason": run.finish_reason,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": done, "total_tokens": len(ids) + done},
                "cached_tokens": run.out.num_cached_tokens if run.out else 0, "fim": prompt.fim, "mode": mode,
                **({"prompt": prompt.text} if req.return_prompt else {})}

    if req.stream:
        return StreamingResponse(_code_chunks(state, rec, req, run, body),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        if not await run_unless_disconnected(request, drive(run, rec)):
            rec.finish_reason, rec.status = "abort", 499
            return Response(status_code=499)
    finally:
        release(state, rec, req.session_id, run)
    return body()


async def _code_chunks(state, rec, req, run: CodeRun, body):
    """SSE: `{"delta": ...}` chunks of text no stop rule can take back, then the final object
    (with finish_reason, usage, cached_tokens), then [DONE]."""
    queue: asyncio.Queue = asyncio.Queue()

    async def on_step(r: CodeRun):
        delta = r.safe_delta()
        if delta:
            queue.put_nowait(delta)

    async def produce():
        try:
            await drive(run, rec, on_step)
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(produce())
    try:
        while (delta := await queue.get()) is not None:
            yield sse({"id": rec.id, "object": "code_completion.chunk", "delta": delta, "finish_reason": None})
        try:
            task.result()
            final = body(chunk=True)
            final["delta"] = run.safe_delta()
            yield sse(final)
        except (EngineDeadError, RuntimeError) as e:
            rec.status = 500
            yield sse(error_body(500, f"generation failed: {e}"))
        yield "data: [DONE]\n\n"
    finally:
        task.cancel()
        release(state, rec, req.session_id, run)
