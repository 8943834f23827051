"""The engine loop: requests in, one batched model step at a time, outputs out.

    step(): scheduler.schedule() -> runner.launch() -> scheduler.advance()
            -> runner.collect() -> scheduler.resolve() -> detokenize -> outputs

With async scheduling (default on CUDA) a step launches step N+1 before it collects step N, so
the host's work (collecting, detokenizing, scheduling, preparing inputs) runs while the GPU
computes instead of leaving it idle between steps: `step()` returns step N's outputs. A request
with penalties needs every earlier token on the host, so while one runs the engine collects each
step before scheduling the next, as it always does without async scheduling.

The engine sees token ids; prompt strings are tokenized here only as a convenience for the
offline API. Single-threaded; `AsyncEngine` (server) wraps it.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field

from nextok.config import EngineConfig
from nextok.engine.block_manager import BlockManager
from nextok.engine.detokenizer import IncrementalDetokenizer
from nextok.engine.scheduler import Scheduler
from nextok.engine.sequence import Sequence, SequenceStatus
from nextok.errors import InvalidRequestError
from nextok.outputs import CompletionOutput, Logprob, RequestOutput
from nextok.sampling_params import SamplingParams
from nextok.worker.model_runner import ModelRunner


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    seqs: list[Sequence]
    detoks: list[IncrementalDetokenizer]
    logprobs: list[list[Logprob]] | None
    metrics: dict = field(default_factory=dict)
    emitted: list[int] = field(default_factory=list)  # per seq: characters of text already streamed
    emitted_tokens: list[int] = field(default_factory=list)  # per seq: output token ids already streamed

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer, runner: ModelRunner, num_blocks: int,
                 max_model_len: int, proposer=None):
        """proposer: speculative decoding's (spec/), built by the factory; None: built here
        from config.speculative (ngram needs nothing else)."""
        self.config = config
        self.tokenizer = tokenizer
        if hasattr(tokenizer, "byte_pieces"):
            tokenizer.byte_pieces(True)  # the detokenizer's table (~0.1 s): built now, not on a request
        self.runner = runner
        self.max_model_len = max_model_len
        mc = config.model
        # Prefix caching and a sliding window don't mix here: freed window blocks break chains.
        prefix = config.cache.enable_prefix_caching and mc.sliding_window is None
        self.block_manager = BlockManager(num_blocks, config.cache.block_size, prefix)
        self.scheduler = Scheduler(config.scheduler, self.block_manager, mc.eos_token_ids,
                                   mc.sliding_window)
        self.requests: dict[str, _Request] = {}
        self._inflight = None  # (SchedulerOutput, LaunchedStep) launched but not collected yet
        from nextok.spec import make_proposer

        self.proposer = proposer if proposer is not None else make_proposer(config.speculative)
        # Bound once: a model proposer drafts for the whole batch in one call and keeps draft
        # KV per sequence until released; ngram proposes one sequence at a time, statelessly.
        self._propose_batch = getattr(self.proposer, "propose_batch", None) or self._propose_each
        self._release_drafts = getattr(self.proposer, "release", None)
        self.spec_stats = {"steps": 0, "proposed": 0, "accepted": 0}  # verify steps' totals

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    stream: bool = False, arrival: float | None = None) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        text, ids = self._prompt_ids(prompt)
        self.validate(ids, params)
        arrival = time.monotonic() if arrival is None else arrival
        seqs = [Sequence(request_id, ids, params, index=i, arrival=arrival) for i in range(params.n)]
        # not streamed: its text is read once, when it ends (no stop string: decoded then)
        detoks = [IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens,
                                         params.stop, params.include_stop_str_in_output, deferred=not stream)
                  for _ in seqs]
        lps = [[] for _ in seqs] if params.logprobs is not None else None
        req = _Request(request_id, text, ids, params, stream, seqs, detoks, lps,
                       {"arrival": arrival}, [0] * len(seqs), [0] * len(seqs))
        self.requests[request_id] = req
        for seq in seqs:
            self.scheduler.add(seq)

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a prompt: a string, token ids, or vLLM's prompt dicts
        {"prompt": text} / {"prompt_token_ids": ids}; anything else is refused by name."""
        if isinstance(prompt, dict):
            keys = set(prompt) & {"prompt", "prompt_token_ids"}
            if len(keys) != 1:
                raise InvalidRequestError(f"a prompt dict takes one of 'prompt' (text) or 'prompt_token_ids', "
                                          f"not the keys {sorted(prompt)}")
            prompt = prompt[keys.pop()]
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):  # (numpy, torch: ids)
            ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
            bad = next((t for t in ids if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
            if bad is None:
                return None, [int(t) for t in ids]
            raise InvalidRequestError(f"prompt token ids must be integers, not {type(bad).__name__} ({bad!r:.40})")
        raise InvalidRequestError(f"a prompt is a string, a list of token ids, or a dict with 'prompt' or "
                                  f"'prompt_token_ids'; got {type(prompt).__name__}")

    def validate(self, ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequestError for a request the engine cannot run. Reads only frozen
        config, so the server may call it from its own thread before queueing the request."""
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.config.model.vocab_size
        bad = next((t for t in ids if not (0 <= t < vocab)), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        for name, tids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
            bad = next((t for t in tids if not (0 <= t < vocab)), None)
            if bad is not None:
                raise InvalidRequestError(f"{name} token id {bad} is outside the vocabulary [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens; the context window is {self.max_model_len} "
                f"tokens, including at least one generated token")
        if params.max_tokens is not None and len(ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"the prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"the context window of {self.max_model_len} tokens")

    def abort_request(self, request_id: str) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        for seq in req.seqs:
            self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)
        self._release(req.seqs)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        # Speculation proposes from every earlier token, so it needs them on the host too.
        overlap = self.config.async_scheduling and not any(
            s.params.needs_token_history or self._speculates(s) for s in self.scheduler.running)
        if self._inflight is not None and not overlap:
            outputs += self._finish_step(*self._inflight)
            self._inflight = None
        sched = self.scheduler.schedule(self._drafts())
        if sched.preempted and self._release_drafts is not None:
            self._release_drafts([s.seq_id for s in sched.preempted])  # re-drafted once readmitted
        launched = None
        if not sched.is_empty:
            started = time.monotonic()
            for item in sched.scheduled:
                req = self.requests.get(item.seq.request_id)
                if req is not None:
                    req.metrics.setdefault("scheduled", started)  # queue time ends here
            launched = (sched, self.runner.launch(sched))
            self.scheduler.advance(sched)
        if self._inflight is not None:  # collected while the step just launched runs
            outputs += self._finish_step(*self._inflight)
            self._inflight = None
        if launched is not None:
            if overlap:
                self._inflight = launched
            else:
                outputs += self._finish_step(*launched)
        return outputs

    # ---- speculative decoding ------------------------------------------------------------
    def _speculates(self, seq: Sequence) -> bool:
        """Does this sequence take drafts? Not with per-position sampling state (penalties,
        min_tokens) or logprobs, which the verify step does not compute (spec/verify.py)."""
        p = seq.params
        return (self.proposer is not None and not p.needs_token_history and p.min_tokens == 0
                and p.logprobs is None)

    def _drafts(self) -> dict[int, list[int]] | None:
        """seq_id -> proposed tokens for the running sequences that decode next step; none
        while more than disable_batch_size sequences run (the batch keeps the device busy)."""
        cfg = self.config.speculative
        running = self.scheduler.running
        if self.proposer is None or not running or len(running) > cfg.disable_batch_size:
            return None
        seqs = [seq for seq in running if seq.num_pending == 0 and self._speculates(seq)
                and seq.num_tokens - seq.num_computed_tokens == 1]
        return self._propose_batch(seqs, cfg.num_speculative_tokens) if seqs else {}

    def _propose_each(self, seqs: list[Sequence], k: int) -> dict[int, list[int]]:
        drafts = {}
        for seq in seqs:
            draft = self.proposer.propose(seq.token_ids, k)
            if draft:
                drafts[seq.seq_id] = draft
        return drafts

    def _release(self, seqs: list[Sequence]) -> None:
        """Per-sequence state outside the scheduler goes with the request: the runner's
        generators, the proposer's draft KV."""
        ids = [s.seq_id for s in seqs]
        self.runner.release(ids)
        if self._release_drafts is not None:
            self._release_drafts(ids)

    def _finish_step(self, sched, launched) -> list[RequestOutput]:
        """Collect a launched step's tokens; detokenize, check stops, build outputs."""
        model_out = self.runner.collect(launched)
        if model_out.hidden is not None:  # a proposer that drafts from hidden states (medusa)
            self.proposer.observe(model_out.hidden)
        # A sequence that ended (or was aborted) after this step was launched drops its token.
        live = [it.seq for it in sched.scheduled if it.samples and not it.seq.is_finished]
        for it in sched.scheduled:
            if it.draft and it.seq.seq_id in model_out.sampled:
                self.spec_stats["steps"] += 1
                self.spec_stats["proposed"] += len(it.draft)
                self.spec_stats["accepted"] += len(model_out.sampled[it.seq.seq_id]) - 1
        self.scheduler.resolve(sched, model_out.sampled)  # (cuts a verify step's tokens at a stop)
        now = time.monotonic()
        touched: dict[str, _Request] = {}
        failed: dict[str, str] = {}
        for seq in live:
            tokens = model_out.sampled.get(seq.seq_id)
            req = self.requests.get(seq.request_id)
            if tokens is None or req is None or req.request_id in failed:
                continue
            req.metrics.setdefault("first_token", now)
            tokens = tokens if isinstance(tokens, list) else [tokens]
            try:
                for i, token in enumerate(tokens):
                    final = i == len(tokens) - 1
                    stopped = self._detokenize(req, seq, token, model_out.logprobs.get(seq.seq_id), final)
                    if stopped and not final:  # a stop string ends a verify step's tokens here
                        del seq.token_ids[len(seq.token_ids) - (len(tokens) - 1 - i):]
                        seq.status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, req.detoks[seq.index].stop_reason
                        break
            except Exception as e:  # one request's bad state must not take the batch down
                failed[req.request_id] = f"{type(e).__name__}: {e}"
                continue
            touched[req.request_id] = req
        outputs = [self._fail(rid, msg) for rid, msg in failed.items()]
        for req in touched.values():
            if req.request_id in failed:
                continue
            if req.finished:
                req.metrics["finished"] = now
                del self.requests[req.request_id]
                self._release(req.seqs)
                outputs.append(self._output(req))
            elif req.stream:
                outputs.append(self._output(req))
        return outputs

    def _fail(self, request_id: str, message: str) -> RequestOutput:
        req = self.requests[request_id]
        self.abort_request(request_id)
        req.metrics["finished"] = time.monotonic()
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, [],
                             finished=True, metrics=dict(req.metrics), error=message)

    def _detokenize(self, req: _Request, seq: Sequence, token: int, lp, final: bool = True) -> bool:
        """Add one token's text; True if a stop string ended the sequence with it. `final`: the
        step's last token for this sequence (a verify step yields several)."""
        detok = req.detoks[seq.index]
        if req.logprobs is not None and lp is not None:
            req.logprobs[seq.index].append(Logprob(token, lp.logprob, lp.top))
        if final and self._ended_by_stop_token(seq, token):
            detok.finish()  # like vLLM: the EOS or stop token that ended it adds no text
            return False
        _, stopped = detok.step([token])
        if stopped and not seq.is_finished:
            seq.stop_reason = detok.stop_reason
            self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif final and seq.is_finished and not stopped:
            detok.finish()  # flush text held back for a stop string that never completed
        return stopped

    def _ended_by_stop_token(self, seq: Sequence, token: int) -> bool:
        if seq.status != SequenceStatus.FINISHED_STOPPED or seq.params.include_stop_str_in_output:
            return False
        return token == seq.stop_reason or (token in self.config.model.eos_token_ids
                                            and seq.stop_reason is None)

    def _output(self, req: _Request) -> RequestOutput:
        outs = []
        for i, (seq, detok) in enumerate(zip(req.seqs, req.detoks)):
            text = detok.output_text
            prev = req.emitted[i]
            delta_text = text[prev:]
            req.emitted[i] = len(text)
            tokens = seq.output_token_ids
            delta_ids = tokens[req.emitted_tokens[i]:]
            req.emitted_tokens[i] = len(tokens)
            outs.append(CompletionOutput(
                index=i, text=text, token_ids=tokens,
                finish_reason=seq.status.value if seq.is_finished else None,
                stop_reason=seq.stop_reason,
                logprobs=list(req.logprobs[i]) if req.logprobs is not None else None,
                delta_text=delta_text, delta_token_ids=delta_ids))
        cached = min(s.num_cached_tokens for s in req.seqs)
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs,
                             finished=req.finished, num_cached_tokens=cached, metrics=dict(req.metrics))

    # ---- stats ---------------------------------------------------------------------------
    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": bm.usage,
            "prefix_cache_queries": bm.prefix_queries,
            "prefix_cache_hits": bm.prefix_hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "spec_method": self.config.speculative.method,
            "spec_verify_steps": self.spec_stats["steps"],
            "spec_proposed_tokens": self.spec_stats["proposed"],
            "spec_accepted_tokens": self.spec_stats["accepted"],
        }
