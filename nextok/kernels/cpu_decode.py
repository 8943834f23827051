"""A decode step's decoder layers in one C call (csrc/decode_layers.c) on CPU, for a float32 or
bfloat16 model whose linear layers all read GGUF blocks: the kernels the Python layers call one by one,
called from C in the same order with the same arguments (the same results, bit for bit), so the
~330 calls of a one-token step lose the Python and torch work around them.

It takes a step only when every query is one decoding token, the rows fit the block kernels'
limit (the Python layers would switch to the dense weights past it) and the KV cache holds rows
of the model's dtype, or int8 rows (--kv-cache-dtype int8) where the paged-decode kernel reads
them; any other step, and any other model, runs the Python layers.
"""
from __future__ import annotations

import ctypes

import torch

from nextok.kernels import cpu_build
from nextok.kernels.cpu_fused import FusedOps

_p, _i, _f, _i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
L_COUNT = 16  # one layer's row of the table (csrc/decode_layers.c's L_* order)
S_COUNT = 4  # one matrix part's row of the parts table (S_*)


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _blocks_of(linear, dtype: torch.dtype):
    """A linear layer on GGUF blocks (kernels/cpu_gguf_linear.py's BlockOrDenseLinear or
    BlockLinear) as (its parts [(the kernel its forward calls on x of `dtype`, the blocks, their
    ggml type, their output rows)], its bias or None, the most rows it takes in one call), else
    None. bfloat16: regrouped int8 parts without bias (their bfloat16 calls) only; others
    convert x to float32 around the call."""
    from nextok.kernels.cpu_gguf_linear import BlockLinear, BlockOrDenseLinear

    if not isinstance(linear, (BlockLinear, BlockOrDenseLinear)):
        return None
    blocks = linear.blocks
    if dtype == torch.float32:
        parts = [(seg.fn, seg.ptr, seg.type_id, seg.rows) for seg in blocks.segments]
        return parts, blocks.bias, min(linear.max_rows, blocks.rows_per_call)
    if isinstance(linear, BlockOrDenseLinear) and blocks.bf16_call() is not None:  # what it calls
        return [(seg.fn_bf16, seg.ptr, seg.type_id, seg.rows) for seg in blocks.segments], None, linear.max_rows
    return None


class DecodeLayers:
    """Bound to one model (LlamaForCausalLM) by `for_model`; `takes(meta, rows)` says whether a
    step can run here, `run(x, cos, sin, kv_caches, meta)` runs every layer on it."""

    def __init__(self, lib, model, fused, decode_kernel, layer_rows: list[list], parts: list[list],
                 biases: list[torch.Tensor], max_rows: int):
        cfg = model.config
        self.dtype = dtype = model.embed_tokens.weight.dtype
        self._fn = lib.decode_layers
        self._fn.restype = _i
        self._fn.argtypes = [_p, _p, _p, _i, _p, _f, _f, _p, _p, _p, _p, _p, _p, _p, _i64]
        self.num_layers = len(model.layers)
        self.fns = torch.tensor([*fused.addresses(dtype), _address(decode_kernel[dtype])], dtype=torch.int64)
        self.table = torch.tensor(layer_rows, dtype=torch.int64)  # [layers, L_COUNT]
        self.parts = torch.tensor(parts, dtype=torch.int64)  # [matrix parts, S_COUNT]
        self._biases = biases  # the float32 biases the table points at
        self.max_rows = max_rows  # the fewest rows any layer's blocks take in one call
        attn = model.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        from nextok.kernels.cpu_attention import q8_supported

        # int8 caches: the quantizing store and the int8-cache attention (None: not taken)
        self.fns_int8 = None
        if q8_supported(decode_kernel, self.heads, self.kv_heads, self.head_dim):
            self.fns_int8 = torch.tensor([*fused.addresses(dtype, int8_kv=True),
                                          _address(decode_kernel[("q8", dtype)])], dtype=torch.int64)
        self.hidden, self.inter, self.scale = cfg.hidden_size, cfg.intermediate_size, attn.scale
        self.eps = model.layers[0].input_layernorm.eps
        # the table with each KV pool's cache pointers, by its first and last caches' addresses
        # and its layers: the target's pool, and a self-draft's (its first L layers, as
        # zip(layers, caches) runs L in Python)
        self._tables: dict[tuple[int, int, int], torch.Tensor] = {}

    @classmethod
    def for_model(cls, model) -> "DecodeLayers | None":
        """A DecodeLayers for `model` if it qualifies (float32 or bfloat16, C fused ops and C paged
        decode, every layer's qkv, o, gate_up and down on GGUF blocks: on a bfloat16 model regrouped
        parts without bias, each with a bfloat16 call), else None."""
        dtype = model.embed_tokens.weight.dtype
        if dtype not in (torch.float32, torch.bfloat16) or not hasattr(model.backend, "decode_kernel"):
            return None
        decode_kernel = model.backend.decode_kernel
        fused = model.layers[0].self_attn.fused
        if decode_kernel is None or not isinstance(fused, FusedOps):
            return None
        lib = cpu_build.load("decode_layers")
        if lib is None or lib.decode_layers_count() != (S_COUNT << 24) | (5 << 16) | (L_COUNT << 8) | 12:
            return None
        rows, parts, biases, limit = [], [], [], 1 << 30
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.fused is not fused or not attn.store_kv_in_rope:
                return None
            row = [layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(), 0, 0]
            for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                found = _blocks_of(linear, dtype)
                if found is None:
                    return None
                linear_parts, bias, most = found
                limit = min(limit, most)
                if bias is not None:
                    bias = bias.detach().float().contiguous()
                    biases.append(bias)
                row += [len(parts), len(linear_parts), 0 if bias is None else bias.data_ptr()]
                parts += [[_address(fn), ptr, type_id, n] for fn, ptr, type_id, n in linear_parts]
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                if not norm.weight.is_contiguous() or norm.eps != model.layers[0].input_layernorm.eps:
                    return None
            rows.append(row)
        return cls(lib, model, fused, decode_kernel, rows, parts, biases, limit)

    def takes(self, meta, rows: int, kv_caches) -> bool:
        """Is this step decoding only (one token per query), within the row limit, on caches of
        the model's dtype (or int8 rows with their scale, where the int8 kernels are bound)?"""
        if rows > self.max_rows or meta.num_decode != rows or meta.prefills:
            return False
        k = kv_caches[0][0]
        if k.dtype == torch.int8:
            return (self.fns_int8 is not None and k.is_contiguous()
                    and tuple(k.shape[2:]) == (self.kv_heads, self.head_dim + 4))
        return k.dtype == self.dtype and k.is_contiguous() and k.shape[2] * k.shape[3] == self.kv_heads * self.head_dim

    def _table_for(self, kv_caches) -> torch.Tensor:
        key = (kv_caches[0][0].data_ptr(), kv_caches[-1][1].data_ptr(), len(kv_caches))
        table = self._tables.get(key)
        if table is None:
            if len(kv_caches) > self.num_layers:
                raise ValueError(f"{len(kv_caches)} KV caches for {self.num_layers} layers")
            table = self.table[:len(kv_caches)].clone()
            for i, (k, v) in enumerate(kv_caches):
                if not (k.is_contiguous() and v.is_contiguous() and k.dtype == v.dtype
                        and k.dtype in (self.dtype, torch.int8)):
                    raise ValueError(f"the C decode layers read contiguous {self.dtype} or int8 caches")
                table[i, 2], table[i, 3] = k.data_ptr(), v.data_ptr()
            self._tables[key] = table
        return table

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_caches, meta):
        """x [T, hidden] in the model's dtype, the embeddings (overwritten) -> (the last layer's MLP output,
        the residual stream), as the Python layers return them; cos, sin [T, 1, D/2]."""
        table = self._table_for(kv_caches)
        t = x.shape[0]
        k_cache = kv_caches[0][0]
        cos, sin = cos.contiguous(), sin.contiguous()
        tables = meta.decode_block_tables.contiguous()
        lens = meta.decode_context_lens.contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        residual = torch.empty_like(x)
        int8 = k_cache.dtype == torch.int8
        dims = (_i * 12)(t, self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter,
                         k_cache.shape[1], tables.shape[1], meta.sliding_window or 0,
                         torch.get_num_threads(), x.element_size(), int(int8))
        fns = self.fns_int8 if int8 else self.fns
        rc = self._fn(fns.data_ptr(), table.data_ptr(), self.parts.data_ptr(), table.shape[0], dims, self.eps,
                      self.scale, x.data_ptr(), residual.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                      slots.data_ptr(), tables.data_ptr(), lens.data_ptr(), k_cache.shape[0] * k_cache.shape[1])
        if rc == -1:
            raise IndexError(f"a KV slot is past the cache's {k_cache.shape[0] * k_cache.shape[1]} rows: "
                             f"{slots.max().item()}")
        if rc != 0:
            raise RuntimeError(f"the C decode layers failed ({rc}: 1 no memory, -2 the attention "
                               f"kernel, 2 + n a block matmul's code n)")
        return x, residual
