"""`nextok bench throughput`: offline throughput, side by side with transformers in one process.

Per round (rounds interleave the engines: nextok, transformers, nextok, transformers, ...):
- nextok: all prompts submitted at once, continuous batching, until every request finishes;
- nextok batch 1: one request; decode tokens/s = (output_len - 1) / (finish - first token);
- transformers `generate()`, one request at a time (on `--baseline-prompts` of the prompts:
  a rate, so a subset measures it) and padded batches of each `--baseline-batch-sizes`;
- transformers batch-1 decode rate: (output_len - 1) / (t(output_len) - t(1 token)).
Greedy, EOS ignored, so every request yields exactly `--output-len` tokens in both engines.
"""
from __future__ import annotations

import statistics

from nextok.bench import datasets
from nextok.bench.common import Meter, header, memory_report, write_json


def add_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("throughput", help="offline throughput (optionally vs transformers)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dataset", default="random", choices=["random", "code"])
    p.add_argument("--baseline", default="none", choices=["none", "transformers"])
    p.add_argument("--baseline-batch-sizes", default="8,16,32,64")
    p.add_argument("--baseline-prompts", type=int, default=4,
                   help="prompts for the one-at-a-time baseline (it is a rate)")
    p.add_argument("--baseline-padded-prompts", type=int, default=None,
                   help="prompts for each padded-batch baseline run (default: all; equal-length "
                        "prompts make every batch alike, so a whole number of batches gives the rate)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds")
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--output", default=None, help="write results JSON here")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from nextok import LLM, SamplingParams
    from nextok.cli import engine_kwargs

    if args.num_prompts < 1 or args.input_len < 1 or args.output_len < 2:
        raise ValueError("--num-prompts, --input-len must be >= 1 and --output-len >= 2")
    llm = LLM(**engine_kwargs(args))
    eng = llm.engine
    prompts = datasets.build(args.dataset, llm.get_tokenizer(), args.num_prompts, args.input_len,
                             args.dataset_seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    hf = load_hf(eng.config) if args.baseline == "transformers" else None
    sizes = [int(b) for b in args.baseline_batch_sizes.split(",") if b.strip()]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    if hf is not None:
        _hf_generate(hf, prompts[:1], 4)
    rounds = []
    for r in range(args.repeats):
        print(f"round {r + 1}/{args.repeats}", flush=True)
        rnd = {"nextok": _nextok_batch(llm, prompts, params),
               "nextok_batch1": _nextok_single(llm, prompts[0], params)}
        if hf is not None:
            rnd["transformers_one_at_a_time"] = _hf_batches(hf, prompts[:args.baseline_prompts], 1,
                                                            args.output_len)
            rnd["transformers_batch1_decode"] = _hf_decode_rate(hf, prompts[0], args.output_len)
            padded = prompts[:args.baseline_padded_prompts] if args.baseline_padded_prompts else prompts
            rnd["transformers_padded"] = {
                str(b): _hf_batches(hf, padded, b, args.output_len) for b in sizes}
        rounds.append(rnd)
    result = header({"benchmark": "throughput", "device": eng.config.device,
                     "dtype": eng.config.dtype, "model": eng.config.model_path,
                     "dataset": args.dataset, "num_prompts": args.num_prompts,
                     "input_len": args.input_len, "output_len": args.output_len,
                     "engine_stats": eng.stats(), "memory": memory_report(eng), "rounds": rounds,
                     "summary": _summary(rounds)})
    _print(result)
    if args.output:
        write_json(args.output, result)
    return 0


def _nextok_batch(llm, prompts, params) -> dict:
    with Meter() as m:
        outs = llm.generate(prompts, params, use_tqdm=True)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    n_in = sum(len(p) for p in prompts)
    return {**m.summary(), "requests_per_s": len(prompts) / m.seconds,
            "input_tokens_per_s": n_in / m.seconds, "output_tokens_per_s": n_out / m.seconds}


def _nextok_single(llm, prompt, params) -> dict:
    with Meter() as m:
        out = llm.generate([prompt], params)[0]
    t = out.metrics
    decode_s = t["finished"] - t["first_token"]
    n = len(out.outputs[0].token_ids)
    return {**m.summary(), "ttft_s": t["first_token"] - t["arrival"],
            "decode_tokens_per_s": (n - 1) / decode_s}


# ---- transformers baseline --------------------------------------------------------------------
def load_hf(config):
    """transformers' model of the engine's checkpoint (dummy: random weights, same shapes)."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, config.dtype)
    path = config.model_path
    if config.load_format == "dummy":  # random weights of the same shapes, as nextok's
        from transformers import AutoConfig

        directory = os.path.dirname(path) if os.path.isfile(path) else path
        with torch.device(config.device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=dtype)
        return model.eval()
    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                     gguf_file=os.path.basename(path), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(config.device).eval()


def _hf_generate(model, prompts: list[list[int]], new_tokens: int) -> float:
    import time

    import torch

    ids = torch.tensor(prompts, device=model.device)  # equal lengths: padding is a no-op mask
    eos = model.config.eos_token_id
    pad = (eos[0] if isinstance(eos, list) else eos) or 0  # Llama 3 lists several EOS ids
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=pad)
        dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new_tokens
    return dt


def _hf_batches(model, prompts, batch: int, new_tokens: int) -> dict:
    with Meter() as m:
        for i in range(0, len(prompts), batch):
            _hf_generate(model, prompts[i:i + batch], new_tokens)
    n_out = len(prompts) * new_tokens
    return {**m.summary(), "batch_size": batch, "num_prompts": len(prompts),
            "output_tokens_per_s": n_out / m.seconds,
            "input_tokens_per_s": len(prompts) * len(prompts[0]) / m.seconds}


def _hf_decode_rate(model, prompt, new_tokens: int) -> dict:
    t1 = _hf_generate(model, [prompt], 1)
    tn = _hf_generate(model, [prompt], new_tokens)
    return {"ttft_s": t1, "decode_tokens_per_s": (new_tokens - 1) / max(tn - t1, 1e-9)}


# ---- report ---------------------------------------------------------------------------------
def _summary(rounds: list[dict]) -> dict:
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    s = {"nextok_output_tokens_per_s": med([r["nextok"]["output_tokens_per_s"] for r in rounds]),
         "nextok_batch1_decode_tokens_per_s":
             med([r["nextok_batch1"]["decode_tokens_per_s"] for r in rounds])}
    if "transformers_padded" not in rounds[0]:
        return s
    ratio_single, ratio_best, ratio_b1, best_sizes = [], [], [], []
    for r in rounds:
        ours = r["nextok"]["output_tokens_per_s"]
        best_b, best = max(r["transformers_padded"].items(), key=lambda kv: kv[1]["output_tokens_per_s"])
        best_sizes.append(int(best_b))
        ratio_single.append(ours / r["transformers_one_at_a_time"]["output_tokens_per_s"])
        ratio_best.append(ours / best["output_tokens_per_s"])
        ratio_b1.append(r["nextok_batch1"]["decode_tokens_per_s"]
                        / r["transformers_batch1_decode"]["decode_tokens_per_s"])
    s.update({"ratio_vs_transformers_one_at_a_time": med(ratio_single),
              "ratio_vs_transformers_best_padded_batch": med(ratio_best),
              "transformers_best_batch_size": best_sizes,
              "ratio_batch1_decode": med(ratio_b1)})
    return s


def _print(result: dict) -> None:
    m = result["machine"]
    print(f"\n{result['benchmark']} on {m.get('cpu_model', '?')} ({result['device']}, {result['dtype']}), "
          f"{result['num_prompts']} x {result['input_len']} -> {result['output_len']} ({result['dataset']})")
    for k, v in result["summary"].items():
        print(f"  {k:45s} {v:.2f}" if isinstance(v, float) else f"  {k:45s} {v}")
