"""The offline API, shaped like vLLM's: `LLM(model=None).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Sequence as Seq

from nextok.engine.factory import EngineArgs, create_engine
from nextok.outputs import RequestOutput
from nextok.sampling_params import SamplingParams

_ARG_NAMES = {f.name for f in dataclasses.fields(EngineArgs)}


class LLM:
    """Keyword arguments mirror the CLI flags (see `EngineArgs`)."""

    def __init__(self, model: str | None = None, dtype: str = "auto", **kwargs):
        unknown = set(kwargs) - _ARG_NAMES
        if unknown:
            raise TypeError(f"unknown LLM arguments: {', '.join(sorted(unknown))}")
        self.engine = create_engine(EngineArgs(model=model, dtype=dtype, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | list[int] | Seq[str | list[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Runs every prompt to completion in continuous batches; outputs in prompt order.

        `prompts`: a string, a list of token ids, a vLLM prompt dict ({"prompt": text} or
        {"prompt_token_ids": ids}), or a list of those.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        order = []
        try:
            for prompt, p in zip(prompts, params):
                rid = f"gen-{next(self._ids)}"
                self.engine.add_request(rid, prompt, p)
                order.append(rid)
        except Exception:
            for rid in order:
                self.engine.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        bar = _progress(len(order)) if use_tqdm else None
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[rid] for rid in order]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Yields text deltas of one completion as they are generated (n must be 1)."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() takes n=1")
        rid = f"stream-{next(self._ids)}"
        self.engine.add_request(rid, prompt, params, stream=True)
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.request_id == rid:
                        if out.outputs[0].delta_text:
                            yield out.outputs[0].delta_text
                        if out.finished:
                            self.last_output = out
                            return
        finally:
            self.engine.abort_request(rid)

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None) -> RequestOutput:
        prompt = self.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.engine.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate([ids], sampling_params)[0]


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req")
