"""The sliding-window plan of `nextok eval ppl`: every token scored once, in order, within bounds;
the max-tokens cap; the pool check. No model."""
from __future__ import annotations

import pytest

from nextok.eval.ppl import check_fits
from nextok.eval.windows import Window, cap_documents, check_settings, plan_windows


def test_plan_of_a_small_document_spelled_out():
    # context 4, stride 2: the first window scores 1..3, each later one its last 2 tokens
    assert plan_windows(10, 4, 2) == [Window(0, 4, 1), Window(2, 6, 4), Window(4, 8, 6), Window(6, 10, 8)]
    assert plan_windows(9, 4, 2)[-1] == Window(6, 9, 8)  # the last window is cut at the end
    assert plan_windows(3, 8, 4) == [Window(0, 3, 1)]  # shorter than one window
    assert plan_windows(1, 4, 2) == [] and plan_windows(0, 4, 2) == []
    assert Window(2, 6, 4).fed == (2, 5)  # the last token is only a target


@pytest.mark.parametrize("length", [2, 3, 7, 64, 127, 128, 129, 300, 1000])
@pytest.mark.parametrize("context,stride", [(2, 1), (5, 4), (16, 1), (128, 64), (128, 127), (100, 30)])
def test_every_token_is_scored_exactly_once_in_order(length, context, stride):
    windows = plan_windows(length, context, stride)
    scored = [t for w in windows for t in range(w.first_scored, w.end)]
    assert scored == list(range(1, length))
    assert windows[0].start == 0 and windows[0].first_scored == 1 and windows[-1].end == length
    for i, w in enumerate(windows):
        assert w.start == i * stride and 0 < w.end - w.start <= context
        assert w.start < w.first_scored <= w.end
        fed = w.fed[1] - w.fed[0]
        assert 1 <= fed <= context - 1 and w.end - w.first_scored <= fed  # targets have logits
        if i:
            # later windows: every scored token sees at least context - stride tokens before it
            assert w.first_scored - w.start >= context - stride
            assert w.end - w.first_scored <= stride


@pytest.mark.parametrize("context,stride,max_tokens,word", [
    (1, 1, None, "--context"), (0, 1, None, "--context"), (8, 0, None, "--stride"),
    (8, 8, None, "--stride"), (8, 9, None, "--stride"), (8, 4, 0, "--max-tokens")])
def test_bad_settings_raise_a_clear_value_error(context, stride, max_tokens, word):
    with pytest.raises(ValueError, match=word):
        check_settings(context, stride, max_tokens)
    if word != "--max-tokens":
        with pytest.raises(ValueError, match=word):
            plan_windows(100, context, stride)


def test_cap_keeps_a_prefix_of_the_scored_tokens_in_order():
    docs = [("a", list(range(5))), ("tiny", [7]), ("empty", []), ("b", list(range(10))), ("c", [1, 2, 3])]
    assert list(cap_documents(docs, None)) == [docs[0], docs[3], docs[4]]  # < 2 tokens: skipped
    assert list(cap_documents(docs, 4)) == [("a", list(range(5)))]  # 5 tokens score 4
    assert list(cap_documents(docs, 3)) == [("a", [0, 1, 2, 3])]
    assert list(cap_documents(docs, 7)) == [("a", list(range(5))), ("b", [0, 1, 2, 3])]
    for cap in range(1, 16):
        kept = list(cap_documents(docs, cap))
        assert sum(len(ids) - 1 for _, ids in kept) == min(cap, 4 + 9 + 2)


def test_cap_pulls_no_document_past_the_cap():
    def docs():
        yield "a", [1, 2, 3]
        raise AssertionError("read past the cap")

    assert list(cap_documents(docs(), 2)) == [("a", [1, 2, 3])]


def test_pool_and_model_length_checks():
    assert check_fits(129, 16, 9, 8192) == 8  # 128 tokens fed: 8 blocks, block 0 reserved
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        check_fits(130, 16, 9, 8192)
    with pytest.raises(ValueError, match="--max-model-len"):
        check_fits(2049, 16, 1000, 2047)
