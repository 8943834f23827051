"""What `LLM.generate` and `LLMEngine.step` return, shaped like vLLM's RequestOutput."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    logprobs: list[Logprob] | None = None
    # Streaming: what this step added (text held back for a possible stop string is excluded).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # arrival, scheduled, first_token, finished: time.monotonic() stamps
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # set when this request failed inside the engine (outputs empty)
