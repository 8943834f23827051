"""Issue 6, item 2, on the GPU: the real default model (the GGUF) in bf16 with the triton backend
against transformers bf16 on CUDA, and the triton backend against the torch reference backend
on the same KV state.

    python3 benchmarks/gpu/real_model_check.py MODEL.gguf OUT.json

1. Greedy, 20 prompts x 64 tokens, nextok (triton backend, CUDA graphs) vs transformers' own
   greedy loop: how many match exactly; for each mismatch, the step and transformers' top-2
   logit gap there (bf16 logits are coarse: a near-tie flips on summation order).
2. Logits of one prefill (all positions) and of one decode step computed through the same model
   weights and the same paged KV pool, once with TritonBackend and once with TorchRefBackend.
   The triton backend's fresh prefill goes to torch SDPA; the same prefill is also run as two
   chunks, the second over the first's cached prefix (the Triton paged prefill kernel).
3. Async scheduling (the CUDA default) against an engine with it off: the same greedy tokens on
   the 20 prompts, batched and one at a time, and the same outputs for a batch of mixed
   sampling parameters (seeds, stop strings, n > 1, logprobs, penalties).
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

from nextok import LLM, SamplingParams  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.attention.base import AttentionMetadata, PrefillChunk  # noqa: E402
from nextok.attention.torch_ref import TorchRefBackend, decode_mask  # noqa: E402
from tests.prompts import PROMPTS  # noqa: E402

NEW = 64


def hf_greedy(model, ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    tokens, seen = [], []
    with torch.inference_mode():
        out = model(torch.tensor([ids], device="cuda"), use_cache=True)
        for _ in range(NEW):
            logits = out.logits[0, -1].float()
            tok = int(logits.argmax())
            tokens.append(tok)
            seen.append(logits)
            out = model(torch.tensor([[tok]], device="cuda"), past_key_values=out.past_key_values,
                        use_cache=True)
    return tokens, seen


def backend_logits(llm, ids: list[int]) -> dict:
    """Prefill ids[:-1] then decode ids[-1], each through both backends on the same pool."""
    runner = llm.engine.runner
    model, bs = runner.model, runner.block_size
    n = len(ids)
    table = torch.arange(1, -(-n // bs) + 1, device="cuda")  # scratch blocks of an idle engine
    slots = torch.tensor([int(table[p // bs]) * bs + p % bs for p in range(n)], device="cuda")
    pre = AttentionMetadata(slot_mapping=slots[:n - 1], num_decode=0, decode_block_tables=None,
                            decode_context_lens=None, decode_mask=None,
                            prefills=[PrefillChunk(0, n - 1, n - 1, table)])
    lens = torch.tensor([n], device="cuda")
    dec = AttentionMetadata(slot_mapping=slots[n - 1:], num_decode=1,
                            decode_block_tables=table[None], decode_context_lens=lens,
                            decode_mask=decode_mask(lens, table.numel() * bs, None), prefills=[])
    k = (n - 1) // 2  # the chunked variant: [0, k) fresh, then [k, n - 1) over its cache
    first = AttentionMetadata(slot_mapping=slots[:k], num_decode=0, decode_block_tables=None,
                              decode_context_lens=None, decode_mask=None,
                              prefills=[PrefillChunk(0, k, k, table)])
    second = AttentionMetadata(slot_mapping=slots[k:n - 1], num_decode=0, decode_block_tables=None,
                               decode_context_lens=None, decode_mask=None,
                               prefills=[PrefillChunk(0, n - 1 - k, n - 1, table)])
    triton_backend, out = model.backend, {}
    with torch.inference_mode():
        for name, backend in (("triton", triton_backend), ("torch", TorchRefBackend())):
            model.backend = backend
            h = model(torch.tensor(ids[:-1], device="cuda"), torch.arange(n - 1, device="cuda"),
                      runner.kv_caches, pre)
            p_logits = model.compute_logits(h).float()
            h = model(torch.tensor(ids[-1:], device="cuda"), torch.tensor([n - 1], device="cuda"),
                      runner.kv_caches, dec)
            out[name] = (p_logits, model.compute_logits(h).float())
        model.backend = triton_backend
        model(torch.tensor(ids[:k], device="cuda"), torch.arange(k, device="cuda"), runner.kv_caches, first)
        h = model(torch.tensor(ids[k:-1], device="cuda"), torch.arange(k, n - 1, device="cuda"),
                  runner.kv_caches, second)
        chunked = model.compute_logits(h).float()
    (tp, td), (rp, rd) = out["triton"], out["torch"]
    return {"prefill_max_abs_diff": (tp - rp).abs().max().item(),
            "decode_max_abs_diff": (td - rd).abs().max().item(),
            "chunked_prefill_max_abs_diff": (chunked - rp[k:]).abs().max().item(),
            "logit_abs_max": rp.abs().max().item(),
            "prefill_argmax_agree": float((tp.argmax(-1) == rp.argmax(-1)).float().mean()),
            "chunked_prefill_argmax_agree": float((chunked.argmax(-1) == rp[k:].argmax(-1)).float().mean()),
            "decode_argmax_agree": bool(td.argmax() == rd.argmax())}


def async_vs_sync(llm, path: str, prompts: list[list[int]]) -> dict:
    """The engine as it runs on CUDA (async scheduling on) against one with it off."""
    sync = LLM(model=path, dtype="bfloat16", device="cuda", attention_backend="triton",
               kv_cache_memory=4 << 30, async_scheduling="off")
    assert llm.engine.config.async_scheduling and not sync.engine.config.async_scheduling
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    mixed = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=32, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=48, stop=["\n\n", "return"]),
             SamplingParams(temperature=0.9, seed=3, n=2, max_tokens=20, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=24, logprobs=3),
             SamplingParams(temperature=0.0, max_tokens=1),
             SamplingParams(temperature=0.0, max_tokens=40, min_tokens=8),
             SamplingParams(temperature=0.7, top_k=40, seed=11, max_tokens=16, repetition_penalty=1.3)]

    def summary(outs):
        return [[(o.token_ids, o.text, o.finish_reason,
                  [lp.token_id for lp in o.logprobs] if o.logprobs else None) for o in r.outputs]
                for r in outs]

    res = {}
    engines = (llm, sync)
    for name, run in (("batched", lambda e: e.generate(prompts, greedy)),
                      ("one_at_a_time", lambda e: [e.generate([p], greedy)[0] for p in prompts[:8]]),
                      ("mixed", lambda e: e.generate(prompts[:len(mixed)], mixed))):
        for e in engines:  # both compute every prompt in full (llm saw them in part 1)
            e.engine.block_manager.reset_prefix_cache()
        a, b = summary(run(llm)), summary(run(sync))
        res[f"{name}_equal"] = sum(x == y for x, y in zip(a, b))
        res[f"{name}_total"] = len(a)
    return res


def main() -> int:
    from transformers import AutoModelForCausalLM

    path, out_path = sys.argv[1], sys.argv[2]
    llm = LLM(model=path, dtype="bfloat16", device="cuda", attention_backend="triton",
              kv_cache_memory=4 << 30)
    tok = llm.get_tokenizer()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.bfloat16).cuda().eval()
    prompts = [tok.encode(p) for p in PROMPTS[:20]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    result = {"graphs": llm.engine.runner.graphs is not None, "prompts": []}
    for mode in ("one_at_a_time", "batched"):
        outs = ([llm.generate([p], params)[0] for p in prompts] if mode == "one_at_a_time"
                else llm.generate(prompts, params))
        exact, agree = 0, []
        for text, ids, o in zip(PROMPTS, prompts, outs):
            ours = o.outputs[0].token_ids
            ref, logits = hf_greedy(hf, ids)
            if ours == ref:
                exact += 1
                agree.append(NEW)
                continue
            step = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
            agree.append(step)
            top2 = logits[step].topk(2).values
            result["prompts"].append({"mode": mode, "prompt": text, "step": step,
                                      "top2_gap": (top2[0] - top2[1]).item()})
        result[f"exact_{mode}"] = exact
        # The same runs cut at fewer tokens: how many agree on their first 16 and 32.
        result[f"exact_{mode}_by_length"] = {n: sum(a >= n for a in agree) for n in (16, 32, NEW)}
        result[f"mean_common_prefix_{mode}"] = sum(agree) / len(agree)
    result["backends"] = [backend_logits(llm, p) for p in prompts[:4]]
    result["async_vs_sync"] = async_vs_sync(llm, path, prompts)
    print(json.dumps(result, indent=1))
    with open(out_path, "w") as f:
        json.dump(header(result), f, indent=1)  # with the commit, machine and command
    return 0


if __name__ == "__main__":
    sys.exit(main())
