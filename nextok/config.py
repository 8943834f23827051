"""One frozen config tree, built once from CLI flags / `LLM(...)` keyword arguments.

Nothing below the engine reads the environment; everything it needs is here.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, in Hugging Face `config.json` terms (GGUF metadata is mapped onto it)."""

    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3-style: {"rope_type": "llama3", "factor": ..., ...}
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    sliding_window: int | None = None  # Mistral: attend to the last `sliding_window` tokens only
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @staticmethod
    def from_hf_dict(cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        rope_theta = cfg.get("rope_theta")
        rope_scaling = cfg.get("rope_scaling")
        rope_params = cfg.get("rope_parameters")  # transformers 5 puts rope settings here
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
                rope_scaling = rope_params
        sliding = cfg.get("sliding_window")
        if cfg.get("use_sliding_window") is False:  # Qwen2 ships a window it does not use
            sliding = None
        return ModelConfig(
            architecture=archs[0],
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)) or archs[0] == "Qwen2ForCausalLM",
            sliding_window=int(sliding) if sliding else None,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; None: a fraction of free memory
    kv_cache_memory_fraction: float = 0.25  # of available memory on CPU, of free memory on CUDA
    num_blocks: int | None = None  # overrides the memory budget (tests use tiny pools)
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # auto: the model's dtype; int8 | fp8: attention/kv_quant.py


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (nextok/spec/): None, or a proposer's name in spec.METHODS."""
    method: str | None = None
    num_speculative_tokens: int = 4  # draft tokens proposed per step, at most
    ngram_min: int = 1  # ngram: the shortest suffix of the sequence looked up in its history
    ngram_max: int = 8  # ... and the longest (the longest match wins)
    # Propose only while at most this many sequences run: beyond it a verify step's extra rows
    # would cost more than the accepted tokens save. Measured on the 2-core Xeon (BENCHMARKS.md,
    # code prompts, K = 4, output tok/s off -> ngram): 1: 42 -> 74, 2: 73 -> 66, 4: 105 -> 126,
    # 8: 139 -> 145, 16: 165 -> 197; no crossover up to 16, so it stops there.
    disable_batch_size: int = 16
    draft_model: str | None = None  # draft: the path of a smaller model with the same tokenizer
    # self-draft: the target's first layers run as the draft (None: spec.SELF_DRAFT_LAYERS)
    self_draft_layers: int | None = None
    # draft / self-draft: blocks in the draft's own KV pool (None: as many as the target's)
    draft_num_blocks: int | None = None
    medusa_heads: str | None = None  # medusa: the heads file (or its directory), spec/medusa_heads.py


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"  # resolved: "cpu" or "cuda"
    dtype: str = "float32"  # resolved: "float32" | "bfloat16" | "float16"
    load_format: str = "auto"  # auto | gguf | safetensors | dummy
    seed: int = 0
    num_threads: int | None = None
    # CPU: oneDNN packed linears and the C paged-decode kernel; False = plain torch ops (the
    # reference path, and an ablation for benchmarks).
    cpu_kernels: bool = True
    # CPU float32 or bfloat16 on a GGUF file: decode-sized steps read Q4_1/Q8_0 weights as their
    # blocks (kernels/cpu_gguf_linear.py); on CUDA, Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K weights are
    # kept only as blocks (quant/gguf_cuda.py). False = the dequantized weights only.
    gguf_blocks: bool = True
    # ... and keep the dense weights too (float32 or bfloat16), for steps too big for the blocks
    # (faster than dequantizing the blocks per call); False: the blocks are the only copy.
    gguf_dense_copy: bool = True
    # ... with float32 activations (exactly the dequantized weights' products: a row's result
    # does not depend on the batch) or int8 ones (quantized per 32 values, integer dot products;
    # llama.cpp's way, ~2x faster at one row, but steps of more rows than the int8 kernel takes
    # run on float32 weights, so a sequence's output can change with the batch around it).
    # Resolved from "auto" by the factory: float32 on a float32 model, int8 on a bfloat16 one.
    gguf_activations: str = "float32"
    attention_backend: str = "torch"  # resolved: "torch" | "triton"
    # CUDA: decode steps of up to cuda_graph_max_batch sequences replay captured graphs
    enforce_eager: bool = False
    cuda_graph_max_batch: int = 256
    # Launch step N+1 before collecting step N (engine.py); resolved from "auto": on for CUDA.
    async_scheduling: bool = False
    # Decoder linears quantized at load (nextok/quant/): None or a name in quant.METHODS.
    quantization: str | None = None
    quant_group_size: int = 128  # int4: weights per (scale, min) group
    quantize_lm_head: bool = False  # the lm_head quantized too (quant/base.py quantize_model)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
