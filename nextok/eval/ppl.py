"""`nextok eval ppl`: perplexity of the engine's own model on held-out real code.

The number every quantization method is judged by (issue 7): exp of the mean negative
log-likelihood (natural log) per scored token. The forward is the engine's model itself
(`llm.engine.runner.model`), so whatever layers quantization swaps in are what get measured;
it runs one window at a time on scratch blocks 1.. of the idle engine's paged KV pool, through
the same attention backend as serving. Log-probabilities are taken in float32 whatever the dtype.

Data (`--dataset code`): the EVAL split of the running interpreter's standard library
(`nextok.bench.datasets.stdlib_split`, ~1 file in 10, disjoint from the calibration split),
files in order of their relative path, each tokenized on its own as
`tokenizer.encode(text, add_special_tokens=False)` (no BOS: the same ids for every method) and
scored on its own with sliding windows (`nextok.eval.windows`). `--max-tokens` keeps the first
N scored tokens of that order, so a small run scores a prefix of a large one.
"""
from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass

import torch

from nextok.attention.base import AttentionMetadata, PrefillChunk
from nextok.eval.windows import Window, cap_documents, check_settings, plan_windows

DATASETS = ("code",)


def add_parser(sub, add_engine_args) -> None:
    ev = sub.add_parser("eval", help="model quality: perplexity on held-out code")
    ev_sub = ev.add_subparsers(dest="eval_command", metavar="EVAL")
    p = ev_sub.add_parser("ppl", help="perplexity of the model on held-out real code")
    p.add_argument("--dataset", default="code",
                   help="code: the held-out eval split of this Python's standard library")
    p.add_argument("--context", type=int, default=512, help="tokens per window")
    p.add_argument("--stride", type=int, default=256,
                   help="tokens between window starts (< context): later windows score their last stride")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="score at most this many tokens, files in order (default: the whole split)")
    p.add_argument("--output", default=None, help="write results JSON here")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from nextok import LLM
    from nextok.bench.common import header, write_json
    from nextok.cli import engine_kwargs

    check_settings(args.context, args.stride, args.max_tokens)
    check_dataset(args.dataset)  # both before the model loads: bad input fails at once
    llm = LLM(**engine_kwargs(args))
    result = header({"benchmark": "eval_ppl",
                     **evaluate(llm, args.dataset, args.context, args.stride, args.max_tokens)})
    _print(result)
    if args.output:
        write_json(args.output, result)
    return 0


def check_dataset(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} for eval ppl ({' | '.join(DATASETS)})")


def load_documents(dataset: str, tokenizer, max_tokens: int | None) -> list[tuple[str, list[int]]]:
    """(path relative to the stdlib root, token ids) per eval file, capped at max_tokens scored."""
    from nextok.bench import datasets

    check_dataset(dataset)
    root = datasets.stdlib_root()

    def read():
        for path in datasets.stdlib_split()[datasets.EVAL_SPLIT]:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            yield os.path.relpath(path, root), tokenizer.encode(text, add_special_tokens=False)

    return list(cap_documents(read(), max_tokens))


def check_fits(context: int, block_size: int, num_blocks: int, max_model_len: int) -> int:
    """Blocks one window's forward (context - 1 tokens) takes; ValueError if the model's
    positions or the KV pool (block 0 reserved) cannot hold it."""
    fed = context - 1
    if fed > max_model_len:
        raise ValueError(f"--context {context} feeds {fed} tokens per window, beyond the engine's "
                         f"context of {max_model_len} (--max-model-len, the model's maximum)")
    need = -(-fed // block_size)
    if need > num_blocks - 1:
        raise ValueError(f"--context {context} needs {need} KV blocks of {block_size} tokens, the "
                         f"pool has {num_blocks - 1}: raise --kv-cache-memory (or --num-kv-blocks)")
    return need


class WindowScorer:
    """Forwards windows through the engine's model on scratch blocks 1.. of its idle KV pool
    (free whenever no request runs; their prefix-cache entries are dropped first, since their
    contents get overwritten): one at a time, or several of one length as one step's prefills."""

    MAX_BATCH_TOKENS = 2048  # hidden_many's windows per forward: their logits fit in memory

    def __init__(self, llm, context: int):
        engine = llm.engine
        runner, bm = engine.runner, engine.block_manager
        if engine.requests or bm.num_free_blocks != bm.num_blocks - 1:
            raise RuntimeError("eval ppl needs an idle engine (requests are running)")
        nblocks = check_fits(context, runner.block_size, bm.num_blocks,
                             engine.config.scheduler.max_model_len)
        bm.reset_prefix_cache()
        self.model, self.kv_caches, self.device = runner.model, runner.kv_caches, runner.device
        self.block_size = runner.block_size
        self.sliding_window = engine.config.model.sliding_window
        # window i of a batch on blocks 1 + i * nblocks ..: as many as the pool holds
        self.max_windows = max(1, (bm.num_blocks - 1) // nblocks)
        self.tables = torch.arange(1, self.max_windows * nblocks + 1,
                                   device=self.device).view(self.max_windows, nblocks)
        self.table = self.tables[0]  # [nblocks]
        offsets = torch.arange(self.block_size, device=self.device)
        # [max_windows, nblocks * bs]: the pool slot of each window's positions
        self.window_slots = (self.tables[:, :, None] * self.block_size + offsets).flatten(1)
        self.slots = self.window_slots[0]
        self.positions = torch.arange(nblocks * self.block_size, device=self.device)

    @torch.inference_mode()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [n] (at most context - 1 tokens, on the device), positions 0.. -> the final
        hidden states [n, hidden] (after the model's last norm)."""
        n = ids.shape[0]
        table = self.table[:-(-n // self.block_size)]
        meta = AttentionMetadata(slot_mapping=self.slots[:n], num_decode=0, decode_block_tables=None,
                                 decode_context_lens=None, decode_mask=None,
                                 prefills=[PrefillChunk(0, n, n, table)],
                                 sliding_window=self.sliding_window)
        return self.model(ids, self.positions[:n], self.kv_caches, meta)

    def batch_size(self, n: int) -> int:
        """Windows of n tokens hidden_many takes at once."""
        return max(1, min(self.max_windows, self.MAX_BATCH_TOKENS // max(n, 1)))

    @torch.inference_mode()
    def hidden_many(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, n] (B <= batch_size(n), on the device), each row a window at positions 0..
        -> final hidden states [B, n, hidden]: one forward with B prefills instead of B
        forwards (on the GPU a 256-token window alone is a launch-bound step)."""
        b, n = ids.shape
        if b > self.max_windows:
            raise ValueError(f"{b} windows at once, the KV pool holds {self.max_windows}")
        nb = -(-n // self.block_size)
        chunks = [PrefillChunk(i * n, n, n, self.tables[i, :nb]) for i in range(b)]
        meta = AttentionMetadata(slot_mapping=self.window_slots[:b, :n].reshape(-1), num_decode=0,
                                 decode_block_tables=None, decode_context_lens=None, decode_mask=None,
                                 prefills=chunks, sliding_window=self.sliding_window)
        hidden = self.model(ids.reshape(-1), self.positions[:n].repeat(b), self.kv_caches, meta)
        return hidden.view(b, n, -1)

    @torch.inference_mode()
    def nll(self, ids: torch.Tensor, w: Window) -> torch.Tensor:
        """ids: [L] the document on the device -> [end - first_scored] float32 NLLs of w's scored tokens."""
        a, b = w.fed
        hidden = self.hidden(ids[a:b])  # [b - a, hidden]
        logits = self.model.compute_logits(hidden[w.first_scored - 1 - a:]).float()  # [k, vocab]
        targets = ids[w.first_scored:w.end]  # [k]
        return -logits.log_softmax(-1).gather(1, targets[:, None])[:, 0]


@dataclass
class Scores:
    per_file: list[dict]  # {"file", "tokens", "nll_sum"}, in order
    windows: int
    tokens_fed: int

    @property
    def tokens(self) -> int:
        return sum(f["tokens"] for f in self.per_file)

    @property
    def nll_mean(self) -> float:
        return sum(f["nll_sum"] for f in self.per_file) / self.tokens


@torch.inference_mode()
def score(scorer: WindowScorer, docs: list[tuple[str, list[int]]], context: int, stride: int) -> Scores:
    """NLL sums per document, kept on the device (one host sync at the end)."""
    sums, windows, fed = [], 0, 0
    for _, ids in docs:
        t = torch.tensor(ids, dtype=torch.long, device=scorer.device)
        total = torch.zeros((), dtype=torch.float64, device=scorer.device)
        for w in plan_windows(len(ids), context, stride):
            total += scorer.nll(t, w).double().sum()
            windows, fed = windows + 1, fed + w.end - 1 - w.start
        sums.append(total)
    values = torch.stack(sums).tolist() if sums else []
    per_file = [{"file": name, "tokens": len(ids) - 1, "nll_sum": v} for (name, ids), v in zip(docs, values)]
    return Scores(per_file, windows, fed)


def evaluate(llm, dataset: str, context: int, stride: int, max_tokens: int | None) -> dict:
    """Perplexity of llm's model on the dataset's eval split: the result's fields."""
    from nextok.bench.common import Meter
    from nextok.bench.latency import weight_bytes

    check_settings(context, stride, max_tokens)
    scorer = WindowScorer(llm, context)
    t = time.perf_counter()
    docs = load_documents(dataset, llm.get_tokenizer(), max_tokens)
    tokenize_s = time.perf_counter() - t
    if not docs:
        raise ValueError(f"dataset {dataset!r} has no document of 2 or more tokens")
    if scorer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with Meter() as meter:
        s = score(scorer, docs, context, stride)
        if scorer.device.type == "cuda":
            torch.cuda.synchronize()
    cfg = llm.engine.config
    out = {"model": cfg.model_path, "dtype": cfg.dtype, "device": cfg.device,
           "quantization": getattr(cfg, "quantization", None),
           "weight_bytes": weight_bytes(scorer.model, decode=False),
           "dataset": dataset, "split": "eval", "python_version": platform.python_version(),
           "files": len(docs), "tokens_scored": s.tokens, "windows": s.windows,
           "tokens_fed": s.tokens_fed, "context": context, "stride": stride, "max_tokens": max_tokens,
           "nll_mean": s.nll_mean, "ppl": math.exp(s.nll_mean),
           "seconds": meter.seconds, "tokens_per_s": s.tokens / meter.seconds,
           "tokenize_seconds": tokenize_s, "peak_rss_mib": meter.peak_rss / 2**20,
           "other_processes_cpu_seconds": meter.other_cpu_seconds, "per_file": s.per_file}
    if scorer.device.type == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _print(r: dict) -> None:
    quant = r["quantization"] or "none"
    rows = [("data", f"{r['dataset']} ({r['split']} split of the Python {r['python_version']} stdlib): "
                     f"{r['files']} files, {r['tokens_scored']} tokens scored"),
            ("model", f"{os.path.basename(r['model'])}, {r['dtype']} on {r['device']}, quantization {quant}"),
            ("windows", f"{r['windows']} of context {r['context']}, stride {r['stride']}"),
            ("perplexity", f"{r['ppl']:.4f}"),
            ("nll / token", f"{r['nll_mean']:.5f} nats"),
            ("speed", f"{r['tokens_per_s']:.0f} scored tokens/s ({r['seconds']:.2f} s)"),
            ("memory", f"weights {r['weight_bytes'] / 2**20:.1f} MiB, peak RSS {r['peak_rss_mib']:.0f} MiB"
                       + (f", peak GPU {r['peak_gpu_mib']:.0f} MiB" if "peak_gpu_mib" in r else ""))]
    for name, value in rows:
        print(f"{name:>12}  {value}")
