"""How many 4096-token sequences one KV budget holds, per --kv-cache-dtype (issue 7, item 4).

    python3 benchmarks/gpu/kv_capacity.py MODEL_DIR TOKENIZER OUT.json KV_CACHE_DTYPE [BUDGET_GIB]

(one cache dtype per process: an engine's memory is not all handed back within one)

Builds the engine on the dummy checkpoint (bf16 weights) once per cache dtype with the same
--kv-cache-memory (default 64 GiB), and reads the block count the engine allocated: a 4096-token
sequence takes 4096 / block_size blocks.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.getcwd())

from nextok.bench.common import header  # noqa: E402
from nextok.llm import LLM  # noqa: E402

SEQ = 4096


def main() -> int:
    model, tok, out, kind = sys.argv[1:5]
    budget = int(float(sys.argv[5]) if len(sys.argv) > 5 else 64) << 30
    llm = LLM(model=model, tokenizer=tok, load_format="dummy", dtype="bfloat16", max_model_len=SEQ,
              kv_cache_memory=budget, max_num_seqs=4096, kv_cache_dtype=kind,
              enforce_eager=True)  # no CUDA graphs: the count does not depend on them
    eng = llm.engine
    blocks, bs = eng.block_manager.num_blocks, eng.config.cache.block_size
    per_block = eng.runner.kv_bytes_per_block()
    fits = blocks // (SEQ // bs)
    print(f"{kind:>5}: {per_block} bytes per block of {bs} tokens, {blocks} blocks, "
          f"{fits} sequences of {SEQ} tokens", flush=True)
    row = {"kv_cache_dtype": kind, "budget_bytes": budget, "bytes_per_block": per_block,
           "blocks": blocks, "block_size": bs, "sequences_of_4096": fits}
    with open(out, "w") as f:
        json.dump(header({"rows": [row]}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
