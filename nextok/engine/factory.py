"""Builds an `LLMEngine` from user-facing options (CLI flags / `LLM(...)` keyword arguments).

Resolves the model (path, HF directory or alias, pulled on first use), the device and dtype from
the machine, sizes the KV pool from a memory budget, and freezes it all into one EngineConfig.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from nextok.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from nextok.errors import NextokError

log = logging.getLogger("nextok")

CPU_KV_CAP = 4 << 30  # a CPU pool bigger than this buys nothing at CPU speeds


@dataclass
class EngineArgs:
    """Every option, with the CLI flag's name; `LLM(**kwargs)` takes the same names."""

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_memory_fraction: float = 0.25
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    seed: int = 0
    num_threads: int | None = None
    cpu_kernels: bool = True
    gguf_blocks: bool = True
    gguf_dense_copy: bool = True
    gguf_activations: str = "auto"  # auto | float32 | int8 (kernels/cpu_gguf_linear.py)
    attention_backend: str = "auto"
    enforce_eager: bool = False
    cuda_graph_max_batch: int = 256
    async_scheduling: str = "auto"  # auto (on for CUDA) | on | off
    quantization: str | None = None  # None | int8 | int4 (nextok/quant/)
    quant_group_size: int = 128
    quantize_lm_head: bool = False  # the lm_head too (opt-in: it holds the logits' precision)
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | int8 | fp8 (attention/kv_quant.py)
    speculative: str | None = None  # None | ngram | draft | self-draft | medusa (nextok/spec/)
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 8
    speculative_disable_batch_size: int = 16
    draft_model: str | None = None
    self_draft_layers: int | None = None
    draft_num_kv_blocks: int | None = None
    medusa_heads: str | None = None  # --speculative medusa: heads from `nextok train medusa`
    download: bool = True


def create_engine(args: EngineArgs):
    from nextok import hub, platform
    from nextok.engine.engine import LLMEngine
    from nextok.model.loader import load_checkpoint
    from nextok.worker.model_runner import ModelRunner

    _check_args(args)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    device = platform.resolve_device(args.device)
    dtype = platform.resolve_dtype(args.dtype, device)
    if args.quantization is not None:  # e.g. fp8 without FP8 tensor cores: before any loading
        from nextok.quant import get_quant_method

        get_quant_method(args.quantization, args.quant_group_size).check(torch.device(device),
                                                                         getattr(torch, dtype))
    path = hub.resolve_model(args.model, download=args.download)
    ckpt = load_checkpoint(path, args.load_format)
    model_config = ModelConfig.from_hf_dict(ckpt.hf_config)
    from nextok.model.registry import model_class

    model_class(model_config.architecture)  # unsupported architecture: fail before loading
    tokenizer = _load_tokenizer(args.tokenizer or ckpt.path, ckpt.format)
    model_config = _with_tokenizer_eos(model_config, tokenizer)
    spec = _speculative_config(args)
    draft = None
    if spec.method == "draft":  # its config and tokenizer are checked before any weights load
        from nextok.spec.draft_model import open_draft

        draft = open_draft(args.draft_model, path, model_config, tokenizer)
    elif spec.method == "self-draft":
        from nextok.spec import self_draft_layers

        self_draft_layers(spec, model_config)  # in range for this model

    max_len = min(args.max_model_len or model_config.max_position_embeddings,
                  model_config.max_position_embeddings)
    if args.max_model_len and args.max_model_len > model_config.max_position_embeddings:
        raise NextokError(f"--max-model-len {args.max_model_len} exceeds the model's "
                          f"{model_config.max_position_embeddings} positions")
    batched = args.max_num_batched_tokens
    if not args.enable_chunked_prefill:
        batched = max(batched, max_len)  # a whole prompt must fit in one step
    config = EngineConfig(
        model_path=path, model=model_config,
        cache=CacheConfig(args.block_size, args.kv_cache_memory, args.kv_cache_memory_fraction,
                          args.num_kv_blocks, args.enable_prefix_caching, args.kv_cache_dtype),
        scheduler=SchedulerConfig(args.max_num_seqs, batched, args.enable_chunked_prefill, max_len),
        device=device, dtype=dtype, load_format=ckpt.format, seed=args.seed,
        num_threads=args.num_threads, cpu_kernels=args.cpu_kernels, gguf_blocks=args.gguf_blocks,
        gguf_dense_copy=args.gguf_dense_copy, gguf_activations=_gguf_activations(args.gguf_activations, dtype),
        attention_backend=_attention_backend(args.attention_backend, device, args.kv_cache_dtype),
        enforce_eager=args.enforce_eager, cuda_graph_max_batch=args.cuda_graph_max_batch,
        async_scheduling=_async_scheduling(args.async_scheduling, device),
        quantization=args.quantization, quant_group_size=args.quant_group_size,
        quantize_lm_head=args.quantize_lm_head, speculative=spec)
    weights = None if ckpt.format == "dummy" else ckpt.weights()
    runner = ModelRunner(config, weights, max_len, ckpt.blocks)
    num_blocks = _num_blocks(config, runner)
    runner.allocate_kv_cache(num_blocks)
    # A sequence must fit in the pool (block 0 is reserved), or preemption could never help it.
    max_len = min(max_len, (num_blocks - 1) * args.block_size)
    log.info("model %s (%s) on %s in %s; KV pool %d blocks of %d tokens; context %d",
             os.path.basename(path), model_config.architecture, device, dtype, num_blocks,
             args.block_size, max_len)
    from nextok.spec import make_proposer

    proposer = make_proposer(spec, runner, num_blocks, max_len, draft)
    return LLMEngine(config, tokenizer, runner, num_blocks, max_len, proposer)


def _async_scheduling(mode: str, device: str) -> bool:
    """auto: on for CUDA, where the GPU would otherwise idle while the host works between steps;
    off on CPU, where the host *is* the device and there is nothing to overlap."""
    if isinstance(mode, bool):  # LLM(async_scheduling=True)
        return mode
    if mode not in ("auto", "on", "off"):
        raise NextokError(f"--async-scheduling must be auto, on or off, got {mode!r}")
    return device == "cuda" if mode == "auto" else mode == "on"


def _gguf_activations(name: str, dtype: str) -> str:
    """`auto`: float32 activations on a float32 model (a row's result does not depend on the
    batch), int8 on a bfloat16 one. There the dense layers are oneDNN's bf16 GEMM, no faster with
    float32 block activations at one row (17.5 ms for every matrix of the default model either
    way, 2-core AVX-512 Xeon) and 2.7x slower than int8 ones (6.6 ms); nor is bf16 batch-invariant
    to begin with (kernels/cpu_gguf_linear.py)."""
    if name != "auto":
        return name
    return "int8" if dtype == "bfloat16" else "float32"


def _attention_backend(name: str, device: str, kv_cache_dtype: str = "auto") -> str:
    """auto: triton on CUDA (where Triton imports), the torch reference on CPU. An fp8 KV cache
    goes to Triton where Triton has e4m3 (compute capability 8.9 or newer, or its interpreter),
    to the torch reference elsewhere."""
    if name not in ("auto", "torch", "triton"):
        raise NextokError(f"--attention-backend must be auto, torch or triton, not {name!r}")
    if (kv_cache_dtype == "fp8" and device.startswith("cuda")
            and torch.cuda.get_device_capability(device) < (8, 9)):
        if name == "triton":
            raise NextokError("--kv-cache-dtype fp8 with the Triton attention backend needs "
                              "compute capability 8.9 or newer (Triton's e4m3); use "
                              "--attention-backend torch")
        return "torch"
    if name == "torch" or (name == "auto" and device != "cuda"):
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        if name == "triton":
            raise NextokError("--attention-backend triton needs the triton package") from None
        log.warning("triton is not installed: the torch reference attention runs on %s", device)
        return "torch"
    if device != "cuda" and not os.environ.get("TRITON_INTERPRET"):
        raise NextokError("--attention-backend triton runs on CUDA (or in Triton's interpreter "
                          "with TRITON_INTERPRET=1)")
    return "triton"


def _speculative_config(args: EngineArgs) -> SpeculativeConfig:
    return SpeculativeConfig(args.speculative, args.num_speculative_tokens, args.ngram_min,
                             args.ngram_max, args.speculative_disable_batch_size, args.draft_model,
                             args.self_draft_layers, args.draft_num_kv_blocks, args.medusa_heads)


def _check_args(args: EngineArgs) -> None:
    from nextok.spec import check_config

    check_config(_speculative_config(args))  # before any loading
    if args.quantization is not None:
        from nextok.quant import get_quant_method

        get_quant_method(args.quantization, args.quant_group_size)  # fails before loading
    elif args.quantize_lm_head:
        raise NextokError("--quantize-lm-head needs --quantization (int8, int4 or fp8)")
    if args.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
        raise NextokError(f"--block-size must be a power of two up to 128, got {args.block_size}")
    if args.max_num_seqs < 1 or args.max_num_batched_tokens < 1:
        raise NextokError("--max-num-seqs and --max-num-batched-tokens must be >= 1")
    if args.num_kv_blocks is not None and args.num_kv_blocks < 2:
        raise NextokError(f"--num-kv-blocks must be >= 2, got {args.num_kv_blocks}")
    if args.cuda_graph_max_batch < 0:
        raise NextokError("--cuda-graph-max-batch must be >= 0 (0: no CUDA graphs)")
    if not (0.0 < args.kv_cache_memory_fraction <= 0.95):
        raise NextokError("--kv-cache-memory-fraction must be in (0, 0.95]")
    if args.gguf_activations not in ("auto", "int8", "float32"):
        raise NextokError(f"--gguf-activations must be auto, int8 or float32, got {args.gguf_activations!r}")
    if args.kv_cache_dtype not in ("auto", "int8", "fp8"):
        raise NextokError(f"--kv-cache-dtype must be auto, int8 or fp8, got {args.kv_cache_dtype!r}")


def _load_tokenizer(path: str, fmt: str):
    from nextok.tokenizer import Tokenizer

    if os.path.isfile(path) and (path.endswith(".gguf") or fmt == "gguf"):
        return Tokenizer.from_gguf(path)
    if os.path.isfile(path):  # a dummy checkpoint named by its config.json
        path = os.path.dirname(path) or "."
    return Tokenizer.from_dir(path)


def _with_tokenizer_eos(mc: ModelConfig, tokenizer) -> ModelConfig:
    import dataclasses

    eos = tuple(dict.fromkeys(mc.eos_token_ids + tuple(tokenizer.eos_token_ids)))
    return dataclasses.replace(mc, eos_token_ids=eos)


def _num_blocks(config: EngineConfig, runner) -> int:
    cache = config.cache
    if cache.num_blocks is not None:
        return cache.num_blocks
    per_block = runner.kv_bytes_per_block()
    if cache.kv_cache_memory is not None:
        budget = cache.kv_cache_memory
    elif config.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        budget = int(free * cache.kv_cache_memory_fraction)
    else:
        import psutil

        budget = min(int(psutil.virtual_memory().available * cache.kv_cache_memory_fraction), CPU_KV_CAP)
    # No point holding more than max_num_seqs full-length sequences.
    sched = config.scheduler
    useful = config.scheduler.max_num_seqs * -(-sched.max_model_len // cache.block_size) + 1
    num = min(budget // per_block, useful)
    if num < 2:
        raise NextokError(f"the KV cache budget ({budget} bytes) holds no block of {per_block} bytes")
    return int(num)
