"""Logits of the sampling rows -> one token per row, each row with its own parameters.

    logits [S, V] -> logprobs of the raw logits (if asked)
                  -> logit_bias, suppressed ids, repetition / frequency / presence penalties
                  -> greedy rows: argmax
                  -> other rows: temperature, top-k, top-p, min-p, then an exponential race

The race draws q ~ Exp(1) per vocabulary entry and takes argmax(p / q), which picks token i with
probability p_i (the Gumbel-max trick in another form) with no cumulative sum and no host sync.
A row with a seed draws its noise from its own generator, exactly one [V] draw per step, so its
output depends on its seed and its own logits only, never on what else is in the batch.

SamplingMetadata is built once per step from plain Python lists; each processing stage runs only
when some row needs it, so an all-greedy batch costs one argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nextok.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    sampled: torch.Tensor  # [S] long
    logprobs: torch.Tensor | None = None  # [S] float: log-probability of the sampled token
    top_ids: torch.Tensor | None = None  # [S, K] long: the K most likely tokens, best first
    top_logprobs: torch.Tensor | None = None  # [S, K] float


@dataclass
class SamplingMetadata:
    # On a GPU, every tensor here arrives by an asynchronous copy from pinned memory: building
    # the metadata never waits for the device (async scheduling relies on that).
    temperature: torch.Tensor | None  # [S] float, 1.0 on greedy rows; None when all greedy
    greedy: torch.Tensor | None  # [S] bool; None when all greedy
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None  # [S] long, V where off
    top_p: torch.Tensor | None  # [S] float, 1.0 where off
    min_p: torch.Tensor | None  # [S] float, 0.0 where off
    repetition_penalty: torch.Tensor | None  # [S, 1] float
    seen_mask: torch.Tensor | None  # [S, V] bool: token appears in the prompt or the output
    frequency_penalty: torch.Tensor | None  # [S, 1] float
    presence_penalty: torch.Tensor | None  # [S, 1] float
    output_counts: torch.Tensor | None  # [S, V] float: occurrences in the output so far
    bias_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, token ids)
    bias_values: torch.Tensor | None  # [nnz] float
    suppress_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, token ids) set to -inf
    generators: list[torch.Generator | None]
    max_logprobs: int | None  # top alternatives to return; None: no logprobs at all

    @classmethod
    def build(cls, params: list[SamplingParams], prompt_token_ids: list[list[int]] | None,
              output_token_ids: list[list[int]] | None, generators: list[torch.Generator | None],
              suppress_token_ids: list[list[int]], vocab_size: int,
              device: torch.device | str) -> "SamplingMetadata":
        """prompt/output_token_ids may be None when no row has a penalty (they are unused)."""
        s = len(params)
        greedy = [p.greedy for p in params]
        f32 = dict(dtype=torch.float32, device=device)

        def column(values, default, **kw):
            # One value per row, or None when every row has the default (the stage is skipped).
            if all(v == default for v in values):
                return None
            return _tensor(values, **kw)

        randoms = [p for p, g in zip(params, greedy) if not g]
        top_k = column([min(p.top_k, vocab_size) if p.top_k > 0 and not g else vocab_size
                        for p, g in zip(params, greedy)], vocab_size, dtype=torch.long, device=device)
        top_p = column([1.0 if g else p.top_p for p, g in zip(params, greedy)], 1.0, **f32)
        min_p = column([0.0 if g else p.min_p for p, g in zip(params, greedy)], 0.0, **f32)

        rep = [p.repetition_penalty for p in params]
        repetition = seen = None
        if any(r != 1.0 for r in rep):
            repetition = _tensor(rep, **f32).unsqueeze(1)
            seen = _token_mask(s, vocab_size, [a + b for a, b in zip(prompt_token_ids, output_token_ids)],
                               device)
        freq = [p.frequency_penalty for p in params]
        pres = [p.presence_penalty for p in params]
        frequency = presence = counts = None
        if any(freq) or any(pres):
            frequency = _tensor(freq, **f32).unsqueeze(1)
            presence = _tensor(pres, **f32).unsqueeze(1)
            counts = _token_counts(s, vocab_size, output_token_ids, device)

        bias_rows, bias_ids, bias_vals = [], [], []
        for row, p in enumerate(params):
            for tid, b in (p.logit_bias or {}).items():
                if 0 <= tid < vocab_size:  # ids outside the vocabulary are rejected upstream
                    bias_rows.append(row)
                    bias_ids.append(tid)
                    bias_vals.append(b)
        bias_index = bias_values = None
        if bias_rows:
            bias_index = (_tensor(bias_rows, device=device), _tensor(bias_ids, device=device))
            bias_values = _tensor(bias_vals, **f32)

        sup_rows = [row for row, ids in enumerate(suppress_token_ids) for _ in ids]
        sup_ids = [t for ids in suppress_token_ids for t in ids]
        suppress = None
        if sup_rows:
            suppress = (_tensor(sup_rows, device=device), _tensor(sup_ids, device=device))

        lp = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            temperature=_tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], **f32)
            if randoms else None,
            greedy=_tensor(greedy, dtype=torch.bool, device=device) if randoms else None,
            all_greedy=not randoms, all_random=len(randoms) == s,
            top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition, seen_mask=seen,
            frequency_penalty=frequency, presence_penalty=presence, output_counts=counts,
            bias_index=bias_index, bias_values=bias_values, suppress_index=suppress,
            generators=list(generators), max_logprobs=max(lp) if lp else None)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [S, V] -> [S] int64, the first maximum of each row (torch's argmax). On the CPU
    through numpy, whose argmax is vectorized: a 49k vocabulary row takes ~3 us there against
    ~60 us in torch's, which every greedy step and each row of a verify step pays."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def _tensor(values: list, dtype=torch.long, device="cpu") -> torch.Tensor:
    """torch.tensor(values) on `device`; to a GPU by an asynchronous copy from pinned memory
    (a pageable copy would first wait for all queued GPU work)."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def _token_mask(rows: int, vocab: int, ids: list[list[int]], device) -> torch.Tensor:
    mask = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
    r = [i for i, row in enumerate(ids) for _ in row]
    if r:
        mask[_tensor(r, device=device), _tensor([t for row in ids for t in row], device=device)] = True
    return mask


def _token_counts(rows: int, vocab: int, ids: list[list[int]], device) -> torch.Tensor:
    counts = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
    flat = [i * vocab + t for i, row in enumerate(ids) for t in row]
    if flat:
        idx = _tensor(flat, device=device)
        counts.view(-1).index_add_(0, idx, torch.ones(len(flat), dtype=torch.float32, device=device))
    return counts


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()  # [S, V]; float32 whatever the model dtype
        raw_logprobs = torch.log_softmax(logits, dim=-1) if meta.max_logprobs is not None else None
        logits = self.apply_penalties(logits, meta)
        if meta.all_greedy:
            sampled = argmax_rows(logits)
        else:
            sampled = self.sample(logits, meta)
        out = SamplerOutput(sampled=sampled)
        if raw_logprobs is not None:
            out.logprobs = raw_logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)
            if meta.max_logprobs > 0:
                out.top_logprobs, out.top_ids = raw_logprobs.topk(meta.max_logprobs, dim=-1)
        return out

    @staticmethod
    def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Biases, suppression and penalties; the order follows vLLM so outputs are comparable."""
        if meta.bias_index is not None:
            logits = logits.index_put(meta.bias_index, meta.bias_values, accumulate=True)
        if meta.suppress_index is not None:
            logits = logits.index_put(meta.suppress_index,
                                      logits.new_full((), float("-inf")))
        if meta.repetition_penalty is not None:
            # CTRL-style: shrink a seen token's logit toward "less likely" whatever its sign.
            pen = meta.repetition_penalty
            penalised = torch.where(logits > 0, logits / pen, logits * pen)
            logits = torch.where(meta.seen_mask, penalised, logits)
        if meta.output_counts is not None:
            counts = meta.output_counts
            logits = logits - meta.frequency_penalty * counts - meta.presence_penalty * (counts > 0)
        return logits

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy_tokens = None if meta.all_random else argmax_rows(logits)
        logits = logits / meta.temperature.unsqueeze(1)
        logits = self.truncate(logits, meta)
        probs = torch.softmax(logits, dim=-1)  # [S, V]
        q = self.exponential_noise(probs, meta.generators)
        sampled = (probs / q).argmax(dim=-1)
        if greedy_tokens is not None:
            sampled = torch.where(meta.greedy, greedy_tokens, sampled)
        return sampled

    @staticmethod
    def truncate(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """top-k, top-p (nucleus) and min-p: masked entries become -inf."""
        neg_inf = float("-inf")
        if meta.top_p is not None:
            # One descending sort serves both top-k and top-p.
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            vocab = logits.shape[-1]
            if meta.top_k is not None:
                ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
                sorted_logits = sorted_logits.masked_fill(ranks >= meta.top_k.unsqueeze(1), neg_inf)
            probs = sorted_logits.softmax(dim=-1)
            # Keep a token while the mass strictly before it is < top_p; the first always stays.
            mass_before = probs.cumsum(dim=-1) - probs
            sorted_logits = sorted_logits.masked_fill(mass_before >= meta.top_p.unsqueeze(1), neg_inf)
            logits = torch.full_like(logits, neg_inf).scatter(1, order, sorted_logits)
        elif meta.top_k is not None:
            k_max = int(meta.top_k.max())
            top_vals = logits.topk(k_max, dim=-1).values  # [S, k_max], descending
            kth = top_vals.gather(1, (meta.top_k.clamp(max=k_max) - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, neg_inf)
        if meta.min_p is not None:
            probs = logits.softmax(dim=-1)
            threshold = meta.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, neg_inf)
        return logits

    @staticmethod
    def exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
        q = torch.empty_like(probs)
        seeded = [i for i, g in enumerate(generators) if g is not None]
        if len(seeded) < len(generators):
            q.exponential_()  # unseeded rows share one draw from the global generator
        for i in seeded:
            q[i].exponential_(generator=generators[i])
        return q.clamp_(min=1e-30)  # a zero draw would turn p / q into inf
