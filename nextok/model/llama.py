"""The Llama family: Llama (SmolLM2 is one), Mistral (sliding window), Qwen2 (QKV bias).

Differences between the three are config fields, not subclasses: `attention_bias`,
`sliding_window`, `rope_scaling`, `tie_word_embeddings`. GQA throughout.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from nextok.attention.base import AttentionBackend, AttentionMetadata
from nextok.config import ModelConfig
from nextok.errors import ModelLoadError
from nextok.model.layers import FusedLinear, RMSNorm, RotaryEmbedding, SwiGLU, norm_then_linear


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        # q, k and v in one matmul: [T, hidden] -> [T, q_size + 2 * kv_size]
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.fused = None  # fused elementwise ops (kernels/select.py), bound by the model runner
        self.store_kv_in_rope = False  # the fused ops also write k, v to the cache (set_fused_ops)

    def forward(self, x, rope_cos_sin, kv_cache, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        # x: [T, hidden]; rope_cos_sin: ([T, 1, D/2], [T, 1, D/2]) for this step's positions
        return self.attend(self.qkv_proj(x), rope_cos_sin, kv_cache, meta, backend)

    def attend(self, qkv, rope_cos_sin, kv_cache, meta: AttentionMetadata,
               backend: AttentionBackend) -> torch.Tensor:
        # qkv: [T, q_size + 2 * kv_size], qkv_proj's output -> o_proj's [T, hidden]
        t = qkv.shape[0]
        stored = False
        # RoPE and the KV store in one launch; int8 rows with their scale only where the fused
        # ops quantize them (the C ones: kernels/cpu_fused.py)
        cache_dtype = kv_cache[0].dtype
        if (self.fused is not None and self.store_kv_in_rope
                and (cache_dtype in (qkv.dtype, torch.float8_e4m3fn)
                     or (cache_dtype == torch.int8 and getattr(self.fused, "stores_int8_kv", False)))):
            self.fused.rope_neox_store_kv(qkv, self.num_heads, self.num_kv_heads, self.head_dim,
                                          *rope_cos_sin, kv_cache[0], kv_cache[1], meta.slot_mapping)
            stored = True
        elif self.fused is not None:  # rotates the q and k heads inside qkv, in place
            self.fused.rope_neox(qkv, self.num_heads + self.num_kv_heads, self.head_dim, *rope_cos_sin)
        qk = qkv[:, :self.q_size + self.kv_size].view(t, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.fused is None:
            qk = RotaryEmbedding.rotate(qk, *rope_cos_sin)  # q and k heads in one pass
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, kv_stored=stored)
        return self.o_proj(out.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x, residual, rope_cos_sin, kv_cache, meta, backend):
        # x: [T, hidden], the previous layer's MLP output; residual: the stream it adds into
        # (None at the first layer, where x is the embedding). Returns (mlp out, residual).
        attn = self.self_attn
        qkv, residual = norm_then_linear(self.input_layernorm, attn.qkv_proj, x, residual)
        x = attn.attend(qkv, rope_cos_sin, kv_cache, meta, backend)
        gate_up, residual = norm_then_linear(self.post_attention_layernorm, self.mlp.gate_up_proj,
                                             x, residual)
        return self.mlp.down(gate_up), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, max_positions: int):
        super().__init__()
        self.config = config
        self.backend = backend
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config, max_positions)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._linear_ops = None  # the fused ops' `linear` for the tied lm_head (set_fused_ops)
        self.lm_head_quantized = False  # --quantize-lm-head made lm_head a quantized copy of the
        # tied embedding (quant/base.py): memory of its own
        self.decode_layers = None  # every layer of a decode step in one C call (use_gguf_blocks)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden states [T, hidden]
        x = self.embed_tokens(input_ids)
        rope_cos_sin = self.rope.table(positions, x.dtype)  # shared by every layer
        if self.decode_layers is not None and self.decode_layers.takes(meta, x.shape[0], kv_caches):
            return self.norm(*self.decode_layers.run(x, *rope_cos_sin, kv_caches, meta))[0]
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, rope_cos_sin, kv_cache, meta, self.backend)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [S, hidden] (only the rows that sample) -> [S, vocab]
        if self.lm_head is None:  # tied to the embedding
            if self._linear_ops is not None:
                return self._linear_ops.linear(hidden, self.embed_tokens.weight, None)
            return torch.nn.functional.linear(hidden, self.embed_tokens.weight)
        return self.lm_head(hidden)

    def pack_for_cpu(self, dtype: torch.dtype) -> int:
        """After loading: every linear, the tied lm_head included, on oneDNN packed weights."""
        from nextok.kernels.cpu_linear import PackedLinear, pack_linears

        num = pack_linears(self, dtype)
        if num and self.lm_head is None:
            # The embedding keeps its plain weight for lookups; the packed copy is the lm_head.
            self.lm_head = PackedLinear(self.embed_tokens.weight, None)
            num += 1
        return num

    def set_fused_ops(self, ops) -> None:
        """Binds the fused elementwise ops (kernels/select.py) to every layer that takes them;
        with ops that multiply (`linear`), the dense nn.Linear layers go through them too (quantized
        layers, which are not nn.Linear, keep their own kernels)."""
        if ops is not None and hasattr(ops, "linear"):
            for name, module in list(self.named_modules()):
                if type(module) is nn.Linear:
                    parent_name, _, attr = name.rpartition(".")
                    parent = self.get_submodule(parent_name) if parent_name else self
                    setattr(parent, attr, FusedLinear(module, ops))
        self._linear_ops = ops if ops is not None and hasattr(ops, "linear") else None
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = ops
            if isinstance(module, Attention):
                module.store_kv_in_rope = hasattr(ops, "rope_neox_store_kv")

    def use_gguf_blocks(self, blocks: Iterable[tuple[str, int, torch.Tensor]],
                        keep_dense: bool = True, activations: str = "float32") -> int:
        """After pack_for_cpu, on float32 or bfloat16: every linear whose weights (all shards of a
        fused one) come as GGUF blocks with a CPU kernel also keeps them, and reads them for decode-sized
        steps; keep_dense=False drops its dense weights (bigger steps then dequantize the blocks).
        blocks: (HF name, ggml type, raw [rows, row bytes]); activations: the block kernel's,
        int8 or float32 (kernels/cpu_gguf_linear.py). Returns how many layers took them."""
        from nextok.kernels.cpu_gguf_linear import BlockLinear, BlockOrDenseLinear, GGUFBlockLinear

        # bfloat16 dense layers (AMX) catch up with the blocks at fewer rows than float32 ones
        bf16 = self.embed_tokens.weight.dtype == torch.bfloat16

        swapped = 0
        for module_name, parts in self._gguf_shards(blocks).items():
            want = self._num_shards(module_name)
            if len(parts) != want:
                continue  # a part in a type without a block kernel: stays dense
            dense = self.get_submodule(module_name) if module_name != "lm_head" else self.lm_head
            if dense is None:  # the tied lm_head where oneDNN packed no copy of it (bfloat16 on
                # a CPU without AVX-512): a linear on the embedding's own weight, for big steps
                weight = self.embed_tokens.weight
                dense = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
                dense.weight = weight
            # shards stacked in output rows; runs of one type (*_K_M files mix them: q, k Q4_K,
            # v Q6_K) become one part each
            runs: list[tuple[int, list[torch.Tensor]]] = []
            for i in range(want):
                type_id, raw = parts[i]
                if runs and runs[-1][0] == type_id:
                    runs[-1][1].append(raw)
                else:
                    runs.append((type_id, [raw]))
            bias = getattr(dense, "bias", None)
            layer = GGUFBlockLinear.of_parts(
                [(t, torch.cat(raws), sum(r.shape[0] for r in raws)) for t, raws in runs],
                dense.in_features, bias=None if bias is None else bias.detach(), activations=activations)
            parent_name, _, attr = module_name.rpartition(".")
            parent = self.get_submodule(parent_name) if parent_name else self
            dense_rows = layer.bf16_dense_max_rows if bf16 else None
            setattr(parent, attr, BlockOrDenseLinear(dense, layer, dense_rows) if keep_dense
                    else BlockLinear(layer))
            swapped += 1
        from nextok.kernels.cpu_decode import DecodeLayers

        self.decode_layers = DecodeLayers.for_model(self)
        return swapped

    def use_gguf_device_blocks(self, blocks: Iterable[tuple[str, int, torch.Tensor]],
                               int8: bool = True) -> int:
        """After loading, before set_fused_ops (CUDA): every linear whose weights (every shard
        of a fused one) come as GGUF blocks of a type the Triton kernel reads is replaced by a
        GGUFLinear holding only the blocks (quant/gguf_cuda.py); its dense weights are dropped.
        Shards of different types (*_K_M files) stay separate matrices of that one layer; a
        linear with any shard of another type (F16, Q2_K, ...) stays dense. The tied lm_head
        reads the embedding's blocks, the lookups keep the dense table. blocks: (HF name, ggml
        type, raw [rows, row bytes]). int8: Q8_0 / Q5_* / Q6_K matrices take the int8 layout
        (False: they keep their blocks). Returns how many layers took blocks."""
        from nextok.quant.gguf_cuda import GGUFLinear

        device, dtype = self.embed_tokens.weight.device, self.embed_tokens.weight.dtype
        swapped = 0
        for module_name, parts in self._gguf_shards(blocks).items():
            if len(parts) != self._num_shards(module_name):
                continue
            dense = self.get_submodule(module_name) if module_name != "lm_head" else self.lm_head
            out, k = ((dense.out_features, dense.in_features) if dense is not None
                      else self.embed_tokens.weight.shape)  # None: the tied lm_head
            bias = getattr(dense, "bias", None)
            layer = GGUFLinear([(t, raw.to(device)) for t, raw in (parts[i] for i in sorted(parts))],
                               k, bias, dtype, int8=int8)
            if layer.out_features != out:
                raise ModelLoadError(f"GGUF blocks of {module_name} hold {layer.out_features} "
                                     f"rows, expected {out}")
            parent_name, _, attr = module_name.rpartition(".")
            setattr(self.get_submodule(parent_name) if parent_name else self, attr, layer)
            swapped += 1
        return swapped

    def _gguf_shards(self, blocks) -> dict[str, dict[int, tuple[int, torch.Tensor]]]:
        """GGUF blocks -> {linear's module name: {shard: (ggml type, raw)}}; the tied lm_head
        takes the embedding's blocks (an untied embedding's are left out: lookups stay dense)."""
        shards: dict[str, dict[int, tuple[int, torch.Tensor]]] = {}
        for hf_name, type_id, raw in blocks:
            name = hf_name.removeprefix("model.")
            if name == "embed_tokens.weight":  # lookups keep the dense table
                if not self.config.tie_word_embeddings:
                    continue
                name = "lm_head.weight"  # the tied lm_head reads the embedding's blocks
            elif name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target, shard = self._target(name)
            if target.endswith(".weight"):
                shards.setdefault(target.removesuffix(".weight"), {})[shard or 0] = (type_id, raw)
        return shards

    @staticmethod
    def _num_shards(module_name: str) -> int:
        return 3 if module_name.endswith("qkv_proj") else 2 if module_name.endswith("gate_up_proj") else 1

    # ---- weights ---------------------------------------------------------------------------
    # HF name suffix -> (our parameter suffix, shard index within the fused matrix)
    _FUSED = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def _target(self, name: str) -> tuple[str, int | None]:
        """Checkpoint name (no "model." prefix) -> (our parameter name, shard in a fused matrix)."""
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in self._FUSED:
            fused, shard = self._FUSED[parts[-2]]
            return ".".join(parts[:-2] + [fused, parts[-1]]), shard
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: some checkpoints store the copy anyway
            target, shard = self._target(name)
            param = params.get(target)
            if param is None:
                raise ModelLoadError(f"checkpoint tensor {hf_name!r} has no place in the model")
            dst = self._shard_view(param, target, shard)
            if dst.shape != tensor.shape:
                raise ModelLoadError(
                    f"tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
            dst.copy_(tensor)
            loaded.add(target if shard is None else f"{target}#{shard}")
        self._check_complete(params, loaded)

    def _shard_view(self, param: torch.Tensor, name: str, shard: int | None) -> torch.Tensor:
        if shard is None:
            return param.data
        if "qkv_proj" in name:
            a = self.layers[0].self_attn
            sizes = [a.q_size, a.kv_size, a.kv_size]
        else:
            sizes = [self.config.intermediate_size] * 2
        start = sum(sizes[:shard])
        return param.data.narrow(0, start, sizes[shard])

    def _check_complete(self, params: dict, loaded: set[str]) -> None:
        missing = []
        for name in params:
            shards = 3 if "qkv_proj" in name else 2 if "gate_up_proj" in name else 0
            if shards:
                missing += [f"{name}#{i}" for i in range(shards) if f"{name}#{i}" not in loaded]
            elif name not in loaded:
                missing.append(name)
        if missing:
            raise ModelLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")

    def init_dummy_weights(self, seed: int = 0) -> None:
        """Random weights for performance work on shapes we cannot download (--load-format dummy)."""
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.data.fill_(1.0)
            elif name.endswith(".bias"):
                param.data.zero_()
            else:
                cpu = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
                param.data.copy_(cpu)
