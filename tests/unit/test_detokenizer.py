"""IncrementalDetokenizer on the real SmolLM2 tokenizer, fed one token at a time, both ways it
turns tokens into characters: by each token's bytes (`byte_pieces`, byte-level BPE tokenizers)
and by decode calls over a window (any other tokenizer, e.g. SentencePiece's).

Invariants every run checks (`feed`): the released deltas join up to `output_text`; each
intermediate `output_text` is a prefix of the final one (no delta carries text cut later, so no
half-decoded character was shown as U+FFFD).
"""
from __future__ import annotations

import random

import pytest

from nextok.engine.detokenizer import _MAX_PENDING, IncrementalDetokenizer
from tests.server.fim_tokenizers import FAMILY_SPECIAL_TOKENS, build_tokenizer
from tests.unit.test_tokenizer import SAMPLES, load_real_tokenizer


class DecodeOnly:
    """The tokenizer without `byte_pieces`: the detokenizer then decodes windows of ids, as for
    tokenizers whose decoder is not byte-level."""

    def __init__(self, tok):
        self._tok = tok

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens)

    def __getattr__(self, name):
        if name == "byte_pieces":
            raise AttributeError(name)
        return getattr(self._tok, name)


@pytest.fixture(scope="module", params=["bytes", "decode"])
def tok(model_path, request):
    real = load_real_tokenizer(model_path)
    return real if request.param == "bytes" else DecodeOnly(real)


@pytest.fixture(scope="module")
def prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Write something."}])
    return tok.encode(text)


def feed(tok, ids, prompt=(), stop=(), include=False, skip=True, finish=True):
    """Step `ids` one at a time -> (deltas, per-step output_text, detokenizer)."""
    d = IncrementalDetokenizer(tok, list(prompt), skip, list(stop), include)
    deltas, seen = [], []
    for i in ids:
        delta, stopped = d.step([i])
        deltas.append(delta)
        seen.append(d.output_text)
        # (by bytes, U+FFFD comes out only for bytes already known bad: the prefix check below
        # shows it stays)
        assert not delta.endswith("\ufffd") or d._pieces is not None
        if stopped:
            break
    if finish and d.stop_reason is None:
        deltas.append(d.finish())
    assert "".join(deltas) == d.output_text
    assert all(d.output_text.startswith(s) for s in seen)
    return deltas, seen, d


# ---- text ------------------------------------------------------------------------------
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", SAMPLES)
def test_deltas_join_to_decode(tok, prompt, text, skip):
    ids = tok.encode(text)
    deltas, _, d = feed(tok, ids, prompt, skip=skip)
    assert d.output_text == tok.decode(ids, skip_special_tokens=skip)
    assert d.token_ids == ids and d.stop_reason is None
    # Without a prompt to seed the window the result is the same.
    assert feed(tok, ids, skip=skip)[2].output_text == d.output_text


def test_multibyte_characters_wait_for_their_last_byte(tok):
    ids = tok.encode("🎉中")
    assert tok.decode(ids[:1]).endswith("\ufffd")  # the emoji really is split over tokens
    deltas, _, _ = feed(tok, ids)
    assert "" in deltas and "".join(deltas) == "🎉中"


def test_prompt_ending_inside_a_character(tok):
    ids = tok.encode("🎉 ok")
    # The prompt holds the emoji's first byte: output is the rest, as decode() sees it alone.
    _, _, d = feed(tok, ids[1:], prompt=ids[:1])
    assert d.output_text == tok.decode(ids[1:])


def test_several_tokens_per_step(tok, prompt):
    ids = tok.encode(SAMPLES[10])
    d = IncrementalDetokenizer(tok, prompt, True, [], False)
    out = "".join(d.step(ids[i:i + 3])[0] for i in range(0, len(ids), 3)) + d.finish()
    assert out == tok.decode(ids) == d.output_text


def test_skip_special_tokens(tok, prompt):
    ids = tok.encode("<|im_start|>assistant\nHi there<|im_end|>")
    assert feed(tok, ids, prompt)[2].output_text == "assistant\nHi there"
    assert feed(tok, ids, prompt, skip=False)[2].output_text == \
        "<|im_start|>assistant\nHi there<|im_end|>"


def test_window_stays_small(tok):
    # Skipped special tokens add no text; the window must not grow with them.
    ids = [0] * (3 * _MAX_PENDING) + tok.encode("done")
    _, _, d = feed(tok, ids, finish=False)
    assert d._pieces is not None or len(d._window) <= _MAX_PENDING + 2
    assert d.output_text + d.finish() == "done"


def test_finish_flushes_an_unfinished_character(tok):
    ids = tok.encode("ok 🎉")[:-1]  # cut by max_tokens inside the emoji
    _, _, d = feed(tok, ids)
    assert d.output_text == tok.decode(ids) and d.output_text.endswith("\ufffd")


# ---- stop strings ----------------------------------------------------------------------
CODE = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"


def test_stop_on_a_single_token(tok):
    ids = tok.encode(CODE)
    assert "ĊĊ" in tok.convert_ids_to_tokens(ids)
    _, _, d = feed(tok, ids, stop=["\n\n"])
    assert d.output_text == "def f():\n    return 1" and d.stop_reason == "\n\n"
    assert len(d.token_ids) < len(ids)


def test_stop_spanning_tokens_is_held_back(tok):
    ids = tok.encode(CODE)
    _, seen, d = feed(tok, ids, stop=["return 1\n"])
    assert d.output_text == "def f():\n    " and d.stop_reason == "return 1\n"
    # While "return" and "return 1" arrived nothing of them was shown.
    assert all("r" not in s for s in seen)


def test_include_stop_str_in_output(tok):
    _, _, d = feed(tok, tok.encode(CODE), stop=["return 1"], include=True)
    assert d.output_text == "def f():\n    return 1" and d.stop_reason == "return 1"


def test_earliest_stop_wins(tok):
    _, _, d = feed(tok, tok.encode(CODE), stop=["def g", "return", "1\n"])
    assert d.output_text == "def f():\n    " and d.stop_reason == "return"
    # On a tie at one start, the shorter one completes first.
    _, _, d = feed(tok, tok.encode(CODE), stop=["return 1", "return"], include=True)
    assert d.stop_reason == "return" and d.output_text.endswith("return")


def test_prefix_released_when_it_is_not_a_stop(tok):
    ids = tok.encode(CODE)
    _, seen, d = feed(tok, ids, stop=["return 2\n\n"])
    # "return 1" looked like the stop string for a while, then was shown in full.
    held = [s for s in seen if s.endswith("def f():\n    ")]
    assert len(held) >= 2
    assert d.stop_reason is None and d.output_text == CODE


def test_held_prefix_released_on_finish(tok):
    ids = tok.encode("x = ret")
    _, seen, d = feed(tok, ids, stop=["return"], finish=False)
    assert d.output_text == "x = " and seen[-1] == "x = "
    assert d.finish() == "ret" and d.output_text == "x = ret" and d.stop_reason is None


def test_stop_at_start_and_after_stop(tok):
    d = IncrementalDetokenizer(tok, [], True, ["Hello"], False)
    assert d.step(tok.encode("Hello")) == ("", True)
    assert d.output_text == "" and d.stop_reason == "Hello"
    assert d.step(tok.encode(" more")) == ("", True) and d.finish() == ""


def test_stop_strings_in_unicode_and_specials(tok):
    _, _, d = feed(tok, tok.encode("答案是：42。好的"), stop=["。"])
    assert d.output_text == "答案是：42"
    ids = tok.encode("hi<|im_end|>")
    assert feed(tok, ids, stop=["<|im_end|>"], skip=False)[2].output_text == "hi"
    assert feed(tok, ids, stop=["<|im_end|>"])[2].stop_reason is None  # skipped: no text


# ---- deferred: a request read only when it ends ----------------------------------------
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", SAMPLES + ["🎉中" * 20])
def test_deferred_decodes_once_at_finish_to_the_same_text(tok, prompt, text, skip):
    """Not streamed and no stop strings: step() releases nothing and decodes nothing; finish()
    gives the text the incremental detokenizer would have released in all."""
    ids = tok.encode(text)
    calls = []
    real = tok.decode
    d = IncrementalDetokenizer(tok, list(prompt), skip, [], False, deferred=True)
    try:
        tok.decode = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
        assert all(d.step([i]) == ("", False) for i in ids)
        assert not calls and d.output_text == "" and d.token_ids == ids
    finally:
        tok.decode = real
    assert d.finish() == d.output_text == feed(tok, ids, prompt, skip=skip)[2].output_text
    assert d.output_text == tok.decode(ids, skip_special_tokens=skip)


def test_deferred_keeps_watching_for_stop_strings(tok):
    """A stop string must end the sequence as it is generated: such a request decodes as it
    goes, deferred or not."""
    ids = tok.encode("hello world, and more text after it")
    d = IncrementalDetokenizer(tok, [], True, [" world"], False, deferred=True)
    stopped = [d.step([i])[1] for i in ids]
    assert any(stopped) and d.output_text == "hello" and d.stop_reason == " world"


# ---- by bytes: a token's bytes give the text decode() gives ---------------------------------
def _random_ids(rng: random.Random, vocab: int, specials: list[int]) -> list[int]:
    """Byte tokens (ids < 300 in these vocabularies: split characters and bad bytes), any id,
    special tokens and ids past the tokenizer's vocabulary (a model's padded rows)."""
    pool = [lambda: rng.randrange(min(300, vocab)), lambda: rng.randrange(vocab),
            lambda: rng.choice(specials), lambda: vocab + rng.randrange(64)]
    return [rng.choice(pool)() for _ in range(rng.randint(1, 40))]


def _check_bytes_equal_decode(tok, trials: int) -> None:
    rng = random.Random(0)
    vocab = tok.backend.get_vocab_size(with_added_tokens=True)
    for _ in range(trials):
        ids = _random_ids(rng, vocab, tok.all_special_ids)
        for skip in (True, False):
            want = tok.decode(ids, skip_special_tokens=skip)
            d = IncrementalDetokenizer(tok, [], skip, [], False)
            deltas = [d.step([i])[0] for i in ids] + [d.finish()]
            assert d._pieces is not None and "".join(deltas) == d.output_text == want, (ids, skip)


def test_bytes_give_decode_on_random_ids(model_path):
    _check_bytes_equal_decode(load_real_tokenizer(model_path), 1500)


@pytest.mark.parametrize("family", sorted(FAMILY_SPECIAL_TOKENS))
def test_bytes_give_decode_for_each_code_family(tmp_path, family):
    """Special tokens outside ByteLevel's alphabet (DeepSeek's U+FF5C and U+2581, CodeLlama's
    '▁<PRE>') come out as their own UTF-8."""
    tok = build_tokenizer(family, str(tmp_path))
    assert any(ord(c) > 255 for t in FAMILY_SPECIAL_TOKENS[family] for c in t) == (family in ("codellama", "deepseek-coder"))
    _check_bytes_equal_decode(tok, 300)


def test_other_decoders_decode_windows(tmp_path):
    """A tokenizer whose decoder is not ByteLevel alone (SentencePiece's Metaspace here) has no
    byte pieces: its text comes from decode calls, and still joins up to decode()."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    from nextok.tokenizer import Tokenizer

    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    hf.train_from_iterator(SAMPLES * 3, BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"],
                                                   show_progress=False))
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    tok = Tokenizer.from_dir(str(tmp_path))
    assert tok.byte_pieces(True) is None
    ids = tok.encode("def f(x):\n    return x  # ok")
    d = IncrementalDetokenizer(tok, [], True, [], False)
    out = "".join(d.step([i])[0] for i in ids) + d.finish()
    assert d._pieces is None and out == tok.decode(ids) and "return" in out
