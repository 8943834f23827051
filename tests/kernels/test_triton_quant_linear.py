"""The W4A16 and W8A16 Triton kernels (kernels/triton/w4a16.py, quant_linear.py) equal
dequantize-then-matmul.

On CUDA at Llama-3.1-8B / Qwen2.5 layer shapes; without a GPU in Triton's interpreter on small
ones. The torch path rounds the dequantized 4-bit weight to x's dtype before the product; the
dp4a kernel (1 to DP4A_ROWS rows) multiplies it unrounded, with x in 16-bit fixed point per word
of 8 columns (scale 2^(E - 13), E the exponent of the word's largest |x|) for the d q part of
W = d q + m and x itself for the m part: in float32 that, within float32's tolerance. The tl.dot path rounds
the weight as torch does.
"""
from __future__ import annotations

import zlib

import pytest
import torch

triton = pytest.importorskip("triton")
from nextok.kernels.triton.quant_linear import MAX_ROWS, w8a16  # noqa: E402
from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton import w4a16 as w4a16_mod  # noqa: E402
from nextok.kernels.triton.w4a16 import w4a16  # noqa: E402
from nextok.kernels.triton.w4a16_tiles import DP4A_ROWS  # noqa: E402
from nextok.quant.int4 import (Int4Linear, dequantize_groups, pack_nibbles, pack_words,  # noqa: E402
                               quantize_groups, unpack_nibbles, unpack_words)
from nextok.quant.int8 import Int8Linear, dequantize, quantize_per_channel  # noqa: E402
from nextok.quant.base import scales_in_order  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = ([(6144, 4096, 128), (4096, 14336, 128), (1536, 8960, 64), (28672, 4096, 128), (896, 4864, 32)]
          if CUDA else [(40, 192, 64), (24, 96, 32), (20, 320, 32)])
ROWS = [1, 3, 5, 16]
W4_ROWS = ROWS + [40]  # 40: tl.dot in blocks of rows (the interpreter: 16 a block)
if CUDA:
    W4_ROWS += [100, 256]  # tl.dot's row classes "128" and "256" (blocks of 128 rows on an H100)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def _data(dtype, n, k, rows):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, n, k, rows)).encode()))
    w = torch.randn(n, k, generator=gen) * k ** -0.5
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)
    return w, x, (torch.randn(n, generator=gen) * 0.1).to(DEVICE, dtype)


def _fixed_point(x: torch.Tensor, cols: int = 8) -> torch.Tensor:
    """x as the dp4a kernel reads it: per 8 columns (XRUN: 32), round(x / s) * s with
    s = 2^(E - 13)."""
    words = x.float().reshape(x.shape[0], -1, cols)
    _, e = torch.frexp(words.abs().amax(-1, keepdim=True).clamp_min(1e-30))  # amax = m 2^e, m in [0.5, 1)
    s = torch.ldexp(torch.ones_like(words), e - 14)
    return (torch.round(words / s) * s).reshape(x.shape).to(x.dtype)


def test_fixed_point_keeps_bfloat16_words_exact():
    """Elements of a bfloat16 word within 2^6 of its largest are exact; the rest are off by at
    most half a step, 2^(E - 14)."""
    x = torch.randn(16, 64).to(torch.bfloat16)
    x[0, 3] = 1e-4
    fixed = _fixed_point(x).float().reshape(16, 8, 8)
    words = x.float().reshape(16, 8, 8)
    _, e = torch.frexp(words.abs().amax(-1, keepdim=True))
    big = words.abs() >= torch.ldexp(torch.ones_like(words), e - 7)  # |x| >= 2^(E - 6), E = e - 1
    assert (~big).any() and big.sum() > big.numel() // 2
    assert torch.equal(fixed[big], words[big])
    assert ((fixed - words).abs() <= torch.ldexp(torch.ones_like(words), e - 15)).all()


def _close(actual, expected):
    rtol, atol = TOL[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def test_nibbles_round_trip_in_q4_1_order():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = pack_nibbles(q)
    assert packed.shape == (3, 32)
    assert torch.equal(packed[:, 0], q[:, 0] | (q[:, 16] << 4))  # byte j: columns j and j + 16
    assert torch.equal(packed[:, 16], q[:, 32] | (q[:, 48] << 4))
    assert torch.equal(unpack_nibbles(packed), q)


def test_words_round_trip_in_column_order():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    q[0, 7] = 15  # the top nibble of a word: the int32 is negative
    words = pack_words(q)
    assert words.shape == (3, 8) and words.dtype == torch.int32
    assert words[0, 0].item() < 0
    assert int(words[1, 2]) & 0xF == q[1, 16] and (int(words[1, 2]) >> 4) & 0xF == q[1, 17]
    assert torch.equal(unpack_words(words), q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] + ([] if CUDA else [torch.float32]))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", W4_ROWS)
def test_w4a16(dtype, shape, rows):
    from nextok.kernels.triton import w4a16_tiles

    n, k, group = shape
    w, x, b = _data(dtype, n, k, rows)
    x[:, 8:16] = 0  # a word of zeros: its fixed-point scale is of 1e-30
    q, d, m = quantize_groups(w, group)
    dot, cfg = w4a16_tiles.config(rows, n, k, group, torch.device(DEVICE))
    # Int4Linear's torch path; under PAIRS (a GPU's tiles) d and m rounded to x's dtype first
    dm = (d.to(dtype), m.to(dtype)) if dot and cfg["PAIRS"] else (d, m)
    deq = dequantize_groups(q, *dm).to(DEVICE, dtype)
    args = (pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE))
    want = torch.nn.functional.linear(x, deq)
    if rows <= DP4A_ROWS and dtype == torch.float32:
        dq = dequantize_groups(q, d, torch.zeros_like(m)).to(DEVICE, dtype)
        want = torch.nn.functional.linear(_fixed_point(x), dq) + torch.nn.functional.linear(x, deq - dq)
    _close(w4a16(x, *args, b), want + b)
    _close(w4a16(x, *args), want)


# Int4Linear's tiled words on CUDA (kernels/triton/int4_words.py LAYOUT); the interpreter's small
# shapes and tiles (TW = 8 words) take tiles of 4 x 4
TILES = words4.LAYOUT if CUDA else (4, 4)


def test_tiled_words_round_trip_and_each_tile_is_contiguous():
    words = torch.arange(8 * 12, dtype=torch.int32).view(8, 12)  # word j of row n: 12 n + j
    tiled = words4.tile_words(words, (4, 4))
    assert tiled.shape == words.shape
    first = tiled.flatten()[:16].view(4, 4)  # rows 0-3, words 0-3
    assert torch.equal(first, words[:4, :4])
    assert torch.equal(tiled.flatten()[16:32].view(4, 4), words[:4, 4:8])  # next along K
    assert torch.equal(words4.untile_words(tiled, (4, 4)), words)
    assert words4.can_tile(8, 12, (4, 4)) and not words4.can_tile(8, 10, (4, 4))


@pytest.mark.parametrize("shape,tiles", [(s, t) for s in SHAPES for t in ([TILES] if CUDA else [TILES, (4, 8)])
                                         if words4.can_tile(s[0], s[1] // 8, t)], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_w4a16_on_tiled_words_equals_row_major(shape, tiles, rows):
    """The same products from words in contiguous tiles as from row-major words, bit for bit,
    in both kernels (dp4a for 1-8 rows, tl.dot above), and the one-pass dequantize. (The
    interpreter's tiles read 8 words a row: (4, 8) tiles are one a tile, (4, 4) two.)"""
    n, k, group = shape
    w, x, b = _data(torch.bfloat16, n, k, rows)
    q, d, m = quantize_groups(w, group)
    words, d, m = pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    tiled = words4.tile_words(words, tiles)
    assert torch.equal(w4a16(x, tiled, d, m, b, layout=tiles), w4a16(x, words, d, m, b))
    assert torch.equal(words4.dequantize(tiled, d, m, torch.bfloat16, layout=tiles),
                       words4.dequantize(words, d, m, torch.bfloat16))
    with pytest.raises(ValueError, match="tiles of"):
        w4a16(x, tiled, d, m, layout=(n + 1, tiles[1]))


def test_untuned_shapes_split_k_by_their_number_of_tiles():
    """A GPU or shape without a tuned table: one row in tiles of 128 rows with K split 8 ways
    below 128 tiles, else 4, never into pieces under one tile of words."""
    from nextok.kernels.triton.w4a16_tiles import _default_tile

    assert _default_tile("1", 6144, 4096)["SPLIT"] == 8  # 48 tiles
    assert _default_tile("1", 4096, 14336)["SPLIT"] == 8
    assert _default_tile("1", 28672, 4096)["SPLIT"] == 4  # 224 tiles
    assert _default_tile("1", 4096, 512)["SPLIT"] == 2  # 64 words a row: two pieces of 32
    assert _default_tile("1", 4096, 128)["SPLIT"] == 1
    assert _default_tile("8", 4096, 4096)["BLOCK_M"] == 8


def test_committed_tile_tables_are_well_formed():
    """Every tuned table (kernels/triton/configs, written by benchmarks/gpu/w4a16_probe.py and
    w8a16_probe.py): shapes "NxK"; W4A16's row classes 1/4/8 (dp4a, or "dot") and 16-256
    (tl.dot), tiles the kernels take on tiled words; W8A16's row classes and whole tiles."""
    import glob
    import json
    import os

    from nextok.kernels.triton import tile_tables, w4a16_tiles, w8a16_tiles

    for path in glob.glob(os.path.join(tile_tables.CONFIG_DIR, "w8a16_*.json")):  # W8A16's: per row class
        with open(path) as f:
            for shape, entry in json.load(f).items():
                assert len(shape.split("x")) == 2 and set(entry) <= set(w8a16_tiles.ROW_CLASSES), path
                for tile in entry.values():
                    assert set(tile) == {"DOT", "BLOCK_M", "BLOCK_N", "BK", "num_warps", "num_stages", "SPLIT"}, path
                    assert tile["DOT"] in (0, 1) and tile["BLOCK_M"] in ((16, 32, 64, 128) if tile["DOT"] else (1,)), path
                    assert tile["SPLIT"] in (1, 2, 4, 8), path
    paths = glob.glob(os.path.join(tile_tables.CONFIG_DIR, "w4a16_*.json"))
    assert any(p.endswith("w4a16_h200.json") for p in paths)
    for path in paths:
        with open(path) as f:
            table = json.load(f)
        for shape, entry in table.items():
            n, k = (int(v) for v in shape.split("x"))
            assert set(entry) <= {"1", "4", "8", *w4a16_tiles.DOT_CLASSES}, path
            for cls, tile in entry.items():
                if tile.get("dot"):
                    assert cls == "8", path
                    continue
                assert tile["TW"] % words4.LAYOUT[1] == 0 and tile["BLOCK_N"] in (16, 32, 64, 128, 256), (path, shape)
                if cls in w4a16_tiles.DOT_CLASSES:  # tl.dot's rows a program, split of K, PAIRS (with JOIN)
                    assert tile.get("BLOCK_M", 16) in (16, 32, 64, 128), (path, shape)
                    assert tile.get("SPLIT", 1) in (1, 2, 4, 8, 16), (path, shape)
                    assert tile.get("JOIN", 0) in (0, 1) and tile.get("PAIRS", 0) in (0, tile.get("JOIN", 0)), (path, shape)
                else:
                    assert tile["BLOCK_M"] == int(cls) and tile["SPLIT"] in (1, 2, 4, 8, 16), (path, shape)
                    assert tile.get("DEPTH", 1) in (1, 2) and tile.get("XAHEAD", 0) in (0, 1), (path, shape)
                    assert tile.get("XRUN", 0) in (0, 1) and tile.get("PIPE", 0) in (0, 2, 3, 4, 5, 6), (path, shape)
                    assert tile.get("UNROLL", 0) in (0, tile.get("XAHEAD", 0)), (path, shape)  # needs XAHEAD
                    assert tile.get("maxnreg", 128) in (64, 96, 128, 168, 255), (path, shape)
                    assert cls == "1" or "STREAM" not in tile, (path, shape)  # one row only
                    assert isinstance(tile.get("STREAM", 0), int) and tile.get("STREAM", 0) >= 0, (path, shape)
                    # the stream kernel takes no register cap: a table naming one for it would not
                    # say what ran (the H100's stream tiles were timed without one)
                    assert not (tile.get("STREAM") and "maxnreg" in tile), (path, shape)
                    # TMA: the stream's PIPE loop only
                    assert tile.get("TMA", 0) in (0, 1), (path, shape)
                    assert not tile.get("TMA") or (tile.get("STREAM") and tile.get("PIPE")), (path, shape)


def test_register_caps_reach_split_k_tiles_only():
    """A tile's maxnreg caps ptxas's registers for the split-K dp4a kernel; the stream kernel's
    launch takes no cap, so a stream tile leaves it out rather than carry one that never ran."""
    from nextok.kernels.triton import w4a16_tiles

    tile = dict(BLOCK_N=128, TW=32, num_warps=4, num_stages=3, SPLIT=4, BLOCK_M=1, XAHEAD=1, maxnreg=128)
    assert w4a16_tiles._tile(tile, 1, False, 16)["maxnreg"] == 128
    stream = w4a16_tiles._tile(dict(tile, SPLIT=1, STREAM=396), 1, False, 16)
    assert stream["STREAM"] == 396 and "maxnreg" not in stream


@pytest.mark.parametrize("ahead", [dict(DEPTH=2), dict(XAHEAD=1), dict(DEPTH=2, XAHEAD=1),
                                   dict(XAHEAD=1, UNROLL=1), dict(DEPTH=2, XAHEAD=1, UNROLL=1),
                                   dict(PIPE=3)], ids=str)
@pytest.mark.parametrize("rows", [1, 5])
def test_w4a16_loading_tiles_ahead_gives_the_same_products(monkeypatch, rows, ahead):
    """DEPTH 2 (the one-to-eight-row kernel loads W two tiles ahead), XAHEAD (x's tiles one
    ahead too), UNROLL (DEPTH + 1 tiles a turn in buffers of their own) and PIPE (Triton's
    pipeline of the loop's loads) change when things are loaded, not what is added:
    bit-identical to none, on tiled and row-major words, and with silu(gate) * up taken in."""
    from nextok.kernels.triton import w4a16_tiles

    n, k, group = SHAPES[0]
    w, x, b = _data(torch.bfloat16, n, k, rows)
    gate_up = torch.randn(rows, 2 * k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, torch.bfloat16)
    q, d, m = quantize_groups(w, group)
    words, d, m = pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    tiled = words4.tile_words(words, TILES)
    want, want_silu = w4a16(x, words, d, m, b), w4a16(gate_up, words, d, m, b, silu_mul=True)
    config = w4a16_tiles.config
    monkeypatch.setattr(w4a16_tiles, "config", lambda *a: (lambda dot, cfg: (dot, dict(cfg, **ahead)))(*config(*a)))
    assert torch.equal(w4a16(x, words, d, m, b), want)
    assert torch.equal(w4a16(x, tiled, d, m, b, layout=TILES), want)
    assert torch.equal(w4a16(gate_up, tiled, d, m, b, silu_mul=True, layout=TILES), want_silu)


@pytest.mark.parametrize("ahead,rows", [(dict(), 1), (dict(DEPTH=2, XAHEAD=1), 2),
                                        (dict(DEPTH=2, XAHEAD=1, UNROLL=1), 1), (dict(PIPE=3), 1)], ids=str)
def test_w4a16_on_whole_tiles_drops_the_masks_and_gives_the_same_products(monkeypatch, rows, ahead):
    """N a multiple of BLOCK_N and K of the tile's words (EVEN): W and its scales are loaded
    without masks, a tile past K reloads the last one, and the products are bit-identical to
    the masked kernel's (another BLOCK_N with N not a multiple of it: rows are summed alike),
    with K split into whole tiles, uneven runs of them, and splits left empty."""
    from nextok.kernels.triton import w4a16_tiles

    n, k, group = 48, 192, 32  # K: 24 words, 3 tiles of 8 (GT 2 groups of 4 words)
    w, x, b = _data(torch.bfloat16, n, k, rows)
    q, d, m = quantize_groups(w, group)
    words, d, m = pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    tiled = words4.tile_words(words, (4, 4))
    seen = []  # each launch's EVEN

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["EVEN"])
                return kernel[grid](*args, **kwargs)
            return launch

    kernel = w4a16_mod._w4a16_dp4a_kernel
    monkeypatch.setattr(w4a16_mod, "_w4a16_dp4a_kernel", Recording())
    config = w4a16_tiles.config
    for split in (1, 3, 5):  # 3 tiles of K: whole runs of them, uneven ones, empty splits
        results = []
        for block_n in (16, 32):  # 48 % 16 == 0: EVEN; 48 % 32 != 0
            tile = dict(BLOCK_N=block_n, GT=2, SPLIT=split, **ahead)
            monkeypatch.setattr(w4a16_tiles, "config", lambda *a, t=tile: (lambda dot, cfg: (dot, dict(cfg, **t)))(*config(*a)))
            results += [w4a16(x, words, d, m, b), w4a16(x, tiled, d, m, b, layout=(4, 4))]
        assert seen[-4:] == [True, True, False, False]
        assert all(torch.equal(r, results[0]) for r in results[1:]), split


@pytest.mark.parametrize("stream", [0, 3])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_w4a16_on_group_major_scales_equals_row_major(monkeypatch, rows, stream):
    """d and m in group order (Int4Linear.set_scale_order(True): views of [groups, N] tensors,
    read through their strides) give the row-order products bit for bit: the split grid, the
    stream (one row), tl.dot (40 rows), with silu(gate) * up, and the one-pass dequantize."""
    from nextok.kernels.triton import w4a16_tiles

    if stream and rows > 1:
        pytest.skip("the stream takes one row")
    # groups of 32, as GGUF's Q4 types (where tl.dot on group order failed to build, f0388e0)
    n, k, group = next(s for s in SHAPES if s[2] == 32)
    w, x, b = _data(torch.bfloat16, n, k, rows)
    gate_up = torch.randn(rows, 2 * k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, torch.bfloat16)
    q, d, m = quantize_groups(w, group)
    words = words4.tile_words(pack_words(q).to(DEVICE), TILES)
    d, m = d.to(DEVICE), m.to(DEVICE)
    dg, mg = scales_in_order(d, True), scales_in_order(m, True)
    assert dg.stride() == (1, _padded(n)) and torch.equal(dg, d)
    if stream:
        tile = dict(SPLIT=1, DEPTH=1, XAHEAD=0, STREAM=stream)
        config = w4a16_tiles.config
        monkeypatch.setattr(w4a16_tiles, "config", lambda *a: (lambda dot, cfg: (dot, dict(cfg, **tile)))(*config(*a)))
    for inp, silu in ((x, False), (gate_up, True)):
        assert torch.equal(w4a16(inp, words, dg, mg, b, silu_mul=silu, layout=TILES),
                           w4a16(inp, words, d, m, b, silu_mul=silu, layout=TILES))
    assert torch.equal(words4.dequantize(words, dg, mg, torch.bfloat16, layout=TILES),
                       words4.dequantize(words, d, m, torch.bfloat16, layout=TILES))
    with pytest.raises(ValueError, match="d and m must share row- or group-major strides"):
        w4a16(x, words, dg, m, layout=TILES)
    layer = Int4Linear(q.to(DEVICE), d, m, b)
    want = layer(x)
    layer.set_scale_order(True)
    assert layer.scales.stride() == (1, _padded(n)) and layer.mins.stride() == (1, _padded(n))
    assert torch.equal(layer(x), want)


def _padded(n: int) -> int:  # group-order scales' stride between groups (scales_in_order)
    return -(-n // 16) * 16


def test_group_order_scales_pad_the_stride_between_groups():
    """Group order keeps the values and pads each group's row to a multiple of 16 entries, so
    Triton specializes the stride as divisible by 16 (24 rows, stride 24: Triton 3.6 failed to
    compile the W4A16 tl.dot kernel for sm_90); row order is contiguous again."""
    t = torch.randn(24, 8, dtype=torch.float16)
    g = scales_in_order(t, True)
    assert g.shape == (24, 8) and g.stride() == (1, 32) and torch.equal(g, t)
    assert scales_in_order(torch.randn(32, 4), True).stride() == (1, 32)
    r = scales_in_order(g, False)
    assert r.is_contiguous() and torch.equal(r, t)


@pytest.mark.parametrize("pipe,tma", [(0, 0), (3, 0), (3, 1)])
@pytest.mark.parametrize("programs", [1, 3, 7, 40])
def test_w4a16_stream_gives_the_split_grids_products(monkeypatch, programs, pipe, tma):
    """One row as a stream (STREAM programs, each a run of (row tile, K tile) steps; runs that
    end inside a row tile leave partial sums the tile's last program adds in run order): the
    split grid's products, on tiled and row-major words, with bias and with silu(gate) * up.
    One program adds every tile in K order as one split does: bit for bit. PIPE (each step's
    loads in its own turn, for Triton's pipeline) too, and TMA (W's words through a tensor
    descriptor: the row tiles past N, here N = 40 in tiles of 16, read as zeros)."""
    from nextok.kernels.triton import w4a16_stream, w4a16_tiles

    n, k, group = SHAPES[0]
    w, x, b = _data(torch.bfloat16, n, k, 1)
    gate_up = torch.randn(1, 2 * k, generator=torch.Generator().manual_seed(9)).to(DEVICE, torch.bfloat16)
    q, d, m = quantize_groups(w, group)
    words, d, m = pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    tiled = words4.tile_words(words, TILES)
    one = dict(SPLIT=1, DEPTH=1, XAHEAD=0)
    config = w4a16_tiles.config
    split_one = lambda *a: (lambda dot, cfg: (dot, dict(cfg, **one)))(*config(*a))  # noqa: E731
    monkeypatch.setattr(w4a16_tiles, "config", split_one)
    want = [w4a16(x, words, d, m, b), w4a16(x, tiled, d, m, None, layout=TILES),
            w4a16(gate_up, tiled, d, m, b, silu_mul=True, layout=TILES)]
    streams, original = [], w4a16_stream.stream
    monkeypatch.setattr(w4a16_stream, "stream", lambda *a: (streams.append(1), original(*a))[1])
    monkeypatch.setattr(w4a16_tiles, "config",
                        lambda *a: (lambda dot, cfg: (dot, dict(cfg, STREAM=programs, PIPE=pipe, TMA=tma)))(*split_one(*a)))
    got = [w4a16(x, words, d, m, b), w4a16(x, tiled, d, m, None, layout=TILES),
           w4a16(gate_up, tiled, d, m, b, silu_mul=True, layout=TILES)]
    assert len(streams) == 3
    for g, e in zip(got, want):
        if programs == 1:
            assert torch.equal(g, e)
        else:
            _close(g, e)


@pytest.mark.parametrize("stream", [0, 3])
@pytest.mark.parametrize("rows", [1, 5])
def test_w4a16_with_x_in_fixed_point_per_run_of_words(monkeypatch, rows, stream):
    """XRUN: x in fixed point per run of 4 words (32 columns; their largest |x| sets the step)
    and the run's products summed in dp4a's accumulator, the hi and lo bytes apart: the
    products of x so rounded (in float32 to float32's tolerance), on the split grid and the
    stream, on tiled words, with bias and with silu(gate) * up; within bfloat16's tolerance of
    x itself."""
    from nextok.kernels.triton import w4a16_tiles

    if stream and rows > 1:
        pytest.skip("the stream takes one row")
    n, k, group = SHAPES[0]
    dtype = torch.bfloat16 if CUDA else torch.float32
    w, x, b = _data(dtype, n, k, rows)
    x[:, 8:16] = 0  # a word of zeros in a group with others
    x[:, 3] *= 50  # an outlier sets its group's step
    gate_up = torch.randn(rows, 2 * k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
    q, d, m = quantize_groups(w, group)
    words, d, m = pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    tiled = words4.tile_words(words, TILES)
    deq = dequantize_groups(q, d.cpu(), m.cpu()).to(DEVICE, dtype)
    dq = dequantize_groups(q, d.cpu(), torch.zeros_like(m.cpu())).to(DEVICE, dtype)
    tile = dict(XRUN=1, **(dict(SPLIT=1, DEPTH=1, XAHEAD=0, STREAM=stream) if stream else {}))
    config = w4a16_tiles.config
    monkeypatch.setattr(w4a16_tiles, "config", lambda *a: (lambda dot, cfg: (dot, dict(cfg, **tile)))(*config(*a)))
    h = gate_up[:, :k].float()
    h = (h / (1 + torch.exp(-h)) * gate_up[:, k:].float()).to(dtype)  # silu(gate) * up
    for inp, got in ((x, w4a16(x, tiled, d, m, b, layout=TILES)),
                     (h, w4a16(gate_up, tiled, d, m, b, silu_mul=True, layout=TILES))):
        torch.testing.assert_close(got, torch.nn.functional.linear(inp, deq) + b, rtol=2e-2, atol=2e-2)
        if dtype == torch.float32:
            want = (torch.nn.functional.linear(_fixed_point(inp, 32), dq)
                    + torch.nn.functional.linear(inp, deq - dq))
            _close(got, want + b)
    assert torch.equal(w4a16(x, words, d, m, b), w4a16(x, tiled, d, m, b, layout=TILES))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 12])
def test_w4a16_takes_gate_up_as_the_separate_silu_mul_does(dtype, rows):
    """silu_mul=True: the down projection reads an MLP's [gate | up] rows and multiplies
    silu(gate) * up, bit for bit the silu_mul kernel's rounding, so the result equals the kernel
    on that kernel's output (12 rows: the tl.dot kernel, which takes silu_mul's output)."""
    from nextok.kernels.triton.fused import TritonFusedOps

    n, k, group = SHAPES[1]
    w, _, b = _data(dtype, n, k, rows)
    gate_up = (torch.randn(rows, 2 * k, generator=torch.Generator().manual_seed(rows)) * 2).to(DEVICE, dtype)
    q, d, m = quantize_groups(w, group)
    args = (pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE))
    act = TritonFusedOps().silu_mul(gate_up)
    assert torch.equal(w4a16(gate_up, *args, b, silu_mul=True), w4a16(act, *args, b))
    tiled = words4.tile_words(args[0], TILES)
    assert torch.equal(w4a16(gate_up, tiled, *args[1:], b, silu_mul=True, layout=TILES), w4a16(act, *args, b))
    layer = Int4Linear(q, d, m, b.cpu()).to(DEVICE)
    _close(layer.forward_silu_mul(gate_up, TritonFusedOps()), w4a16(act, *args, b))
    with pytest.raises(ValueError, match="gate and up"):
        w4a16(gate_up[:, :k], *args, silu_mul=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES[:2] + [(3, 64, 32)], ids=str)
def test_dequantize_in_one_pass_equals_the_torch_path(dtype, shape):
    """The prefill path's weight: dequantize_groups' float32 d * q + m rounded to dtype (on the
    GPU a fused multiply-add may move a float32 ulp, so there within one ulp of dtype)."""
    from nextok.kernels.triton.int4_words import dequantize

    n, k, group = shape
    w, _, _ = _data(dtype, n, k, 1)
    q, d, m = quantize_groups(w, group)
    want = dequantize_groups(q, d, m).to(DEVICE, dtype)
    got = dequantize(pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE), dtype)
    if CUDA:
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(got, want)
    dm = torch.ones(2, 2, dtype=torch.float16, device=DEVICE)  # 6 words a row: groups of 24 columns
    with pytest.raises(ValueError, match="power-of-two"):
        dequantize(torch.zeros(2, 6, dtype=torch.int32, device=DEVICE), dm, dm, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] + ([] if CUDA else [torch.float32]))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", W4_ROWS)
def test_w8a16(dtype, shape, rows):
    """The W8A16 kernel at 1 row (in the interpreter the CUDA-core loop; on CUDA the GPU's tile),
    3-16 (tl.dot, padded to 16 rows), 40 (in blocks of rows) and on CUDA 100 and 256 (its row
    class past 64): (x @ q.T) * scale in float32, rounded once."""
    n, k, _ = shape
    w, x, b = _data(dtype, n, k, rows)
    q, scale = quantize_per_channel(w)
    want = (x.float() @ dequantize(q, scale).to(DEVICE).T + b.float()).to(dtype)
    _close(w8a16(x, q.to(DEVICE), scale.to(DEVICE), b), want)
    _close(w8a16(x, q.to(DEVICE), scale.to(DEVICE)), (want.float() - b.float()).to(dtype))


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_w8a16_tile_options_give_the_same_products(monkeypatch, rows):
    """Each of the W8A16 kernel's options gives the default's products: the CUDA-core loop at
    more than one row (a program a row), tl.dot in blocks of 16 and of 64 rows, K split 3 ways
    (not in whole steps of BK) and BK of 64."""
    from nextok.kernels.triton import w8a16_tiles

    n, k, _ = SHAPES[0]
    w, x, b = _data(torch.bfloat16, n, k, rows)
    q, scale = quantize_per_channel(w)
    want = (x.float() @ dequantize(q, scale).to(DEVICE).T + b.float()).to(torch.bfloat16)
    base = dict(BLOCK_N=64 if CUDA else 16, BK=128 if CUDA else 32, num_warps=4, num_stages=3 if CUDA else 1)
    for opts in (dict(DOT=0, BLOCK_M=1), dict(DOT=1, BLOCK_M=16), dict(DOT=1, BLOCK_M=64, SPLIT=3),
                 dict(DOT=int(rows > 1), BLOCK_M=16, SPLIT=3, BK=64 if CUDA else 16)):
        monkeypatch.setattr(w8a16_tiles, "_OVERRIDE", dict(base, **opts))
        _close(w8a16(x, q.to(DEVICE), scale.to(DEVICE), b), want)


def _int8_groups(w: torch.Tensor, group: int, mins: bool):
    """w [n, k] -> int8 q and float16 d (and m) per group, as GGUF Q8_0 (symmetric) or Q5_1
    (q in 0..31 with a min) holds them: W = d q (+ m)."""
    n, k = w.shape
    g = w.view(n, k // group, group)
    if mins:
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        d, m = ((hi - lo) / 31).half(), lo.half()
        q = torch.round((g - m.float()) / d.float()).clamp(0, 31)
    else:
        d, m = (g.abs().amax(-1, keepdim=True) / 127).half(), None
        q = torch.round(g / d.float()).clamp(-127, 127)
    dq = q * d.float() + (0 if m is None else m.float())
    return (q.to(torch.int8).view(n, k), d.view(n, -1), None if m is None else m.view(n, -1),
            dq.view(n, k))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] + ([] if CUDA else [torch.float32]))
@pytest.mark.parametrize("group,mins", [(32, False), (32, True), (16, False)])
@pytest.mark.parametrize("rows", [1, 3, 40] + ([256] if CUDA else []))
def test_w8a16_groups(dtype, group, mins, rows, monkeypatch):
    """Group scales (GGUF Q8_0 / Q5_* / Q6_K on CUDA): each tile dequantized as d q + m in
    float32 and rounded once to x's dtype, then the products: dequantize-then-matmul, as the
    dense path (Int8Linear.dequantize) takes it."""
    n, k, _ = SHAPES[0]
    w, x, b = _data(dtype, n, k, rows)
    q, d, m, dq = _int8_groups(w, group, mins)
    want = (x.float() @ dq.to(DEVICE, dtype).float().T + b.float()).to(dtype)
    args = (q.to(DEVICE), d.to(DEVICE), b, None if m is None else m.to(DEVICE))
    _close(w8a16(x, *args), want)
    layer = Int8Linear(q, d, b.cpu(), m).to(DEVICE)
    assert layer.group == group and torch.equal(layer.dequantize().cpu(), dq)  # dq: on the CPU
    _close(layer(x), want)  # on CUDA the kernel (up to kernel_rows()); on CPU the dense path
    got = w8a16(x, layer.qweight, layer.scale, b, layer.mins)
    for group_major in (True, False):  # group order, and back: the same products
        layer.set_scale_order(group_major)
        assert layer.scale.stride() == ((1, _padded(n)) if group_major else (k // group, 1))
        assert (layer.mins is None or layer.mins.stride() == layer.scale.stride())
        assert torch.equal(w8a16(x, layer.qweight, layer.scale, b, layer.mins), got)
        assert torch.equal(layer.dequantize().cpu(), dq)
    if CUDA:  # past kernel_rows(): the dense path
        monkeypatch.setattr("nextok.quant.int8._kernel_rows", lambda: 0)
        _close(layer(x), want)


@pytest.mark.parametrize("rows", [1, 40])
def test_w8a16_groups_take_whole_groups_a_tile(monkeypatch, rows):
    """Tiles narrower than a group (BK 16 at groups of 32) are widened to one group; K split 3
    ways, and the CUDA-core loop: the same products."""
    from nextok.kernels.triton import w8a16_tiles

    n, k, _ = SHAPES[0]
    w, x, b = _data(torch.bfloat16, n, k, rows)
    q, d, m, dq = _int8_groups(w, 32, True)
    want = (x.float() @ dq.to(DEVICE, torch.bfloat16).float().T + b.float()).to(torch.bfloat16)
    base = dict(BLOCK_N=64 if CUDA else 16, num_warps=4, num_stages=3 if CUDA else 1)
    for opts in (dict(DOT=int(rows > 1), BLOCK_M=16, BK=16), dict(DOT=0, BLOCK_M=1, BK=32, SPLIT=3),
                 dict(DOT=1, BLOCK_M=16, BK=64 if CUDA else 32, SPLIT=3)):
        monkeypatch.setattr(w8a16_tiles, "_OVERRIDE", dict(base, **opts))
        _close(w8a16(x, q.to(DEVICE), d.to(DEVICE), b, m.to(DEVICE)), want)


def test_w8a16_bad_scales_are_refused():
    x = torch.zeros(1, 64, device=DEVICE, dtype=torch.bfloat16)
    q = torch.zeros(4, 64, dtype=torch.int8, device=DEVICE)

    def f16(*shape):
        return torch.ones(*shape, dtype=torch.float16, device=DEVICE)

    for scale, mins in ((f16(4, 1), None), (f16(4, 8), None), (f16(3, 2), None), (f16(4), f16(4)),
                        (f16(4, 2), f16(4, 4)), (f16(4, 4)[:, ::2], None), (f16(2, 4).T, f16(4, 2))):
        with pytest.raises(ValueError, match="W8A16 takes a scale"):
            w8a16(x, q, scale, None, mins)


def test_w8a16_tiles_per_row_class(monkeypatch):
    """A GPU's table gives the tile of the row class (1, 2-16, 17-64, 65-256 rows), else the
    default; an untuned split of K brings the grid near PROGRAMS; NEXTOK_W8A16_ROWS moves the
    rows Int8Linear sends the kernel, checked."""
    from nextok.errors import NextokError
    from nextok.kernels.triton import w8a16_tiles as t

    table = {"4096x4096": {"16": dict(DOT=1, BLOCK_M=16, BLOCK_N=128, BK=64, num_warps=8, num_stages=3, SPLIT=2)}}
    monkeypatch.setattr(t, "_tuned", lambda name: table)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    gpu = torch.device("cuda")
    assert t.config(9, 4096, 4096, gpu) == table["4096x4096"]["16"]
    one = t.config(1, 4096, 4096, gpu)  # the default: 64 tiles of N, split 4 ways -> 256 programs
    assert one == dict(t.DEFAULT_TILES["1"], SPLIT=4)
    table["4096x4096"] = {"1": dict(DOT=0, BLOCK_M=16, BLOCK_N=32, BK=256, num_warps=4, num_stages=4, SPLIT=1)}
    assert t.config(1, 4096, 4096, gpu)["BLOCK_M"] == 1  # the CUDA-core loop: one row a program
    assert t.config(1, 28672, 4096, gpu)["SPLIT"] == 1  # 448 tiles already
    assert t.config(200, 4096, 4096, gpu)["BLOCK_M"] == t.DEFAULT_TILES["256"]["BLOCK_M"]
    assert t.config(3, 64, 256, gpu)["SPLIT"] == 1  # K too short to split into 4 steps of BK
    for m, cls in ((1, "1"), (9, "16")):  # group scales: their own tiles up to 16 rows, then the table's
        tile = t.GROUP_TILES[cls]  # (tl.dot takes blocks of 16 rows, one row too)
        assert t.config(m, 4096, 4096, gpu, grouped=True) == dict(
            tile, BLOCK_M=16 if tile["DOT"] else 1, SPLIT=t._split(tile, m, 4096, 4096))
    assert t.config(200, 4096, 4096, gpu, grouped=True) == t.config(200, 4096, 4096, gpu)
    for value, want in (("", t.KERNEL_ROWS), ("256", 256), ("1", 1)):
        monkeypatch.setenv("NEXTOK_W8A16_ROWS", value)
        t.kernel_rows.cache_clear()
        assert t.kernel_rows() == want
    for value in ("257", "0", "many"):
        monkeypatch.setenv("NEXTOK_W8A16_ROWS", value)
        t.kernel_rows.cache_clear()
        with pytest.raises(NextokError, match="NEXTOK_W8A16_ROWS"):
            t.kernel_rows()
    t.kernel_rows.cache_clear()


def test_int4_linear_runs_the_kernel_or_the_torch_path_alike():
    """Int4Linear holds packed nibbles; on CUDA its small steps take the kernel, big ones and the
    CPU dequantize: the same answer either way."""
    from nextok.kernels.triton.w4a16_tiles import kernel_rows

    n, k, group = SHAPES[0]
    w, x, b = _data(torch.bfloat16 if CUDA else torch.float32, n, k, kernel_rows() + 4)
    q, d, m = quantize_groups(w, group)
    layer = Int4Linear(q, d, m, b.cpu()).to(DEVICE)
    assert layer.qweight.shape == (n, k // 8)
    want = torch.nn.functional.linear(x, dequantize_groups(q, d, m).to(DEVICE, x.dtype), b)
    big, small = layer(x), layer(x[:3])
    _close(big, want)  # past kernel_rows(): the dense path
    _close(small, want[:3])  # on CUDA: the kernel
    # made on CUDA, its words are tiles (int4_words.LAYOUT); any layer's may be: the same answers
    made_here = Int4Linear(q.to(DEVICE), d.to(DEVICE), m.to(DEVICE), b)
    assert made_here.layout == (words4.LAYOUT if CUDA else None)
    layer.set_layout(TILES)
    assert layer.layout == TILES and not torch.equal(layer.qweight, pack_words(q).to(DEVICE))
    assert torch.equal(layer.row_major_words(), pack_words(q).to(DEVICE))
    for tiled in (layer, made_here):
        assert torch.equal(tiled(x), big) and torch.equal(tiled(x[:3]), small)


@pytest.mark.parametrize("rows", [12, 40])
def test_w4a16_dot_tile_options_give_the_same_products(monkeypatch, rows):
    """The tl.dot kernel's options give dequantize-then-matmul's products as its default does,
    on tiled words: row blocks of 16 and of 64 (12 rows padded to 64); JOIN=1 (one dot a tile, the nibble planes joined
    back into column order); SPLIT (K over 2-3 programs a tile, 3 not dividing the
    interpreter's K in whole tiles); PAIRS=1 (W dequantized two columns a register in x's
    dtype: on CUDA PTX for bfloat16 and float16 each, in the interpreter float32, with d and m
    rounded to x's dtype as the GPU rounds them)."""
    from nextok.kernels.triton import w4a16_tiles

    n, k, group = SHAPES[0]
    w, x, b = _data(torch.bfloat16, n, k, rows)
    q, d, m = quantize_groups(w, group)
    tiled = words4.tile_words(pack_words(q).to(DEVICE), TILES)
    config = w4a16_tiles.config
    for dtype, tiles in ((torch.bfloat16, (dict(BLOCK_M=64 if rows > 16 else 16), dict(JOIN=1),
                                           dict(JOIN=1, SPLIT=3, BLOCK_M=64), dict(SPLIT=2),
                                           dict(JOIN=1, PAIRS=1), dict(JOIN=1, PAIRS=1, SPLIT=3, BLOCK_M=64))),
                         (torch.float16, (dict(JOIN=1, PAIRS=1),))):
        xd, bd = x.to(dtype), b.to(dtype)
        for tile in tiles:
            # every option set: on CUDA the GPU's table gives the rest (an H100's has PAIRS)
            tile = dict(dict(JOIN=0, PAIRS=0, SPLIT=1), **tile)
            # PAIRS's weights: q d + m with d and m in x's dtype, rounded once (exact in float32);
            # the product in float32, rounded once (cuBLAS's float16 may sum in float16)
            dm = (d.to(dtype), m.to(dtype)) if tile["PAIRS"] else (d, m)
            wd = dequantize_groups(q, *dm).to(DEVICE, dtype).float()
            want = (torch.nn.functional.linear(xd.float(), wd) + bd.float()).to(dtype)
            monkeypatch.setattr(w4a16_tiles, "config",
                                lambda *a, t=tile: (lambda dot, cfg: (dot, dict(cfg, **t)))(*config(*a)))
            _close(w4a16(xd, tiled, d.to(DEVICE), m.to(DEVICE), bd, layout=TILES), want)


def test_dot_row_classes_take_their_own_tiles(monkeypatch):
    """Past DP4A_ROWS a GPU's table gives tl.dot the tile of its row class ("16": 9-16 rows,
    "32", ..., "256"), else the default of that class; a program takes the tile's BLOCK_M rows (16 if
    absent), padded. PAIRS is kept only with JOIN."""
    from nextok.kernels.triton import w4a16_tiles as t

    table = {"64x256": {"16": dict(BLOCK_N=32, TW=16, num_warps=4, num_stages=3, PAIRS=1),  # no JOIN: no PAIRS
                        "64": dict(BLOCK_N=128, TW=16, num_warps=8, num_stages=3, BLOCK_M=32, JOIN=1, SPLIT=4,
                                   PAIRS=1)}}
    monkeypatch.setattr(t, "_tuned", lambda name: table)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    gpu = torch.device("cuda")
    pick = lambda m, n=64: t.config(m, n, 256, 128, gpu)  # noqa: E731
    assert pick(12) == (True, dict(BLOCK_N=32, GT=1, num_warps=4, num_stages=3, BLOCK_M=16, JOIN=0, SPLIT=1,
                                 PAIRS=0))
    default32 = t.DEFAULT_TILES["32"]  # no "32" in the table
    assert pick(24) == (True, dict(BLOCK_N=default32["BLOCK_N"], GT=1, num_warps=default32["num_warps"],
                                   num_stages=3, BLOCK_M=default32["BLOCK_M"], JOIN=1,
                                   SPLIT=default32["SPLIT"], PAIRS=1))
    assert pick(40) == (True, dict(BLOCK_N=128, GT=1, num_warps=8, num_stages=3, BLOCK_M=32, JOIN=1, SPLIT=4,
                                   PAIRS=1))
    assert pick(40, n=128)[1]["BLOCK_M"] == t.DEFAULT_TILES["64"]["BLOCK_M"]  # a shape not in the table
    table["64x256"]["128"] = dict(BLOCK_N=64, TW=16, num_warps=8, num_stages=2, BLOCK_M=128, JOIN=1, PAIRS=1)
    assert pick(65)[1] == pick(128)[1] == dict(BLOCK_N=64, GT=1, num_warps=8, num_stages=2, BLOCK_M=128, JOIN=1,
                                               SPLIT=1, PAIRS=1)
    assert pick(129)[1]["SPLIT"] == t.DEFAULT_TILES["256"]["SPLIT"]
    assert not pick(8)[0]


def test_w4a16_rows_limit_is_read_once_and_checked(monkeypatch):
    """NEXTOK_W4A16_ROWS moves the rows up to which Int4Linear runs the kernels (else
    KERNEL_ROWS); a value outside DP4A_ROWS..MAX_ROWS is refused with a message naming it."""
    from nextok.errors import NextokError
    from nextok.kernels.triton import w4a16_tiles

    for value, want in (("", w4a16_tiles.KERNEL_ROWS), ("64", 64), ("12", 12)):
        monkeypatch.setenv("NEXTOK_W4A16_ROWS", value)
        w4a16_tiles.kernel_rows.cache_clear()
        assert w4a16_tiles.kernel_rows() == want
    for value in (str(w4a16_mod.MAX_ROWS + 1), "4", "lots"):
        monkeypatch.setenv("NEXTOK_W4A16_ROWS", value)
        w4a16_tiles.kernel_rows.cache_clear()
        with pytest.raises(NextokError, match="NEXTOK_W4A16_ROWS"):
            w4a16_tiles.kernel_rows()
    w4a16_tiles.kernel_rows.cache_clear()


def test_bad_shapes_are_refused():
    q = torch.zeros(8, 12, dtype=torch.int32)  # K = 96: groups of 48, not a power of two
    d = torch.ones(8, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="power of two"):
        w4a16(torch.zeros(1, 96, device=DEVICE, dtype=torch.bfloat16), q.to(DEVICE), d.to(DEVICE), d.to(DEVICE))
    with pytest.raises(ValueError, match="rows"):
        w4a16(torch.zeros(w4a16_mod.MAX_ROWS + 1, 96, device=DEVICE, dtype=torch.bfloat16), q.to(DEVICE),
              d[:, :1].to(DEVICE), d[:, :1].to(DEVICE))
    with pytest.raises(ValueError, match="rows"):
        w8a16(torch.zeros(MAX_ROWS + 1, 32, device=DEVICE), torch.zeros(4, 32, dtype=torch.int8, device=DEVICE),
              torch.ones(4, dtype=torch.float16, device=DEVICE))
