"""Request and response shapes of the HTTP API (pydantic), as the OpenAI reference defines them.

Strict types (a string where a number belongs is a 400, not a silent cast) and unknown fields
ignored, as OpenAI's own API does. Value ranges are declared here so that `/openapi.json` states
them; `SamplingParams` checks the combinations.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(strict=True, extra="ignore")

TokenIds = list[Annotated[int, Field(ge=0)]]


class Request(BaseModel):
    model_config = _STRICT


class StreamOptions(Request):
    include_usage: bool = False


class SamplingFields(Request):
    """Sampling fields shared by completions and chat (OpenAI's, then vLLM's extras)."""

    model: str | None = Field(None, description="Served model name; omitted = the served model.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    user: str | None = None
    # vLLM's extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: TokenIds | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        ..., description="A string, a list of strings, a list of token ids, or a list of those.")
    suffix: str | None = Field(None, description="Text after the insertion point: fill-in-the-middle.")
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=16)


class TextPart(Request):
    type: Literal["text"]
    text: str


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True


class TokenizeRequest(Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(Request):
    model: str | None = None
    tokens: TokenIds


# ---- responses ------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict | None = None  # {"cached_tokens": N}


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "cancelled"] | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "cancelled"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "nextok"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# OpenAPI: every route may answer these (the error body is the same everywhere).
ERROR_RESPONSES = {code: {"model": ErrorResponse, "description": desc} for code, desc in (
    (400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
    (413, "Request body too large"), (429, "Rate limit exceeded"), (500, "Internal error"),
    (503, "Server overloaded or shutting down"))}


# ---- code completion -------------------------------------------------------------------------
class ContextFile(Request):
    filepath: str
    content: str


class CursorPosition(Request):
    line: int = Field(..., ge=0, description="0-based line of the cursor")
    character: int = Field(..., ge=0, description="0-based column, in UTF-16 code units (as LSP)")


class CodeCompleteRequest(Request):
    """Either prefix (+ suffix) around the cursor, or the whole document `code` + `position`."""

    model: str | None = None
    prefix: str | None = None
    suffix: str = ""
    code: str | None = None
    position: CursorPosition | None = None
    language: str = Field("", description="e.g. python, javascript, go; picks comment syntax and stop rules")
    filepath: str | None = None
    extra_context: list[ContextFile] = Field(default_factory=list, description="snippets of other files")
    mode: Literal["single_line", "multi_line", "auto"] = "auto"
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: list[str] | None = None
    session_id: str | None = Field(None, max_length=256,
                                   description="a newer request with the same id cancels this one")
    stream: bool = False
    return_prompt: bool = Field(False, description="include the prompt the model saw (debugging)")


class CodeCompleteResponse(BaseModel):
    id: str
    object: Literal["code_completion"] = "code_completion"
    model: str
    completion: str
    finish_reason: Literal["stop", "length", "cancelled", "abort"]
    usage: Usage
    cached_tokens: int
    fim: bool
    mode: Literal["single_line", "multi_line"]
    prompt: str | None = None
