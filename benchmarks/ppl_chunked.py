"""Perplexity with every window fed in chunks of a few tokens, so each step is decode-sized and
takes the GGUF block kernels (`nextok eval ppl` feeds a whole window per step: the dense layers).
Measures what --gguf-activations int8 costs in quality against float32 activations.

    PYTHONPATH=. .venv/bin/python benchmarks/ppl_chunked.py --chunk 8 > benchmarks/results/DATE-ppl-chunked.txt
"""
import argparse, math, time

import torch

from nextok import LLM, hub
from nextok.attention.base import AttentionMetadata, PrefillChunk
from nextok.eval import ppl

p = argparse.ArgumentParser()
p.add_argument("--chunk", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=4096)
args = p.parse_args()


@torch.inference_mode()
def chunked_nll(self, ids, w):
    """WindowScorer.nll, the window's tokens fed `args.chunk` at a time into the same blocks."""
    a, b = w.fed
    n, bs = b - a, self.block_size
    hidden = []
    for c0 in range(0, n, args.chunk):
        c1 = min(n, c0 + args.chunk)
        meta = AttentionMetadata(slot_mapping=self.slots[c0:c1], num_decode=0, decode_block_tables=None,
                                 decode_context_lens=None, decode_mask=None,
                                 prefills=[PrefillChunk(0, c1 - c0, c1, self.table[:-(-c1 // bs)])],
                                 sliding_window=self.sliding_window)
        hidden.append(self.model(ids[a + c0:a + c1], self.positions[c0:c1], self.kv_caches, meta))
    hidden = torch.cat(hidden)  # [n, hidden]
    logits = self.model.compute_logits(hidden[w.first_scored - 1 - a:]).float()
    targets = ids[w.first_scored:w.end]
    return -logits.log_softmax(-1).gather(1, targets[:, None])[:, 0]


ppl.WindowScorer.nll = chunked_nll
from nextok.bench import common  # noqa: E402
h = common.header()
print(common.machine_line(h["machine"]), "| commit", h["commit"], "| benchmarks/ppl_chunked.py", vars(args))
print("loadavg before:", open("/proc/loadavg").read().strip())
for label, kw in (("dense float32 (--no-gguf-blocks)", dict(gguf_blocks=False)),
                  ("blocks, float32 activations", dict(gguf_activations="float32")),
                  ("blocks, int8 activations", dict(gguf_activations="int8"))):
    llm = LLM(model=hub.resolve_model(None), dtype="float32", kv_cache_memory=256 << 20, **kw)
    t = time.perf_counter()
    r = ppl.evaluate(llm, "code", 256, 128, args.max_tokens)
    print(f"{label:<34} ppl {r['ppl']:.4f}  nll {r['nll_mean']:.5f}  tokens {r['tokens_scored']}  "
          f"{time.perf_counter() - t:.0f} s")
    del llm
print("loadavg after:", open("/proc/loadavg").read().strip())
