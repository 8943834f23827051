"""`nextok bench spec`: speculative decoding against none, in one run (issue 8).

    nextok bench spec --methods ngram --workloads code,edit,random --output OUT.json
    nextok bench spec --methods ngram,self-draft:8,self-draft:20 --workloads code
    nextok bench spec --methods draft --draft-model PATH
    nextok bench spec --methods ngram@7,medusa@4 --medusa-heads DIR   (K per method)

- Latency at concurrency 1, per workload: each prompt runs on the plain engine and on each
  speculating engine in turn (the order alternates from prompt to prompt, so slow periods of a
  shared machine hit both); time to first token, TPOT = (end - first token) / (tokens - 1), and
  end-to-end latency; the medians and their ratios; the drafts proposed and accepted.
- Workloads: `code` (windows of real stdlib source, as in bench throughput; with `--held-out`
  only from the eval split, which `nextok train medusa` never reads), `edit` (a chat
  request to rewrite a real stdlib function with one name renamed: the reply repeats its
  context) and
  `random` (random token ids: little to look up, the case where speculation must not cost).
- `--crossover-batch-sizes`: output tokens/s of B code prompts decoded together, with and without
  speculation (never turned down here), to find where the verify steps' extra rows stop paying.
Greedy throughout, so every engine writes the same tokens and only the time differs. The CPU time
other processes took during each measurement is recorded (shared machines).
"""
from __future__ import annotations

import ast
import hashlib
import random
import statistics
import time

from nextok.bench.common import Meter, header, memory_copy_gbps, write_json


def add_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("spec", help="speculative decoding vs none: TPOT, latency, acceptance")
    p.add_argument("--methods", default="ngram",
                   help="comma-separated --speculative methods; self-draft:L runs L layers; "
                        "METHOD@K drafts K tokens (default --num-speculative-tokens)")
    p.add_argument("--workloads", default="code,edit,random")
    p.add_argument("--num-prompts", type=int, default=8, help="per workload")
    p.add_argument("--input-len", type=int, default=256, help="code / random prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="tokens per request, at most")
    p.add_argument("--held-out", action="store_true",
                   help="code prompts from the held-out eval split only (bench/datasets.py), "
                        "never seen by `nextok train medusa`")
    p.add_argument("--crossover-batch-sizes", default="", help="e.g. 1,2,4,8,16 (empty: skip)")
    p.add_argument("--output", default=None)
    add_engine_args(p)
    p.set_defaults(func=run)


def edit_prompts(tokenizer, num: int, seed: int, max_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt ids, max_tokens): a chat request to rewrite a real stdlib function of 6-30 lines
    with one of its names (used 3+ times) renamed, the editing requests an assistant sees. The
    reply repeats most of its context; max_tokens covers the function and its code fence."""
    from nextok.bench.datasets import shuffled_sources

    out = []
    for _, source in shuffled_sources(random.Random(seed)):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if (not isinstance(node, ast.FunctionDef) or node.col_offset
                    or not 6 <= node.end_lineno - node.lineno + 1 <= 30):
                continue
            names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and len(n.id) >= 3]
            names += [a.arg for a in node.args.args if len(a.arg) >= 3 and a.arg != "self"]
            common = [n for n in dict.fromkeys(names) if names.count(n) >= 3]
            if not common:
                continue
            old = common[0]
            new = old + "_renamed"
            func = "\n".join(lines[node.lineno - 1:node.end_lineno])
            ask = f"Rewrite this function with `{old}` renamed to `{new}`.\n\n```python\n{func}\n```"
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": ask}],
                                                   add_generation_prompt=True)
            reply = len(tokenizer.encode(_rename(func, old, new), add_special_tokens=False)) + 16
            out.append((tokenizer.encode(prompt, add_special_tokens=False), min(max_tokens, reply)))
            break
        if len(out) == num:
            return out
    raise RuntimeError(f"found only {len(out)} stdlib functions to edit")


def _rename(code: str, old: str, new: str) -> str:
    import re

    return re.sub(rf"\b{re.escape(old)}\b", new, code)


def _one(llm, ids: list[int], params) -> dict:
    """One request alone on the engine: TTFT, TPOT, end-to-end seconds, tokens."""
    eng = llm.engine
    rid = f"bench-spec-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    eng.add_request(rid, ids, params, stream=True)
    first = done = None
    ids_out: list[int] = []
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.request_id != rid:
                continue
            ids_out = list(out.outputs[0].token_ids) if out.outputs else []
            if first is None and ids_out:
                first = time.perf_counter() - t0
            if out.finished:
                done = time.perf_counter() - t0
    tokens = len(ids_out)
    tpot = (done - first) / (tokens - 1) if tokens > 1 else float("nan")
    # the output itself, hashed: "same tokens" compares what was written, not only how much
    digest = hashlib.sha1(str(ids_out).encode()).hexdigest()[:16]
    return {"ttft_s": first, "tpot_s": tpot, "e2e_s": done, "tokens": tokens, "output_sha1": digest}


def run(args) -> int:
    from nextok import LLM, SamplingParams
    from nextok.bench.datasets import build
    from nextok.cli import engine_kwargs

    from nextok.bench.datasets import EVAL_SPLIT

    split = EVAL_SPLIT if args.held_out else None
    methods = [m for m in args.methods.split(",") if m]
    workloads = [w for w in args.workloads.split(",") if w]
    kwargs = engine_kwargs(args)
    for key in ("speculative", *_METHOD_OPTIONS):
        kwargs.pop(key, None)
    engines = {"off": LLM(**kwargs)}
    for m in methods:  # never turned down: the crossover is what we measure
        engines[m] = LLM(**{**kwargs, **_method_kwargs(m, args), "speculative_disable_batch_size": 1 << 20})
    tok = engines["off"].get_tokenizer()
    result = {"benchmark": "speculative decoding", "methods": methods,
              "num_speculative_tokens": args.num_speculative_tokens,
              "code_split": split or "all", "medusa_heads": args.medusa_heads, "workloads": {}}
    for w in workloads:
        if w == "edit":
            cases = edit_prompts(tok, args.num_prompts, args.seed, args.output_len)
        else:
            cases = [(ids, args.output_len)
                     for ids in build(w, tok, args.num_prompts, args.input_len, args.seed, split)]
        stats0 = {m: dict(engines[m].engine.spec_stats) for m in methods}
        runs = {name: [] for name in engines}
        names = list(engines)
        gbps = [memory_copy_gbps()]
        with Meter() as meter:
            for i, (ids, max_tokens) in enumerate(cases):
                sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=w != "edit")
                for name in (names if i % 2 == 0 else names[::-1]):
                    runs[name].append(_one(engines[name], ids, sp))
        gbps.append(memory_copy_gbps())
        summary = {}
        for name, rs in runs.items():
            summary[name] = {k: statistics.median(r[k] for r in rs if r[k] == r[k])
                             for k in ("ttft_s", "tpot_s", "e2e_s")}
            summary[name]["tokens"] = sum(r["tokens"] for r in rs)
        for m in methods:
            st = engines[m].engine.spec_stats
            d = {k: st[k] - stats0[m][k] for k in st}
            ratios = [a["tpot_s"] / b["tpot_s"] for a, b in zip(runs["off"], runs[m])
                      if a["tokens"] > 1 and b["tokens"] > 1]
            summary[m].update(
                tpot_speedup=summary["off"]["tpot_s"] / summary[m]["tpot_s"],
                # the same speedup other ways: all decode time over all tokens, and per prompt
                tpot_speedup_aggregate=_decode_seconds(runs["off"]) / _decode_seconds(runs[m]),
                tpot_speedup_per_prompt_median=statistics.median(ratios) if ratios else float("nan"),
                e2e_speedup=summary["off"]["e2e_s"] / summary[m]["e2e_s"],
                verify_steps=d["steps"], proposed=d["proposed"], accepted=d["accepted"],
                acceptance_rate=d["accepted"] / d["proposed"] if d["proposed"] else 0.0,
                mean_accepted_per_step=d["accepted"] / d["steps"] if d["steps"] else 0.0,
                # the accepted drafts and the target's own token
                mean_emitted_per_step=(d["accepted"] + d["steps"]) / d["steps"] if d["steps"] else 0.0,
                same_tokens=all(a["output_sha1"] == b["output_sha1"] for a, b in zip(runs["off"], runs[m])))
        result["workloads"][w] = {"num_prompts": len(cases), "summary": summary, "runs": runs,
                                  "cpu": meter.summary(),
                                  "memory_copy_gbps_before_after": [round(g, 1) for g in gbps]}
        _print(w, summary, meter.summary(), gbps)
    sizes = [int(b) for b in args.crossover_batch_sizes.split(",") if b.strip()]
    if sizes and args.output:  # the workloads' results are kept if the crossover fails
        write_json(args.output, header(result))
    if sizes:
        # any stdlib file: the held-out split has too few files for batches of 64+
        result["crossover"] = _crossover(engines, tok, sizes, args, None)
    write_json(args.output, header(result)) if args.output else None
    return 0


_METHOD_OPTIONS = ("draft_model", "self_draft_layers", "draft_num_kv_blocks", "medusa_heads")


def _method_kwargs(method: str, args) -> dict:
    """Engine options of one method: `self-draft:L` is self-draft with L layers, `METHOD@K`
    drafts K tokens a step; the draft options of the command line go to the methods that take
    them only."""
    method, _, k = method.partition("@")
    name, _, layers = method.partition(":")
    kw = {"speculative": name}
    if k:
        kw["num_speculative_tokens"] = int(k)
    if name in ("draft", "self-draft"):
        kw["draft_num_kv_blocks"] = args.draft_num_kv_blocks
    if name == "draft":
        kw["draft_model"] = args.draft_model
    if name == "self-draft":
        kw["self_draft_layers"] = int(layers) if layers else args.self_draft_layers
    if name == "medusa":
        kw["medusa_heads"] = args.medusa_heads
    return kw


def _crossover(engines, tok, sizes, args, split) -> dict:
    """Output tokens/s of B code prompts decoded together, each engine, 2 alternating rounds."""
    from nextok import SamplingParams
    from nextok.bench.datasets import build

    out = {}
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    for b in sizes:
        prompts = build("code", tok, b, args.input_len, args.seed + b, split)
        rates = {name: [] for name in engines}
        with Meter() as meter:
            for rnd in range(2):
                for name in (list(engines) if rnd % 2 == 0 else list(engines)[::-1]):
                    t = time.perf_counter()
                    res = engines[name].generate(prompts, sp)
                    rates[name].append(sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t))
        row = {name: statistics.median(v) for name, v in rates.items()}
        row["cpu"] = meter.summary()
        out[str(b)] = row
        print(f"crossover batch {b:3d}: " + ", ".join(f"{n} {row[n]:.1f} tok/s" for n in engines)
              + f"  (other processes {row['cpu']['other_processes_cpu_seconds']} CPU s)", flush=True)
    return out


def _decode_seconds(runs: list[dict]) -> float:
    """Decode time (after the first token) summed over the prompts: TPOT x (tokens - 1)."""
    return sum(r["tpot_s"] * (r["tokens"] - 1) for r in runs if r["tokens"] > 1)


def _print(w, summary, cpu, gbps) -> None:
    off = summary["off"]
    print(f"{w}: off TPOT {off['tpot_s'] * 1e3:.1f} ms, e2e {off['e2e_s']:.2f} s  "
          f"(other processes {cpu['other_processes_cpu_seconds']} CPU s of {cpu['seconds']:.0f} s; "
          f"memory copy {gbps[0]:.1f} -> {gbps[1]:.1f} GB/s)")
    for m, s in summary.items():
        if m == "off":
            continue
        print(f"  {m}: TPOT {s['tpot_s'] * 1e3:.1f} ms ({s['tpot_speedup']:.2f}x; aggregate "
              f"{s['tpot_speedup_aggregate']:.2f}x, per-prompt median {s['tpot_speedup_per_prompt_median']:.2f}x), "
              f"e2e {s['e2e_s']:.2f} s ({s['e2e_speedup']:.2f}x), accepted {s['accepted']}/{s['proposed']} "
              f"({s['acceptance_rate']:.0%}), {s['mean_accepted_per_step']:.2f} per verify step "
              f"({s['mean_emitted_per_step']:.2f} tokens emitted), "
              f"same tokens: {s['same_tokens']}", flush=True)
