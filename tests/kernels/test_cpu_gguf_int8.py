"""The GGUF block kernels with int8 activations (gguf_matmul_q8; gguf_kq_matmul_q8 for the
K-quants): equal to a torch reference of the same math, close to the float32
dequantize-then-matmul, and the same on the AVX2-only and portable builds of the sources."""
from __future__ import annotations

import ctypes
import os
import platform
import subprocess

import numpy as np
import pytest
import torch

from nextok.kernels import cpu_build
from nextok.kernels.cpu_gguf_linear import BLOCK_TYPES, ROWS16_TYPES, GGUFBlockLinear, load_gguf_matmul
from tests.kernels.test_cpu_gguf_linear import ALL_TYPES, dequantized, random_blocks

pytestmark = pytest.mark.skipif(load_gguf_matmul("int8") is None, reason="no C compiler to build the kernel")


def int8_reference(x: torch.Tensor, blocks: np.ndarray, type_id: int, n: int, k: int) -> torch.Tensor:
    """llama.cpp's Q8 activations in torch. x [M, K] float32 -> [M, N] float64: per 32 values
    d_x = max|x| / 127, q_x = round(x * (1 / d_x)); per block d_w d_x (q_w . q_x) (+ m_w d_x sum q_x)."""
    nb = k // 32
    xb = x.view(x.shape[0], nb, 32)
    d = xb.abs().amax(-1) / 127
    q = torch.round(xb * torch.where(d != 0, 1.0 / d, torch.zeros_like(d))[..., None])
    s = d * q.sum(-1)  # float32, as the kernel keeps it
    raw = torch.from_numpy(blocks.reshape(n, nb, -1).copy())
    dw = raw[..., 0:2].contiguous().view(torch.float16).float()[..., 0]  # [N, nb]
    if type_id == 3:
        mw = raw[..., 2:4].contiguous().view(torch.float16).float()[..., 0]
        nib = raw[..., 4:20].long()
        qw = torch.cat([nib & 15, nib >> 4], -1)  # low nibbles are weights 0..15
    else:
        mw = torch.zeros_like(dw)
        qw = raw[..., 2:34].view(torch.int8).long()
    dot = torch.einsum("mbj,nbj->mnb", q.double(), qw.double())  # exact integers
    scale = (dw[None] * d[:, None]).double()  # d_w * d_x rounded to float32, as in the kernel
    return (dot * scale).sum(-1) + (mw[None].double() * s[:, None].double()).sum(-1)


def rounded_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels see it: per 32 values d_x * q_x (llama.cpp's Q8 activations)."""
    xb = x.view(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xb * torch.where(d != 0, 1.0 / d, torch.zeros_like(d))) * d).view_as(x)


def any_type_reference(x: torch.Tensor, blocks: np.ndarray, type_id: int, n: int, k: int) -> torch.Tensor:
    """For every format, the integer dot products and per-block (per 16 for the K-quants) scales
    add up to the exact weights times the rounded activations: [M, N] float64."""
    return rounded_activations(x).double() @ dequantized(blocks, type_id, n, k).double().T


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0, 32:64] = 0.0  # an all-zero block: d_x = 0
    x[-1, :32] = torch.arange(32) * 0.5  # ties to round: q = 0, 1, ... * 127 / 15.5
    return x


def assert_matches_reference(y: torch.Tensor, ref: torch.Tensor):
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err < 1e-5, f"max error {err:.2e} of the largest output"


@pytest.mark.parametrize("type_id", [3, 8])
@pytest.mark.parametrize("k", [576, 1536, 96])  # 96: an odd number of blocks (no 512-bit pairs)
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16, 32])
def test_int8_kernel_matches_torch_reference(type_id, k, rows):
    n = 97  # odd: the two threads' shares differ
    blocks = random_blocks(type_id, n, k, seed=k + rows)
    x = activations(rows, k, seed=rows)
    y = GGUFBlockLinear(blocks, type_id, n, k, activations="int8")(x)
    assert_matches_reference(y, int8_reference(x, blocks, type_id, n, k))


@pytest.mark.parametrize("type_id", ALL_TYPES)
@pytest.mark.parametrize("rows", [1, 2, 8, 9])
def test_every_types_int8_kernel_is_the_exact_weights_times_the_rounded_activations(type_id, rows):
    n, k = 97, 1536
    blocks = random_blocks(type_id, n, k, seed=rows + type_id)
    x = activations(rows, k, seed=rows)
    y = GGUFBlockLinear(blocks, type_id, n, k, activations="int8")(x)
    assert_matches_reference(y, any_type_reference(x, blocks, type_id, n, k))


@pytest.mark.parametrize("type_id", ALL_TYPES)
@pytest.mark.parametrize("rows", [1, 8])
def test_int8_kernel_is_close_to_float32_matmul(type_id, rows):
    """The int8 activations' rounding: ~0.6% of the output's norm on Gaussian activations (each
    value is off by up to half a step of max|x| / 127)."""
    n, k = 300, 1536
    blocks = random_blocks(type_id, n, k, seed=3)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(n)
    y = GGUFBlockLinear(blocks, type_id, n, k, bias=bias, activations="int8")(x)
    ref = x.double() @ dequantized(blocks, type_id, n, k).double().T + bias.double()
    assert (y.double() - ref).norm() / (ref - bias.double()).norm() < 1e-2


def test_activation_modes():
    blocks = random_blocks(3, 4, 64, seed=0)
    assert GGUFBlockLinear(blocks, 3, 4, 64).activations == "float32"  # the default
    assert GGUFBlockLinear(blocks, 3, 4, 64, activations="int8").activations == "int8"
    with pytest.raises(ValueError, match="int8, float32"):
        GGUFBlockLinear(blocks, 3, 4, 64, activations="int4")


# ---- the same source built for older CPUs --------------------------------------------------
RESTRICTED = {  # name -> (extra flags, the gguf_q8_path() it must report)
    "avxvnni": (["-march=native", "-mno-avx512f"], 2),
    "avx2": (["-march=native", "-mno-avx512f", "-mno-avxvnni"], 1),
    "portable": (["-march=x86-64"], 0),
}


def build_restricted(name: str, tmp_path, source: str = "gguf_matmul") -> ctypes.CDLL:
    cc = cpu_build._compiler()
    if platform.machine() not in ("x86_64", "AMD64") or cc is None:
        pytest.skip("an x86-64 C compiler is needed")
    need = {"avx2": "avx2", "avxvnni": "avx_vnni"}.get(name)
    if need and need not in open("/proc/cpuinfo").read().split():
        pytest.skip(f"the CPU has no {need}")
    flags = [f for f in cpu_build.FLAGS if not f.startswith("-march")] + RESTRICTED[name][0]
    out = os.path.join(tmp_path, f"{source}_{name}.so")
    src = os.path.join(cpu_build.CSRC, source + ".c")
    proc = subprocess.run([cc, *flags, "-o", out, src, "-lm"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"{cc} cannot build for {name}: {proc.stderr[-300:]}")
    lib = ctypes.CDLL(out)
    for fn in ("gguf_matmul_q8", "gguf_kq_matmul_q8"):
        if hasattr(lib, fn):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return lib


@pytest.mark.parametrize("name", list(RESTRICTED))
def test_restricted_builds_match_the_reference(name, tmp_path):
    lib = build_restricted(name, tmp_path)
    assert lib.gguf_q8_path() == RESTRICTED[name][1]
    for type_id in (3, 8):
        for rows in (1, 3, 9):
            n, k = 37, 576
            blocks = random_blocks(type_id, n, k, seed=rows)
            x = activations(rows, k, seed=rows)
            w = torch.from_numpy(blocks.copy())
            y = torch.empty(rows, n)
            assert lib.gguf_matmul_q8(x.data_ptr(), rows, k, w.data_ptr(), type_id, n, y.data_ptr(), 2) == 0
            assert_matches_reference(y, int8_reference(x, blocks, type_id, n, k))


@pytest.mark.parametrize("name", list(RESTRICTED))
def test_restricted_builds_of_every_type(name, tmp_path):
    """Q4_0 and Q5_0 / Q5_1 (gguf_matmul.c) and the K-quants (gguf_unpacked.c) on the AVX2-only
    and portable builds: the same sums as the native one."""
    libs = {"gguf_matmul": build_restricted(name, tmp_path),
            "gguf_unpacked": build_restricted(name, tmp_path, "gguf_unpacked")}
    for type_id in (2, 6, 7, 12, 13, 14):
        source = BLOCK_TYPES[type_id][2]
        fn = getattr(libs[source], "gguf_matmul_q8" if source == "gguf_matmul" else "gguf_kq_matmul_q8")
        for rows in (1, 3, 9):
            n, k = 37, 512
            blocks = random_blocks(type_id, n, k, seed=rows)
            x = activations(rows, k, seed=rows)
            w = torch.from_numpy(blocks.copy())
            y = torch.empty(rows, n)
            assert fn(x.data_ptr(), rows, k, w.data_ptr(), type_id, n, y.data_ptr(), 2) == 0
            assert_matches_reference(y, any_type_reference(x, blocks, type_id, n, k))


@pytest.mark.parametrize("name", list(RESTRICTED))
def test_restricted_builds_of_the_float32_kernels(name, tmp_path):
    """The float32 kernels' AVX2 (8-wide) and portable code, which an AVX-512 machine never runs
    natively: the loader's exact weights (one-hot rows), and a row independent of the others."""
    libs = {"gguf_matmul": build_restricted(name, tmp_path),
            "gguf_unpacked": build_restricted(name, tmp_path, "gguf_unpacked")}
    for type_id in ALL_TYPES:
        source = BLOCK_TYPES[type_id][2]
        fn = getattr(libs[source], "gguf_matmul_f32" if source == "gguf_matmul" else "gguf_kq_matmul_f32")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        n, k = 19, 512
        blocks = random_blocks(type_id, n, k, seed=type_id)
        w = torch.from_numpy(blocks.copy())

        def run(x):
            y = torch.empty(x.shape[0], n)
            assert fn(x.data_ptr(), x.shape[0], k, w.data_ptr(), type_id, n, y.data_ptr(), 2) == 0
            return y

        eye = torch.eye(k)
        got = torch.cat([run(eye[i:i + 8].contiguous()) for i in range(0, k, 8)])
        assert torch.equal(got, dequantized(blocks, type_id, n, k).T.contiguous()), type_id
        x = torch.randn(7, k, generator=torch.Generator().manual_seed(type_id))
        y = run(x)
        assert all(torch.equal(run(x[i:i + 1].contiguous()), y[i:i + 1]) for i in range(7)), type_id


# ---- every type regrouped 16 rows at a time (csrc/gguf_rows16.c) ---------------------------
def _rows16_or_skip():
    from nextok.kernels.cpu_gguf_linear import _rows16

    if _rows16() is None:
        pytest.skip("no AVX2: the int8 layers keep the one-row-at-a-time kernel")


def _k_of(type_id: int, k32: int = 576) -> int:
    """A row length for the type: k32 for the 32-weight blocks, 3 super-blocks for the K-quants."""
    return k32 if BLOCK_TYPES[type_id][0] == 32 else 768


@pytest.mark.parametrize("type_id", ROWS16_TYPES)
@pytest.mark.parametrize("n", [37, 64])  # 37: a last group of 5 rows, padded
def test_rows16_layers_keep_the_weights_and_the_old_kernels_sums(type_id, n):
    """The regrouped blocks dequantize to the loader's weights bit for bit, and the kernel gives
    the row-at-a-time kernel's results (gguf_matmul_q8, gguf_kq_matmul_q8: the same integer dots
    and scales, summed in another order)."""
    _rows16_or_skip()
    k = _k_of(type_id)
    blocks = random_blocks(type_id, n, k, seed=n + type_id)
    layer = GGUFBlockLinear(blocks, type_id, n, k, activations="int8")
    assert layer.segments[0].rows16 and layer.dense_max_rows == 48 and layer.bf16_dense_max_rows == 32
    assert torch.equal(layer.dequantize(), GGUFBlockLinear(blocks, type_id, n, k).dequantize())
    old = load_gguf_matmul("int8", type_id)
    w = torch.from_numpy(blocks.copy())
    for rows in (1, 5, 16, 19):
        x = activations(rows, k, seed=rows)
        y_old = torch.empty(rows, n)
        assert old(x.data_ptr(), rows, k, w.data_ptr(), type_id, n, y_old.data_ptr(), 2) == 0
        y = layer(x)
        assert (y - y_old).abs().max() <= 1e-5 * y_old.abs().max()


@pytest.mark.parametrize("type_id", ROWS16_TYPES)
def test_rows16_a_row_gives_the_same_result_in_any_batch(type_id):
    """Speculation's verify rows and batched decoding must equal one row alone, bit for bit."""
    _rows16_or_skip()
    n, k = 45, 1536
    layer = GGUFBlockLinear(random_blocks(type_id, n, k, seed=7), type_id, n, k, activations="int8")
    x = torch.randn(21, k, generator=torch.Generator().manual_seed(8))
    batch = layer(x)
    assert all(torch.equal(layer(x[i:i + 1]), batch[i:i + 1]) for i in range(21))
    assert torch.equal(layer(x[3:11]), batch[3:11])


@pytest.mark.parametrize("name", ["avx2", "portable"])
def test_rows16_builds_without_avx512_vnni(name, tmp_path):
    """AVX2 without VNNI runs the regrouped kernel too (csrc/gguf_rows16_avx2.h), with this
    machine's build's results bit for bit (AVX-512 VNNI's where it has it), float32 and bfloat16;
    a portable build says it has no kernel (the layers then keep the blocks as they are). Both
    regroup and dequantize in plain C."""
    from nextok.kernels.cpu_gguf_linear import _rows16

    lib = build_restricted(name, tmp_path, "gguf_rows16")
    assert lib.gguf_rows16_ready() == (1 if name == "avx2" else 0)
    lib.gguf_rows16_packed_bytes.restype = ctypes.c_long
    for type_id in ROWS16_TYPES:
        n, k = 21, _k_of(type_id, 128)
        blocks = random_blocks(type_id, n, k, seed=type_id)
        size = lib.gguf_rows16_packed_bytes(type_id, n, k)
        per_block, nbytes, _ = BLOCK_TYPES[type_id]
        assert nbytes * 32 * k // per_block <= size <= 1.03 * nbytes * 32 * k // per_block  # 2 groups
        packed = torch.empty(size, dtype=torch.uint8)
        w = torch.from_numpy(blocks.copy())
        assert lib.gguf_rows16_pack(ctypes.c_void_p(w.data_ptr()), type_id, n, k, ctypes.c_void_p(packed.data_ptr())) == 0
        out = torch.empty(n, k)
        assert lib.gguf_rows16_dequant_f32(ctypes.c_void_p(packed.data_ptr()), type_id, n, k,
                                           ctypes.c_void_p(out.data_ptr()), 2) == 0
        assert torch.equal(out, dequantized(blocks, type_id, n, k))
    if name == "avx2":
        _assert_rows16_build_equals_native(lib)


def _assert_rows16_build_equals_native(lib: ctypes.CDLL) -> None:
    """Another build of csrc/gguf_rows16.c gives this machine's build's results bit for bit, on
    every type, float32 and bfloat16 x, for several row counts and group tails."""
    from nextok.kernels.cpu_gguf_linear import _rows16

    native = _rows16()
    assert native is not None  # this machine has AVX2 at least (the callers skip otherwise)
    for fn in (lib.gguf_rows16_matmul_q8, lib.gguf_rows16_matmul_q8_bf16):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    for type_id, n, k, rows in ((3, 37, 576, 1), (2, 45, 1536, 6), (8, 21, 128, 9), (3, 16, 64, 4), (6, 19, 576, 5),
                                (7, 16, 96, 1), (12, 37, 768, 3), (13, 21, 512, 4), (14, 45, 1536, 2), (14, 16, 256, 7),
                                (12, 16, 256, 17), (6, 3, 64, 2)):
        layer = GGUFBlockLinear(random_blocks(type_id, n, k, seed=n), type_id, n, k, activations="int8")
        ptr = layer.segments[0].ptr
        x = activations(rows, k, seed=rows) * 4
        for dtype, fn, key in ((torch.float32, lib.gguf_rows16_matmul_q8, "matmul"),
                               (torch.bfloat16, lib.gguf_rows16_matmul_q8_bf16, "matmul_bf16")):
            xd = x.to(dtype)
            want, got = torch.empty(rows, n, dtype=dtype), torch.full((rows, n), 7.0, dtype=dtype)
            assert native[key](xd.data_ptr(), rows, k, ptr, type_id, n, want.data_ptr(), 2) == 0
            assert fn(xd.data_ptr(), rows, k, ptr, type_id, n, got.data_ptr(), 2) == 0
            assert torch.equal(got, want), (type_id, rows, dtype)


def test_rows16_avx512_kernel_emulated_equals_the_native_build(tmp_path):
    """The AVX-512 VNNI kernel's code, built against plain-C stand-ins for its intrinsics
    (tests/kernels/avx512_emulation/immintrin.h), gives this machine's results bit for bit: on an
    AVX2 machine that checks the AVX-512 code CI may meet on another machine (and the two
    kernels' promise of equal results); on an AVX-512 one, the stand-ins against the hardware."""
    from nextok.kernels.cpu_gguf_linear import _rows16

    cc = cpu_build._compiler()
    if platform.machine() not in ("x86_64", "AMD64") or cc is None or _rows16() is None:
        pytest.skip("an x86-64 C compiler and an AVX2 machine are needed")
    out = os.path.join(tmp_path, "gguf_rows16_avx512_emulated.so")
    emulation = os.path.join(os.path.dirname(__file__), "avx512_emulation")
    cmd = [cc, "-O1", "-ffp-contract=off", "-march=x86-64", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
           "-D__AVX512F__", "-D__AVX512BW__", "-D__AVX512VNNI__", "-I", emulation, "-o", out,
           os.path.join(cpu_build.CSRC, "gguf_rows16.c"), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lib = ctypes.CDLL(out)
    assert lib.gguf_rows16_ready() == 3  # the AVX-512 branch was compiled
    _assert_rows16_build_equals_native(lib)


@pytest.mark.parametrize("type_id", ROWS16_TYPES)
def test_rows16_bfloat16_call_equals_converting_around_the_float32_one(type_id):
    """A bfloat16 model's blocks take bf16 x and give bf16 y in one call: bit for bit what
    x.float() -> the float32 call -> .to(bfloat16) gives."""
    _rows16_or_skip()
    n, k = 37, _k_of(type_id)
    layer = GGUFBlockLinear(random_blocks(type_id, n, k, seed=11), type_id, n, k, activations="int8")
    call = layer.bf16_call()
    assert call is not None
    x = (torch.randn(13, k, generator=torch.Generator().manual_seed(12)) * 3).bfloat16()
    want = layer(x.float()).bfloat16()
    assert torch.equal(call(x), want)
    assert torch.equal(call(x[4:5]), want[4:5])
    biased = GGUFBlockLinear(random_blocks(type_id, n, k, seed=11), type_id, n, k, bias=torch.ones(n),
                             activations="int8")
    assert biased.bf16_call() is None  # the bias is added in float32: the converting path
    # a matrix of two types (a *_K_M file's qkv): one call a part, into its columns
    other = 8 if type_id != 8 else 2
    two = GGUFBlockLinear.of_parts([(type_id, random_blocks(type_id, n, k, seed=13), n),
                                    (other, random_blocks(other, 21, k, seed=14), 21)], k, activations="int8")
    assert torch.equal(two.bf16_call()(x), two(x.float()).bfloat16())
