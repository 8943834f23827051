"""Every Triton kernel compiles for an H200 (sm_90), in each specialization the engine launches.

Triton's interpreter, which runs the kernel tests without a GPU, executes the Python of a kernel:
it takes a function whose constexpr branches return different types, and never meets inline PTX.
The GPU compiler refuses the first (an fp8 KV cache's fused rope kernel did, on the H200 only,
2026-12-05). Triton's own ptxas compiles for sm_90 here without a GPU, so these build each
specialization the CPU tests cannot run, and fail with the compiler's message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
from nextok.kernels.triton.gguf_linear import TYPES as GGUF_TYPES  # noqa: E402  ggml type -> (QK, NB, S)

# Runs in a subprocess: tests/conftest.py sets TRITON_INTERPRET=1 for the session, and kernels
# decorated under it are interpreted functions, which do not compile.
COMPILE = r"""
import json, re, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from nextok.kernels.triton import attention, fp8_quant, fused, gemv, gguf_linear, int4_words, quant_linear, w4a16
from nextok.kernels.triton import attention_prefill, w4a16_dot, w4a16_stream
MODULES = {"attention": attention, "attention_prefill": attention_prefill, "fp8_quant": fp8_quant, "fused": fused, "gemv": gemv,
           "gguf_linear": gguf_linear, "int4_words": int4_words, "quant_linear": quant_linear, "w4a16": w4a16,
           "w4a16_dot": w4a16_dot, "w4a16_stream": w4a16_stream}

def build(fn, types, const):
    # constexprs a spec leaves out take their defaults (else they would be runtime integers)
    const = dict({p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const)
    sig = {n: ("constexpr" if n in const else types.get(n, "i32")) for n in fn.arg_names}
    # every pointer and integer 16-aligned, as the launcher marks them on real tensors
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] not in ("constexpr", "fp32") and not sig[n].startswith("tensordesc")}
    return compile(ASTSource(fn, sig, const, attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

out = {}
for name, fn, types, const in json.loads(sys.argv[1]):
    try:
        ptx = build(getattr(MODULES[fn[0]], fn[1]), types, const).asm["ptx"]
        first = lambda s: ptx.find(s) if s in ptx else len(ptx)
        out[name] = {"ok": True, "dp4a": "dp4a.u32.s32" in ptx and "dp4a.u32.u32" in ptx, "local": ".local" in ptx,
                     "load_before_wait": first("ld.global") < first("griddepcontrol.wait"),
                     "v4_loads": "ld.global.v4" in ptx, "cp_async_16": re.search(r"cp\.async\.cg\.shared\.global[^;]*, 0x10", ptx) is not None,
                     "f16_to_f32": "cvt.f32.f16" in ptx, "e4m3x2": "cvt.rn.f16x2.e4m3x2" in ptx,
                     "tma_copies": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                     "bf16_by_hand": "32767" in ptx}
    except Exception as e:
        out[name] = {"ok": False, "error": str(e)[-2000:]}
print(json.dumps(out))
"""

CACHES = {0: "*bf16", 1: "*i8", 2: "*fp8e4nv"}  # QUANT: none, int8, fp8

ATTN = dict(q_ptr="*bf16", bt_ptr="*i32", lens_ptr="*i32", out_ptr="*bf16", mid_o_ptr="*fp32",
            mid_lse_ptr="*fp32", info_ptr="*i32", k_ptr="*bf16", v_ptr="*bf16", slot_ptr="*i64",
            qk_scale="fp32")


def _specs() -> list:
    specs = []
    for fp8 in (False, True):
        cache = CACHES[2 if fp8 else 0]
        specs.append((f"rope fp8={fp8}", ("fused", "_rope_neox_kernel"),
                      dict(qkv_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16", kc_ptr=cache, vc_ptr=cache,
                           slot_ptr="*i64"),
                      dict(HEAD_DIM=128, PAGE=16, STORE=True, FP8=fp8, BLOCK_H=8, BLOCK_D=64, PDL=True)))
    for quant, cache in CACHES.items():
        types = dict(ATTN, kc_ptr=cache, vc_ptr=cache, ks_ptr="*fp32" if quant == 1 else cache,
                     vs_ptr="*fp32" if quant == 1 else cache)
        specs += [
            (f"decode quant={quant}", ("attention", "_decode_split_kernel"), types,
             dict(G=4, D=128, PAGE=16, HAS_WINDOW=False, BLOCK_G=16, BLOCK_D=128, BLOCK_N=64,
                  QUANT=quant, INTERPRET=False, PDL=True)),
            (f"prefill quant={quant}", ("attention_prefill", "_prefill_kernel"), types,
             dict(G=4, D=128, PAGE=16, HAS_WINDOW=True, BLOCK_M=64, BLOCK_D=128, BLOCK_N=64, QUANT=quant,
                  INTERPRET=False)),
            (f"store quant={quant}", ("attention", "_store_kv_kernel"), types,
             dict(KVH=8, D=128, PAGE=16, QUANT=quant, BLOCK_H=8, BLOCK_D=128))]
    for pdl, fp8 in ((False, False), (True, False), (True, True)):  # fp8: quantized for FP8 W8A8
        out = "*fp8e4nv" if fp8 else "*bf16"
        specs.append((f"add_rms_norm pdl={pdl} fp8={fp8}", ("fused", "_add_rms_norm_kernel"),
                      dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16", out_ptr=out,
                           s_ptr="*fp32" if fp8 else out, eps="fp32"),
                      dict(HAS_RESIDUAL=True, FP8=fp8, BLOCK=4096, PDL=pdl)))
        if pdl:
            specs.append((f"silu_mul fp8={fp8}", ("fused", "_silu_mul_kernel"),
                          dict(gu_ptr="*bf16", out_ptr=out, s_ptr="*fp32" if fp8 else out),
                          dict(FP8=fp8, BLOCK=16384 if fp8 else 1024, PDL=True)))
    specs.append(("decode reduce", ("attention", "_decode_reduce_kernel"), ATTN,
                  dict(D=128, BLOCK_S=32, BLOCK_D=128, PDL=True)))
    specs.append(("fp8 row quantizer", ("fp8_quant", "_quant_rows_kernel"),
                  dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32"), dict(BLOCK=4096)))
    for dot in (False, True):
        block_m = 16 if dot else 1
        specs.append((f"gemv dot={dot}", ("gemv", "_gemv_kernel"),
                      dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16"),
                      dict(HAS_BIAS=True, USE_DOT=dot, BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=256, PDL=True,
                           IEEE=False, INTERPRET=False, K_INTERPRET=0)))
        for group, mins in ((0, False), (32, True), (16, False)):  # per row; GGUF Q5_1, Q6_K
            specs.append((f"w8a16 dot={dot} group={group}", ("quant_linear", "_w8a16_kernel"),
                          dict(x_ptr="*bf16", q_ptr="*i8", s_ptr="*fp16", m_ptr="*fp16", b_ptr="*bf16",
                               y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32"),
                          dict(HAS_BIAS=True, DOT=dot, BLOCK_M=block_m, BLOCK_N=64, BK=128, SPLIT=2, PDL=True,
                               IEEE=False, INTERPRET=False, K_INTERPRET=0, GROUP=group, HAS_MIN=mins)))
            if group:  # group order (S_SN 1, as the launcher specializes it), GROUP_TILES' tile
                specs.append((f"w8a16 dot={dot} group={group} group-major", ("quant_linear", "_w8a16_kernel"),
                              dict(x_ptr="*bf16", q_ptr="*i8", s_ptr="*fp16", m_ptr="*fp16", b_ptr="*bf16",
                                   y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32"),
                              dict(HAS_BIAS=True, DOT=dot, BLOCK_M=block_m, BLOCK_N=32, BK=256, SPLIT=2, PDL=True,
                                   IEEE=False, INTERPRET=False, K_INTERPRET=0, GROUP=group, HAS_MIN=mins, S_SN=1)))
        for type_id, (qk, nb, sub) in GGUF_TYPES.items():
            specs.append((f"gguf type={type_id} dot={dot}", ("gguf_linear", "_gguf_linear_kernel"),
                          dict(x_ptr="*bf16", w_ptr="*u8", b_ptr="*bf16", y_ptr="*bf16"),
                          dict(TYPE=type_id, QK=qk, NB=nb, S=sub, HAS_BIAS=True, USE_DOT=dot, IEEE=False,
                               BLOCK_M=block_m, BLOCK_N=32)))
            if not dot:
                specs.append((f"gguf dequantize type={type_id}", ("gguf_linear", "_dequant_kernel"),
                              dict(w_ptr="*u8", out_ptr="*bf16"),
                              dict(TYPE=type_id, QK=qk, NB=nb, S=sub, BLOCK_N=32)))
    for ln, lw, block_m, join, split, pairs, xt in (
            (0, 1, 16, 0, 1, 0, "bf16"), (64, 16, 16, 0, 1, 0, "bf16"), (64, 16, 64, 0, 4, 0, "bf16"),
            (64, 16, 64, 1, 1, 0, "bf16"), (64, 16, 16, 1, 4, 0, "bf16"), (64, 16, 64, 1, 2, 0, "bf16"),
            (64, 16, 64, 1, 2, 1, "bf16"), (64, 16, 16, 1, 1, 1, "bf16"), (64, 16, 64, 1, 4, 1, "fp16")):
        specs.append((f"w4a16 tl.dot kernel tiles={ln}x{lw} BLOCK_M={block_m} JOIN={join} SPLIT={split} "
                      f"PAIRS={pairs} x={xt}", ("w4a16_dot", "_w4a16_dot_kernel"),
                      dict(x_ptr=f"*{xt}", w_ptr="*i32", d_ptr="*fp16", m_ptr="*fp16", b_ptr="*fp16",
                           y_ptr=f"*{xt}", part_ptr="*fp32", count_ptr="*i32"),
                      dict(WPG=16, GT=1 if join else 2, HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=64 if join else 32,
                           PDL=True, IEEE=False, INTERPRET=False, KW_INTERPRET=0, LN=ln, LW=lw,
                           JOIN=join, SPLIT=split, PAIRS=pairs, GROUP_MAJOR=0)))
    # d and m in group order (S_DN 1, as the launcher specializes it; quant/base.py
    # scales_in_order), groups of 32 and 64: in row order's load Triton 3.6 failed here
    # ("Illegal shared layout", a GGUF Q4_K layer at 40 rows on an H100)
    for wpg, pairs in ((4, 1), (4, 0), (8, 1)):
        specs.append((f"w4a16 tl.dot kernel group-major WPG={wpg} PAIRS={pairs}", ("w4a16_dot", "_w4a16_dot_kernel"),
                      dict(x_ptr="*bf16", w_ptr="*i32", d_ptr="*fp16", m_ptr="*fp16", b_ptr="*fp16",
                           y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32"),
                      dict(WPG=wpg, GT=16 // wpg, HAS_BIAS=True, BLOCK_M=64, BLOCK_N=64, PDL=True, IEEE=False,
                           INTERPRET=False, KW_INTERPRET=0, LN=0, LW=1, JOIN=1, SPLIT=2, PAIRS=pairs,
                           GROUP_MAJOR=1, S_DN=1)))
    for ln, lw in ((0, 1), (64, 16)):  # row-major words, and tiled (int4_words.LAYOUT)
        specs.append((f"w4a16 dequantize tiles={ln}x{lw}", ("int4_words", "_dequant_kernel"),
                      dict(w_ptr="*i32", d_ptr="*fp16", m_ptr="*fp16", out_ptr="*bf16"),
                      dict(WPG=16, BLOCK_N=16, BLOCK_W=64, LN=ln, LW=lw)))
    w4 = dict(x_ptr="*bf16", w_ptr="*i32", d_ptr="*fp16", m_ptr="*fp16", b_ptr="*fp16", y_ptr="*bf16",
              part_ptr="*fp32", count_ptr="*i32")
    # xahead 2: XAHEAD with UNROLL
    for block_m, split, silu, ln, gt, depth, xahead in (
            (1, 8, False, 0, 2, 1, 0), (1, 1, False, 0, 2, 1, 0), (8, 4, False, 0, 2, 1, 0),
            (1, 2, True, 0, 2, 1, 0), (1, 8, False, 64, 2, 1, 0), (1, 8, True, 64, 1, 1, 0),
            (4, 4, False, 64, 2, 1, 0), (1, 4, False, 64, 2, 2, 0), (1, 4, True, 64, 2, 2, 0),
            (1, 4, False, 64, 2, 1, 1), (1, 4, True, 64, 2, 2, 1), (8, 4, False, 64, 2, 1, 1),
            (1, 8, False, 64, 2, 2, 1), (1, 4, False, 64, 2, 1, 2), (1, 8, True, 64, 2, 2, 2),
            (1, 8, False, 64, 2, 2, 2), (4, 4, False, 64, 2, 1, 2)):
        # even: whole tiles (N % BLOCK_N, K % TW == 0), W and its scales loaded without masks
        even = bool(ln and xahead)
        specs.append((f"w4a16 dp4a rows={block_m} split={split}{' silu_mul' if silu else ''} "
                      f"tiles={ln} GT={gt} depth={depth} xahead={xahead} even={even}",
                      ("w4a16", "_w4a16_dp4a_kernel"),
                      w4, dict(WPG=16, GT=gt, SPLIT=split, HAS_BIAS=True, SILU_MUL=silu, BLOCK_M=block_m,
                               BLOCK_N=128 // block_m, PDL=True, INTERPRET=False, KW_INTERPRET=0,
                               LN=ln, LW=16 if ln else 1, DEPTH=depth, XAHEAD=xahead > 0, UNROLL=xahead == 2,
                               EVEN=even, XRUN=0, PIPE=0)))
    # XRUN: x's fixed point per run of 4 words, the run's products in dp4a's accumulator
    for block_m, split, silu, gt, xahead in ((1, 8, False, 2, 1), (4, 2, True, 1, 0), (8, 4, False, 1, 1)):
        specs.append((f"w4a16 dp4a rows={block_m} split={split}{' silu_mul' if silu else ''} xrun",
                      ("w4a16", "_w4a16_dp4a_kernel"),
                      w4, dict(WPG=16, GT=gt, SPLIT=split, HAS_BIAS=True, SILU_MUL=silu, BLOCK_M=block_m,
                               BLOCK_N=64, PDL=True, INTERPRET=False, KW_INTERPRET=0, LN=64, LW=16,
                               DEPTH=1, XAHEAD=xahead > 0, UNROLL=False, EVEN=True, XRUN=1, PIPE=0)))
    # PIPE: the loop's loads left to Triton's pipeline
    for block_m, split, silu, pipe, xrun in ((1, 4, False, 3, 0), (1, 8, True, 5, 1), (4, 4, False, 3, 0)):
        specs.append((f"w4a16 dp4a rows={block_m} split={split}{' silu_mul' if silu else ''} pipe={pipe}"
                      f"{' xrun' if xrun else ''}", ("w4a16", "_w4a16_dp4a_kernel"),
                      w4, dict(WPG=16, GT=2, SPLIT=split, HAS_BIAS=True, SILU_MUL=silu, BLOCK_M=block_m,
                               BLOCK_N=128, PDL=True, INTERPRET=False, KW_INTERPRET=0, LN=64, LW=16,
                               DEPTH=1, XAHEAD=False, UNROLL=False, EVEN=True, XRUN=xrun, PIPE=pipe)))
    for silu, xrun, pipe in ((False, 0, 0), (True, 0, 0), (True, 1, 0), (False, 0, 3), (True, 1, 4)):
        specs.append((f"w4a16 dp4a stream silu_mul={silu}{' xrun' if xrun else ''}{f' pipe={pipe}' if pipe else ''}",
                      ("w4a16_stream", "_w4a16_stream_kernel"), w4,
                      dict(WPG=16, GT=2, HAS_BIAS=True, SILU_MUL=silu, BLOCK_N=128, PDL=True,
                           INTERPRET=False, LN=64, LW=16, XRUN=xrun, PIPE=pipe, TMA=0)))
    # TMA: W's words copied by the tensor memory accelerator, in word tiles and row-major
    for silu, xrun, pipe, ln in ((False, 1, 3, 64), (True, 1, 4, 64), (False, 0, 3, 0)):
        desc = "tensordesc<i32[2, 8, 256]>" if ln else "tensordesc<i32[128, 32]>"
        specs.append((f"w4a16 dp4a stream silu_mul={silu}{' xrun' if xrun else ''} pipe={pipe} tma tiles={ln}",
                      ("w4a16_stream", "_w4a16_stream_kernel"), dict(w4, w_desc=desc),
                      dict(WPG=16, GT=2, HAS_BIAS=True, SILU_MUL=silu, BLOCK_N=128, PDL=True,
                           INTERPRET=False, LN=ln, LW=16 if ln else 1, XRUN=xrun, PIPE=pipe, TMA=1)))
    return specs


@pytest.fixture(scope="module")
def built() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(_specs())], capture_output=True, text=True,
                         env=env, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [s[0] for s in _specs()])
def test_compiles_for_sm90(built, name):
    result = built[name]
    assert result["ok"], result.get("error")
    assert not result["local"], "spills to local memory"
    if name.startswith("w4a16 dp4a"):
        assert result["dp4a"], "the dp4a instructions are gone from the PTX"
        if " tma" in name:
            # every step's words in one bulk tensor copy, PIPE - 1 steps ahead: the pipeline
            # kept them (the copies in its prologue and its loop: more than one in the PTX)
            assert result["tma_copies"] >= 2, "W's words are not copied by the tensor memory accelerator"
        elif "pipe=" in name:
            # Triton's pipeline took the loads: 16-byte asynchronous copies into shared memory
            # (a loop without its own num_stages, or loads it cannot take, stay synchronous)
            assert result["cp_async_16"], "the loop's loads are not 16-byte cp.async copies"
        else:
            # the first tile of W is loaded before the PDL wait, while the kernel before finishes
            assert result["load_before_wait"], "no weight load before griddepcontrol.wait"
            # W in 16-byte loads, tiled words too (through // and % the compiler's alignment
            # analysis loses track, and a tiled kernel fell to 4-byte loads, 28 instructions a word)
            assert result["v4_loads"], "the weight loads are not 16-byte vectors"
    if "silu_mul=True" in name or name.startswith("rope"):
        # bfloat16 rounding as one conversion on the GPU (fused.py _round; by hand, ~5
        # instructions a value, only in the interpreter): the silu stream's loop 791 -> 771
        assert not result["bf16_by_hand"], "bfloat16 rounded by hand (+ 0x7FFF) on the GPU"
    if name in ("decode quant=2", "prefill quant=2"):
        # fp8 keys and values go to float16 in one instruction per two and stay there; through
        # float32 to bfloat16 the 64-key decode tile took 944 instructions, not 764 (bf16: 495)
        assert not result["f16_to_f32"], "fp8 cache values converted through float32"
    if name == "decode quant=2":
        # the fp8 rows read as int32 words and converted two values an instruction (e4m3_words)
        assert result["e4m3x2"], "no cvt.rn.f16x2.e4m3x2 in the fp8 decode kernel"
