"""`nextok bench spec`'s statistics besides the ratio of median TPOTs."""
from __future__ import annotations

from nextok.bench.common import memory_copy_gbps
from nextok.bench.spec import _decode_seconds


def test_decode_seconds_weights_each_prompt_by_its_tokens():
    runs = [{"tpot_s": 0.01, "tokens": 101}, {"tpot_s": 0.02, "tokens": 11}, {"tpot_s": float("nan"), "tokens": 1}]
    assert abs(_decode_seconds(runs) - (0.01 * 100 + 0.02 * 10)) < 1e-12  # a 1-token reply has none


def test_memory_copy_bandwidth_is_measured():
    gbps = memory_copy_gbps(mib=8, repeats=2)
    assert 0.1 < gbps < 10_000
