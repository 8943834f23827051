"""The CUDA wiring of packed GGUF weights (LlamaForCausalLM.use_gguf_device_blocks, GGUFLinear):
a tiny random GGUF model whose matrices use every type the Triton kernel reads gives the same
greedy tokens with its weights kept quantized (Q4_0 / Q4_1 / Q4_K in the W4A16 layout, the rest
in the int8 one; with --gguf-blocks-only the rest as blocks) as with them dequantized
(--no-gguf-blocks).

Without a GPU the engine runs on CPU with the Triton attention backend in Triton's interpreter,
and the runner's CUDA-only switch (`_gguf_on_device`) is turned on for it (cpu_kernels off, so
the CPU's own block path stays out of the way). Float32: the same weights, only the summation
order differs, and the K-quants' sub-block scales and mins are rounded to float16 (2^-11 of each);
on these random weights no greedy choice is that close."""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("triton")

from nextok import LLM, SamplingParams  # noqa: E402
from nextok.kernels.triton.gguf_linear import TYPES  # noqa: E402
from nextok.quant.gguf_cuda import GGUFLinear  # noqa: E402
from nextok.quant.int4 import Int4Linear  # noqa: E402
from nextok.quant.int8 import Int8Linear  # noqa: E402
from nextok.worker.model_runner import ModelRunner  # noqa: E402
from tests.kernels.test_triton_gguf_linear import random_blocks  # noqa: E402

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 256, 512, 4, 2, 100  # K-quants need rows of 256
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14
# per layer: q, k, v, o, gate, up, down. Layer 0 as a *_K_M file (v and down Q6_K: a qkv of two
# types); layer 1 the 32-weight types (q and k Q5_0, v Q8_0, as a *_K_M file of a model whose
# hidden size is not a multiple of 256 stores them) and a gate_up of two K-quants.
LAYER_TYPES = [(Q4_K, Q4_K, Q6_K, Q5_K, Q4_0, Q4_0, Q6_K),
               (Q5_0, Q5_0, Q8_0, Q4_1, Q4_K, Q5_K, Q5_1)]
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _write(path) -> str:
    head_dim = HIDDEN // HEADS
    shapes = {"attn_q": (HEADS * head_dim, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN),
              "attn_v": (KV_HEADS * head_dim, HIDDEN), "attn_output": (HIDDEN, HEADS * head_dim),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, len(LAYER_TYPES)), (w.add_context_length, 256),
                       (w.add_embedding_length, HIDDEN), (w.add_feed_forward_length, FFN),
                       (w.add_head_count, HEADS), (w.add_head_count_kv, KV_HEADS),
                       (w.add_layer_norm_rms_eps, 1e-6), (w.add_vocab_size, VOCAB)):
        add(value)

    def raw(name, rows, cols, qtype, seed):
        if qtype in (Q5_0, Q5_1):  # from zero-mean floats: with random blocks here (Q5_1's
            # w = d * q + m, q >= 0: rows of a large mean) every prompt gave the same tokens
            f = np.random.default_rng(seed).normal(0, 0.05, (rows, cols)).astype(np.float32)
            blocks = gguf.quants.quantize(f, gguf.GGMLQuantizationType(qtype))
        else:
            blocks = random_blocks(qtype, rows, cols, seed)
        w.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType(qtype))

    raw("token_embd.weight", VOCAB, HIDDEN, Q6_K, 0)  # tied: the lm_head reads these blocks
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    for i, types in enumerate(LAYER_TYPES):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32))
        for j, (name, qtype) in enumerate(zip(NAMES, types)):
            raw(f"blk.{i}.{name}.weight", *shapes[name], qtype, 10 * i + j)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, model_path):
    path = _write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    common = dict(model=path, tokenizer=model_path, dtype="float32", device="cpu",
                  attention_backend="triton", cpu_kernels=False, max_num_batched_tokens=24,
                  num_kv_blocks=64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "_gguf_on_device",
                   lambda self: self.config.gguf_blocks and not self.config.quantization)
        return LLM(**common), LLM(gguf_blocks=False, **common), LLM(gguf_dense_copy=False, **common)


def test_weights_stay_packed_one_layer_per_linear(engines):
    packed, dense, blocks = engines
    model = packed.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, GGUFLinear)]
    assert len(layers) == 4 * len(LAYER_TYPES) + 1  # qkv, o, gate_up, down per layer + lm_head
    assert model.layers[0].self_attn.qkv_proj.types == [Q4_K, Q6_K]  # q + k, then v
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.parts["0"], Int4Linear) and isinstance(qkv.parts["1"], Int8Linear)  # q + k; v
    assert isinstance(model.layers[0].mlp.gate_up_proj._whole, Int4Linear)  # Q4_0 gate and up
    assert model.layers[1].self_attn.o_proj.types == [Q4_1] and model.layers[1].self_attn.o_proj._whole
    assert model.layers[1].self_attn.qkv_proj.types == [Q5_0, Q8_0]
    assert model.layers[1].mlp.gate_up_proj.types == [Q4_K, Q5_K]
    assert model.layers[1].mlp.down_proj.types == [Q5_1]
    assert {t for types in LAYER_TYPES for t in types} == set(TYPES)  # every type the kernel reads
    assert model.lm_head.types == [Q6_K] and model.lm_head.out_features == VOCAB
    assert not any(isinstance(p, torch.nn.Parameter) and p.dim() == 2 and p.shape[1] == FFN
                   for p in model.parameters())  # no dense down_proj left
    assert isinstance(model.layers[1].mlp.down_proj._whole, Int8Linear)  # Q5_1: with mins
    assert not any(isinstance(m, GGUFLinear) for m in dense.engine.runner.model.modules())
    # --gguf-blocks-only: Q4_* still int4 (no bigger), the rest keep their blocks
    qkv = blocks.engine.runner.model.layers[0].self_attn.qkv_proj
    assert list(qkv.parts) == ["0"] and qkv.blocks1.dtype == torch.uint8
    assert not any(isinstance(m, Int8Linear) for m in blocks.engine.runner.model.modules())


def test_packed_greedy_tokens_equal_dequantized(engines):
    packed, dense, blocks = engines
    gen = torch.Generator().manual_seed(0)
    # 5 and 37 tokens: a 37-token prompt is prefilled in chunks of 24 rows (the dequantize +
    # matmul path); the decode steps of 1-3 rows run the kernel
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 37, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in dense.generate(prompts, params)]
    for engine in (packed, blocks):
        assert [o.outputs[0].token_ids for o in engine.generate(prompts, params)] == ref
    assert len({tuple(t) for t in ref}) > 1  # not a degenerate model
