"""Per-request generation parameters, shaped like vLLM's `SamplingParams`.

Validation happens here, at construction, so a bad value is a clear `ValueError`
before the request ever reaches the engine (the server maps it to HTTP 400).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context window
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # number of top alternatives besides the sampled token
    prompt_logprobs: int | None = None  # not supported yet; must stay None
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict)  # free-form, carried through untouched

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == 0:
            self.top_k = -1
        self._validate()

    def _validate(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not isinstance(self.n, int) or self.n < 1:
            bad(f"n must be an integer >= 1, got {self.n!r}")
        if self.n > 128:
            bad(f"n must be <= 128, got {self.n}")
        if not (0.0 <= self.temperature <= 100.0):
            bad(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            bad(f"top_k must be -1 (off) or a positive integer, got {self.top_k!r}")
        if not (0.0 <= self.min_p <= 1.0):
            bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not (0.0 < self.repetition_penalty <= 10.0):
            bad(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            bad(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None:
            bad("prompt_logprobs is not supported")
        if self.seed is not None and not isinstance(self.seed, int):
            bad(f"seed must be an integer, got {self.seed!r}")
        for tid, bias in (self.logit_bias or {}).items():
            if not (-100.0 <= bias <= 100.0):
                bad(f"logit_bias values must be in [-100, 100], got {bias} for token {tid}")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_token_history(self) -> bool:
        """Do this request's logits depend on the tokens so far (the penalties)? Such a request
        samples with every earlier token known, so async scheduling waits for each step."""
        return self.repetition_penalty != 1.0 or bool(self.frequency_penalty) or bool(self.presence_penalty)
