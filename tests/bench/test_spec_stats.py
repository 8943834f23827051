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


def test_method_labels_give_layers_and_draft_length():
    from types import SimpleNamespace

    from nextok.bench.spec import _method_kwargs

    args = SimpleNamespace(draft_num_kv_blocks=64, draft_model=None, self_draft_layers=8, medusa_heads="H")
    assert _method_kwargs("ngram@7", args) == {"speculative": "ngram", "num_speculative_tokens": 7}
    assert _method_kwargs("medusa", args) == {"speculative": "medusa", "medusa_heads": "H"}
    kw = _method_kwargs("self-draft:12@3", args)
    assert (kw["self_draft_layers"], kw["num_speculative_tokens"]) == (12, 3)
