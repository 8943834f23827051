"""`nextok` command line: generate, pull, bench. Errors are one line and a non-zero exit."""
from __future__ import annotations

import argparse
import logging
import sys

from nextok import __version__


_SERVER_MODULES = {"fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client"}
_BENCH_MODULES = {"httpx", "matplotlib", "transformers", "accelerate"}
_LSP_MODULES = {"pygls", "lsprotocol"}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags shared by every command that loads a model (names match `EngineArgs`)."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="GGUF file, Hugging Face directory, or alias (default: smollm2-135m-instruct)")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory, if not the model's")
    g.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda")
    g.add_argument("--load-format", default="auto", choices=["auto", "gguf", "safetensors", "dummy"])
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-memory", type=_bytes, default=None,
                   help="KV pool size, e.g. 2GiB (default: a fraction of free memory; on CPU at most 4 GiB, "
                        "its pages committed as sequences fill them)")
    g.add_argument("--kv-cache-memory-fraction", type=float, default=0.25)
    g.add_argument("--num-kv-blocks", type=int, default=None, help="exact KV pool size in blocks")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads (default: torch's)")
    g.add_argument("--no-cpu-kernels", dest="cpu_kernels", action="store_false",
                   help="CPU: plain torch ops instead of oneDNN packed linears and the C decode kernel")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: triton on CUDA, the torch reference (gather + SDPA) on CPU")
    g.add_argument("--enforce-eager", action="store_true",
                   help="CUDA: no CUDA graphs (every decode step launches its kernels one by one)")
    g.add_argument("--cuda-graph-max-batch", type=int, default=256,
                   help="CUDA: largest decode batch replayed from a captured graph")
    g.add_argument("--quantization", default=None,
                   help="quantize the decoder's linear layers at load: int8 (weight-only, per "
                        "output channel), int4 (weight-only, round-to-nearest, groups of 128) or "
                        "fp8 (W8A8 e4m3; GPUs with FP8 tensor cores)")
    g.add_argument("--quant-group-size", type=int, default=128,
                   help="int4: consecutive weights of a row sharing one scale and minimum")
    g.add_argument("--quantize-lm-head", action="store_true",
                   help="with --quantization: the lm_head too (a tied one as a quantized copy "
                        "of the embedding); off by default, as it holds the logits' precision")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "fp8"],
                   help="auto: the model's dtype; int8: one byte per value and a float32 "
                        "scale per cached row of a token and KV head; fp8: e4m3 values "
                        "clamped to +-448, no scale (exactly half a bf16 cache's bytes)")
    g.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"],
                   help="launch each step before the host has collected the previous one "
                        "(auto: on for CUDA, off on CPU)")
    g.add_argument("--speculative", default=None, metavar="METHOD",
                   help="speculative decoding: ngram (prompt lookup over the request's own "
                        "tokens), draft (a smaller model: --draft-model), self-draft (the "
                        "model's own first layers: --self-draft-layers) or medusa (heads on the "
                        "model's last hidden state: --medusa-heads)")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="draft: a smaller model (GGUF file or HF directory) with the same tokenizer")
    g.add_argument("--self-draft-layers", type=int, default=None, metavar="L",
                   help="self-draft: how many of the model's first layers draft (default: all "
                        "but the last 2)")
    g.add_argument("--draft-num-kv-blocks", type=int, default=None,
                   help="draft / self-draft: blocks in the draft's own KV pool (default: as "
                        "many as the model's)")
    g.add_argument("--num-speculative-tokens", type=int, default=4,
                   help="draft tokens proposed per step, at most (1-15)")
    g.add_argument("--ngram-min", type=int, default=1, help="ngram: shortest suffix looked up")
    g.add_argument("--ngram-max", type=int, default=8, help="ngram: longest suffix looked up")
    g.add_argument("--medusa-heads", default=None, metavar="PATH",
                   help="medusa: heads written by `nextok train medusa` (the file or its directory); "
                        "drafts per step: the number of heads, or --num-speculative-tokens if fewer")
    g.add_argument("--speculative-disable-batch-size", type=int, default=16,
                   help="propose only while at most this many sequences run")
    g.add_argument("--gguf-blocks-only", dest="gguf_dense_copy", action="store_false",
                   help="keep GGUF weights only as their blocks, for the least memory. CPU: steps "
                        "of more than 32 rows, 8 with --gguf-activations float32, then dequantize "
                        "each weight per call; CUDA: Q8_0/Q5_*/Q6_K run the slower GGUF kernel "
                        "instead of being converted to int8 groups (up to 1.6x their bytes)")
    g.add_argument("--no-gguf-blocks", dest="gguf_blocks", action="store_false",
                   help="keep GGUF weights only dequantized (default: on CPU decode steps read "
                        "Q4_1/Q8_0 weights as their blocks; on CUDA Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/"
                        "Q6_K weights stay quantized and run Triton kernels)")
    g.add_argument("--gguf-activations", default="auto", choices=["auto", "int8", "float32"],
                   help="CPU: the GGUF block kernel's activations: float32 (exactly the "
                        "dequantized weights' products, so outputs do not depend on the batch) or "
                        "int8 (quantized per 32 values, integer dot products, as llama.cpp: ~2x "
                        "faster decode, but a sequence's greedy output may then change with what "
                        "else is in the batch); auto (default): float32 with --dtype float32, "
                        "int8 with bfloat16")


def engine_kwargs(args: argparse.Namespace) -> dict:
    from dataclasses import fields

    from nextok.engine.factory import EngineArgs

    return {f.name: getattr(args, f.name) for f in fields(EngineArgs) if hasattr(args, f.name)}


def _bytes(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for suffix, mult in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _cmd_generate(args: argparse.Namespace) -> int:
    from nextok import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.sample_seed,
                            stop=args.stop or None, ignore_eos=args.ignore_eos)
    llm = LLM(**engine_kwargs(args))
    prompt = args.prompt
    if args.chat:
        tok = llm.get_tokenizer()
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]),
                            add_special_tokens=False)
    else:
        sys.stdout.write(prompt)
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from nextok import hub

    path = hub.pull(args.name or hub.DEFAULT_MODEL, force=args.force)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nextok", description="LLM inference server for code.")
    parser.add_argument("--version", action="version", version=f"nextok {__version__}")
    parser.add_argument("--log-level", default="warning")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--sample-seed", type=int, default=None, help="sampling seed")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_cmd_generate)

    pull = sub.add_parser("pull", help="download a known model into the cache")
    pull.add_argument("name", nargs="?", default=None)
    pull.add_argument("--force", action="store_true", help="download again even if cached")
    pull.set_defaults(func=_cmd_pull)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    from nextok.bench import throughput

    throughput.add_parser(bench_sub, add_engine_args)
    from nextok.bench import latency

    latency.add_parser(bench_sub, add_engine_args)
    from nextok.bench import serve_bench

    serve_bench.add_parser(bench_sub)
    from nextok.bench import ladder

    ladder.add_parser(bench_sub)  # also `bench plot`
    from nextok.bench import compare

    compare.add_parser(bench_sub)
    from nextok.bench import scaleout

    scaleout.add_parser(bench_sub)
    from nextok.bench import kernels

    kernels.add_parser(bench_sub)
    from nextok.bench import spec

    spec.add_parser(bench_sub, add_engine_args)
    from nextok.server import serve

    serve.add_parser(sub, add_engine_args)
    from nextok.quant import quantize_cmd

    quantize_cmd.add_parser(sub, add_engine_args)
    from nextok.eval import ppl

    ppl.add_parser(sub, add_engine_args)
    from nextok.spec import medusa_train

    medusa_train.add_parser(sub)
    from nextok import lsp

    lsp.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from nextok.errors import NextokError

    try:
        return int(args.func(args) or 0)
    except (NextokError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        extra = ("server" if e.name in _SERVER_MODULES else "bench" if e.name in _BENCH_MODULES
                 else "lsp" if e.name in _LSP_MODULES else None)
        if extra is None:
            raise
        print(f"error: {e}; this command needs an extra: pip install 'nextok[{extra}]'", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
