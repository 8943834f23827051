"""The C paged-decode kernel == the torch reference (gather + masked SDPA), float32 and bfloat16."""
from __future__ import annotations

import pytest
import torch

from nextok.attention.base import AttentionMetadata
from nextok.attention.torch_ref import _decode, decode_mask
from nextok.kernels.cpu_attention import load_paged_decode, paged_decode, q8_supported

KERNEL = load_paged_decode()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C compiler on this machine")


def reference(q, kc, vc, tables, lens, scale, window):
    bs = kc.shape[1]
    meta = AttentionMetadata(slot_mapping=None, num_decode=q.shape[0], decode_block_tables=tables,
                             decode_context_lens=lens, prefills=[], sliding_window=window,
                             decode_mask=decode_mask(lens, tables.shape[1] * bs, window))
    return _decode(q, kc, vc, meta, scale)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (6, 1, 16)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(heads, kv_heads, head_dim, block_size, window, dtype):
    gen = torch.Generator().manual_seed(heads * 100 + block_size)
    batch = 7
    # up to 400 keys: chunks of 16 keys within a block, several blocks, a partial last one
    lens = torch.tensor([1, 2, 17, 40, 33, 400, 5][:batch], dtype=torch.long)
    max_blocks = -(-int(lens.max()) // block_size)
    num_blocks = batch * max_blocks + 1
    kc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    vc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    # Distinct random blocks per sequence, padded with block 0 past each sequence's end.
    perm = torch.randperm(num_blocks - 1, generator=gen)[:batch * max_blocks] + 1
    tables = perm.view(batch, max_blocks).clone()
    for i, n in enumerate(lens.tolist()):
        tables[i, -(-n // block_size):] = 0
    q = torch.randn(batch, heads, head_dim, generator=gen)
    q, kc, vc = q.to(dtype), kc.to(dtype), vc.to(dtype)
    scale = head_dim ** -0.5
    got = paged_decode(KERNEL, q, kc, vc, tables, lens, scale, window)
    assert got.dtype == dtype
    if dtype == torch.float32:
        want = reference(q, kc, vc, tables, lens, scale, window)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # float32 math on the bf16 values, rounded once at the end: off by one bf16 step at most
        want = reference(q.float(), kc.float(), vc.float(), tables, lens, scale, window).to(dtype)
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-4)
        assert (got != want).float().mean() < 0.01


def test_non_contiguous_query():
    kc = torch.randn(10, 4, 2, 8)
    vc = torch.randn(10, 4, 2, 8)
    q = torch.randn(3, 4, 16)[:, :, ::2]  # strided, as a slice of a fused projection
    tables = torch.tensor([[1, 2], [3, 0], [4, 5]])
    lens = torch.tensor([6, 3, 8])
    torch.testing.assert_close(paged_decode(KERNEL, q, kc, vc, tables, lens, 0.3, None),
                               reference(q, kc, vc, tables, lens, 0.3, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (16, 1, 64)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_rows_equal_each_row_alone(heads, kv_heads, head_dim, block_size, window, dtype):
    """A verify step's rows (one sequence at lengths n, n + 1, ..., sharing its block table: the
    bf16 kernel scores them together on the AMX tile unit where there is one) between rows of
    other sequences: each row's output has the bits it has alone, and matches the reference."""
    gen = torch.Generator().manual_seed(heads + block_size)
    lens_of = [[37], [200 + i for i in range(9)], [5], [63 + i for i in range(3)]]  # 9 rows: > 16 / G
    max_blocks = -(-max(max(s) for s in lens_of) // block_size)
    num_blocks = len(lens_of) * max_blocks + 1
    kc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks - 1, generator=gen)[:len(lens_of) * max_blocks] + 1
    tables = torch.cat([perm[i * max_blocks:(i + 1) * max_blocks].repeat(len(s), 1)
                        for i, s in enumerate(lens_of)])
    lens = torch.tensor([n for s in lens_of for n in s])
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    scale = head_dim ** -0.5
    got = paged_decode(KERNEL, q, kc, vc, tables, lens, scale, window)
    for i in range(len(lens)):
        alone = paged_decode(KERNEL, q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], scale, window)
        assert torch.equal(got[i:i + 1], alone), f"row {i}"
    want = reference(q.float(), kc.float(), vc.float(), tables, lens, scale, window).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-4)
    torch.testing.assert_close(got, want, **tol)


def invariant_output(q, kc, vc, tables, lens, scale, window, rows):
    """The kernel's output, checked to have the same bits at 1 and 2 threads, and for each of
    `rows` alone as in the batch."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = paged_decode(KERNEL, q, kc, vc, tables, lens, scale, window)
        torch.set_num_threads(2)
        got = paged_decode(KERNEL, q, kc, vc, tables, lens, scale, window)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got, one)
    for i in rows:
        alone = paged_decode(KERNEL, q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], scale, window)
        assert torch.equal(got[i:i + 1], alone), f"row {i}"
    return got


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (8, 2, 128), (6, 1, 16)])
@pytest.mark.parametrize("block_size", [1, 16, 24])
@pytest.mark.parametrize("window", [None, 300, 700])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_in_key_spans(heads, kv_heads, head_dim, block_size, window, dtype):
    """Sequences longer than a span of keys (256, in whole blocks) run as one task a span and
    are merged by their log-sum-exps: they match the reference (bfloat16: within one bf16 step,
    the spans' results kept in float32), at 1 or 2 threads and alone or in a batch bit for bit,
    and a window's first key may fall inside any span."""
    gen = torch.Generator().manual_seed(heads * 7 + block_size)
    lens = torch.tensor([1000, 256, 257, 3, 513, 800], dtype=torch.long)
    max_blocks = -(-int(lens.max()) // block_size)
    num_blocks = len(lens) * max_blocks + 1
    kc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    # keys that stand out: spans' maxima far apart, so their weights differ by orders of magnitude
    kc[3] *= 4
    perm = torch.randperm(num_blocks - 1, generator=gen)[:len(lens) * max_blocks] + 1
    tables = perm.view(len(lens), max_blocks).clone()
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    scale = head_dim ** -0.5
    got = invariant_output(q, kc, vc, tables, lens, scale, window, rows=(0, 2, 4))
    want = reference(q.float(), kc.float(), vc.float(), tables, lens, scale, window)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got, want.to(dtype), rtol=2 ** -7, atol=1e-4)
        assert (got != want.to(dtype)).float().mean() < 0.01


@pytest.mark.skipif(KERNEL is None or not q8_supported(KERNEL, 9, 3, 64), reason="no AVX2 int8-cache kernel")
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (8, 2, 128), (4, 4, 32)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_caches_match_the_dequantizing_reference(heads, kv_heads, head_dim, block_size, window, dtype):
    """--kv-cache-dtype int8 (rows of int8 values and their float32 scale): the kernel equals the
    torch path, which dequantizes every row and runs SDPA, to float rounding (bfloat16 q and out:
    one bf16 step); a row's result does not depend on the batch or the thread count."""
    from nextok.attention import kv_quant

    gen = torch.Generator().manual_seed(heads + block_size)
    lens = torch.tensor([1000, 1, 40, 257, 513], dtype=torch.long)
    max_blocks = -(-int(lens.max()) // block_size)
    num_blocks = len(lens) * max_blocks + 1
    kf = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    kf[2] *= 5  # rows of larger range: their own scales
    kc = kv_quant.quantize_rows(kf, torch.int8)
    vc = kv_quant.quantize_rows(torch.randn(kf.shape, generator=gen), torch.int8)
    perm = torch.randperm(num_blocks - 1, generator=gen)[:len(lens) * max_blocks] + 1
    tables = perm.view(len(lens), max_blocks).clone()
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    scale = head_dim ** -0.5
    got = invariant_output(q, kc, vc, tables, lens, scale, window, rows=(0, 3))
    assert got.dtype == dtype
    want = reference(q.float(), kc, vc, tables, lens, scale, window)  # dequantizes the rows
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got, want.to(dtype), rtol=2 ** -7, atol=1e-4)
        assert (got != want.to(dtype)).float().mean() < 0.01


def test_int8_caches_of_other_shapes_are_declined():
    """Shapes without the int8 kernel (head_dim 16, more than 16 query heads a KV head) are
    refused, so the runner keeps them on the torch path."""
    assert not q8_supported(KERNEL, 6, 1, 16)
    assert not q8_supported(KERNEL, 32, 1, 64)
    assert not q8_supported(KERNEL, 9, 2, 64)  # heads not a multiple of the KV heads


# ---- the same source built without AMX, without AVX512_BF16, without AVX-512 -------------------
FALLBACKS = {"no-amx": ["-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"],
             "no-avx512bf16": ["-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8", "-mno-avx512bf16"],
             "avx2": ["-mno-avx512f"]}


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_fallback_builds_match_the_reference(name, tmp_path):
    """The paths CPUs without AMX (vdpbf16ps), without AVX512_BF16 (widened rows) or without
    AVX-512 take for bfloat16 caches: the verify-rows case against the reference, bit for bit
    against each row alone."""
    import ctypes
    import os
    import platform
    import subprocess

    from nextok.kernels import cpu_build

    cc = cpu_build._compiler()
    if platform.machine() not in ("x86_64", "AMD64") or cc is None:
        pytest.skip("an x86-64 C compiler is needed")
    flags = [f for f in cpu_build.FLAGS if not f.startswith("-march")] + ["-march=native", *FALLBACKS[name]]
    out = os.path.join(tmp_path, f"paged_decode_{name}.so")
    proc = subprocess.run([cc, *flags, "-o", out, os.path.join(cpu_build.CSRC, "paged_decode.c"), "-lm"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"{cc} cannot build {name}: {proc.stderr[-300:]}")
    lib = ctypes.CDLL(out)
    fn = lib.paged_decode_bf16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
    fns = {torch.bfloat16: fn}
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    lens = torch.tensor([37, 120, 121, 122, 123, 124, 125, 126, 5])
    max_blocks = -(-int(lens.max()) // block_size)
    kc = torch.randn(3 * max_blocks + 1, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    vc = torch.randn(3 * max_blocks + 1, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    perm = (torch.randperm(3 * max_blocks, generator=gen) + 1).view(3, max_blocks)
    tables = torch.cat([perm[0:1], perm[1:2].repeat(7, 1), perm[2:3]])
    q = torch.randn(len(lens), heads, head_dim, generator=gen).bfloat16()
    got = paged_decode(fns, q, kc, vc, tables, lens, 0.125, None)
    for i in range(len(lens)):
        assert torch.equal(got[i:i + 1], paged_decode(fns, q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], 0.125, None))
    want = reference(q.float(), kc.float(), vc.float(), tables, lens, 0.125, None).bfloat16()
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-4)


def test_avx512_kernel_emulated_matches_the_reference(tmp_path):
    """The AVX-512 kernel's code (one_group_512: float32, and bfloat16 rows widened as CPUs
    without AVX512_BF16 do), built against plain-C stand-ins for its intrinsics
    (tests/kernels/avx512_emulation/immintrin.h): with key spans, windows and the merge, it matches
    the reference and keeps a row's bits alone and in the batch, on machines without AVX-512 too."""
    import ctypes
    import os
    import platform
    import subprocess

    from nextok.kernels import cpu_build

    cc = cpu_build._compiler()
    if platform.machine() not in ("x86_64", "AMD64") or cc is None:
        pytest.skip("an x86-64 C compiler is needed")
    out = os.path.join(tmp_path, "paged_decode_avx512_emulated.so")
    emulation = os.path.join(os.path.dirname(__file__), "avx512_emulation")
    cmd = [cc, "-O1", "-ffp-contract=off", "-march=x86-64", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
           "-D__AVX512F__", "-I", emulation, "-o", out, os.path.join(cpu_build.CSRC, "paged_decode.c"), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lib = ctypes.CDLL(out)
    fns = {}
    for dtype, name in ((torch.float32, "paged_decode_f32"), (torch.bfloat16, "paged_decode_bf16")):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
        fns[dtype] = fn
    for (heads, kv_heads, head_dim), window, dtype in [((9, 3, 64), None, torch.float32), ((8, 4, 128), 300, torch.float32),
                                                       ((9, 3, 64), 300, torch.bfloat16), ((8, 4, 128), None, torch.bfloat16)]:
        gen = torch.Generator().manual_seed(heads + head_dim)
        lens, bs = torch.tensor([600, 3, 257, 40]), 16
        max_blocks = -(-int(lens.max()) // bs)
        kc = torch.randn(len(lens) * max_blocks + 1, bs, kv_heads, head_dim, generator=gen).to(dtype)
        vc = torch.randn(kc.shape, generator=gen).to(dtype)
        tables = (torch.randperm(len(lens) * max_blocks, generator=gen) + 1).view(len(lens), max_blocks)
        q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
        got = paged_decode(fns, q, kc, vc, tables, lens, head_dim ** -0.5, window)
        for i in (0, 2):
            alone = paged_decode(fns, q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], head_dim ** -0.5, window)
            assert torch.equal(got[i:i + 1], alone)
        want = reference(q.float(), kc.float(), vc.float(), tables, lens, head_dim ** -0.5, window)
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(got, want.to(dtype), rtol=2 ** -7, atol=1e-4)
