"""How close bf16 greedy decoding gets to float32, for transformers and for nextok, on CUDA.

    python3 benchmarks/gpu/fp32_reference_check.py MODEL.gguf OUT.json

bf16 logits are coarse (a step of 0.125-0.25 at the logit sizes of the default model), so two
correct bf16 implementations part ways at the first near-tie. The fair question is which of them
stays closer to exact arithmetic: both are compared with transformers in float32 on the same 20
prompts x 64 greedy tokens, by exact matches and by the mean length of the common prefix.
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

from benchmarks.gpu.real_model_check import NEW, hf_greedy  # noqa: E402
from nextok import LLM, SamplingParams  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from tests.prompts import PROMPTS  # noqa: E402


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    prefix = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), len(s)) for s, t in zip(a, b)]
    return {"exact": sum(p == len(s) for p, s in zip(prefix, a)),
            "mean_common_prefix": sum(prefix) / len(prefix)}


def main() -> int:
    from transformers import AutoModelForCausalLM

    path, out_path = sys.argv[1], sys.argv[2]
    llm = LLM(model=path, dtype="bfloat16", device="cuda", kv_cache_memory=4 << 30)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:20]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                  dtype=dtype).cuda().eval()
        runs[str(dtype)] = [hf_greedy(hf, ids)[0] for ids in prompts]
        del hf
    ref = runs["torch.float32"]
    result = {"prompts": len(prompts), "new_tokens": NEW,
              "nextok_bf16_vs_hf_fp32": agreement(ours, ref),
              "hf_bf16_vs_hf_fp32": agreement(runs["torch.bfloat16"], ref),
              "nextok_bf16_vs_hf_bf16": agreement(ours, runs["torch.bfloat16"])}
    print(json.dumps(result, indent=1))
    with open(out_path, "w") as f:
        json.dump(header(result), f, indent=1)  # with the commit, machine and command
    return 0


if __name__ == "__main__":
    sys.exit(main())
