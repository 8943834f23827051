"""Model-based speculation on the real model (issue 8): `self-draft` (the target's first layers)
and `draft` (a separate model with the same tokenizer). Greedy output equals output without
speculation in batches that mix speculating and non-speculating requests, with preemption and
with a draft pool too small for everyone; a draft that is the target itself is accepted almost
always (positions and draft KV are right); seeds still reproduce samples; neither the target's
pool nor the draft's leaks a block; bad options fail at startup with one clear message."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from nextok import SamplingParams
from nextok.errors import NextokError
from tests.e2e.test_invariants import _assert_no_leak, _tokens
from tests.prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=20)
PENALISED = SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.3)
WITH_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=20, logprobs=2)
# every third request is not speculated (per-position sampling state or logprobs)
MIXED = [PENALISED if i % 3 == 1 else WITH_LOGPROBS if i % 3 == 2 else GREEDY for i in range(len(PROMPTS))]
SMALL_POOL = {"num_kv_blocks": 24}  # 384 tokens for ~800: the 20 prompts preempt each other
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, llm_f32):
    """A 2-layer random-weight Llama in HF layout with the default model's tokenizer files and
    vocabulary: a legal draft model (its drafts are nearly always rejected)."""
    from safetensors.torch import save_file

    path = str(tmp_path_factory.mktemp("tiny-draft"))
    tok = llm_f32.get_tokenizer()
    tok.save(path)
    vocab, hidden, inter, layers, heads, kv_heads = llm_f32.engine.config.model.vocab_size, 64, 128, 2, 4, 2
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
           "rope_theta": 100000.0, "tie_word_embeddings": True,
           "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.05

    head_dim = hidden // heads
    weights = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden), p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden)})
    save_file(weights, os.path.join(path, "model.safetensors"))
    return path


def _spec(make_llm, method: str, **kw):
    return make_llm(speculative=method, speculative_disable_batch_size=64, **kw)


def _assert_no_draft_leak(llm) -> None:
    _assert_no_leak(llm)
    proposer = llm.engine.proposer
    proposer.check_integrity()
    assert not proposer.states, "draft state kept for ended sequences"
    assert proposer.num_free_blocks == proposer.num_blocks - 1, "draft blocks still held"


@pytest.fixture(scope="module")
def refs(llm_f32):
    """Greedy outputs without speculation: all greedy, and the mixed batch."""
    return _tokens(llm_f32.generate(PROMPTS, GREEDY)), _tokens(llm_f32.generate(PROMPTS, MIXED))


def _check_equal_with_preemption(spec, refs) -> None:
    ref, ref_mixed = refs
    before = dict(spec.engine.spec_stats)
    assert _tokens(spec.generate(PROMPTS, GREEDY)) == ref
    out = spec.generate(PROMPTS, MIXED)
    assert _tokens(out) == ref_mixed
    assert all(o.outputs[0].logprobs for o, sp in zip(out, MIXED) if sp is WITH_LOGPROBS)
    assert spec.engine.scheduler.num_preemptions > 0
    assert spec.engine.spec_stats["steps"] > before["steps"]
    _assert_no_draft_leak(spec)


def test_self_draft_equals_off_mixed_and_preempted(make_llm, refs):
    spec = _spec(make_llm, "self-draft", **SMALL_POOL)  # the default: 28 of 30 layers
    assert spec.engine.proposer.num_layers == 28
    _check_equal_with_preemption(spec, refs)
    assert spec.engine.spec_stats["accepted"] > 0  # 28 of 30 layers agree now and then


def test_draft_model_equals_off_mixed_and_preempted(make_llm, refs, tiny_draft_dir):
    spec = _spec(make_llm, "draft", draft_model=tiny_draft_dir, **SMALL_POOL)
    assert spec.engine.proposer.num_layers == 2
    _check_equal_with_preemption(spec, refs)


@pytest.mark.parametrize("method", ["draft", "self-draft"])
def test_metrics_carry_the_method_name(make_llm, tiny_draft_dir, method):
    pytest.importorskip("prometheus_client")
    from nextok.server.metrics import ServerMetrics
    from tests.server.conftest import metric_value

    kw = {"draft_model": tiny_draft_dir} if method == "draft" else {}
    spec = _spec(make_llm, method, **SMALL_POOL, **kw)  # the engines of the tests above
    spec.generate(PROMPTS[:2], GREEDY)
    metrics = ServerMetrics("m")
    metrics.observe_step([], spec.engine.stats())
    text = metrics.render().decode()
    stats = spec.engine.spec_stats
    assert stats["steps"] > 0
    assert metric_value(text, "nextok:spec_decode_num_verify_steps_total", method=method) == stats["steps"]
    assert metric_value(text, "nextok:spec_decode_num_draft_tokens_total", method=method) == stats["proposed"]


def test_a_full_draft_pool_only_skips_drafts(make_llm, refs):
    """6 draft blocks (96 tokens) for 20 sequences: most get no draft, output is unchanged."""
    spec = _spec(make_llm, "self-draft", self_draft_layers=4, draft_num_kv_blocks=6)
    assert _tokens(spec.generate(PROMPTS, GREEDY)) == refs[0]
    assert spec.engine.proposer.num_no_room > 0
    assert spec.engine.spec_stats["steps"] > 0
    _assert_no_draft_leak(spec)


def test_the_target_as_its_own_draft_is_accepted(make_llm, model_path, refs):
    """The same weights draft what the target then computes: every draft must be accepted,
    unless positions, block tables or the draft KV kept across steps are wrong."""
    spec = _spec(make_llm, "draft", draft_model=model_path)
    assert _tokens(spec.generate(PROMPTS, GREEDY)) == refs[0]
    stats = spec.engine.spec_stats
    assert stats["proposed"] > 200 and stats["accepted"] / stats["proposed"] > 0.9
    _assert_no_draft_leak(spec)


def test_seeded_sampling_with_self_draft_repeats(make_llm):
    spec = _spec(make_llm, "self-draft", **SMALL_POOL)
    prompts = PROMPTS[:4]
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=7 + i) for i in range(4)]
    before = spec.engine.spec_stats["accepted"]
    batched = _tokens(spec.generate(prompts, params))
    alone = [_tokens(spec.generate([p], sp))[0] for p, sp in zip(prompts, params)]
    assert batched == alone == _tokens(spec.generate(prompts, params))
    assert spec.engine.spec_stats["accepted"] > before
    _assert_no_draft_leak(spec)


# ---- bad options ---------------------------------------------------------------------------
def _copy_with(src: str, dst: str, config=None, vocab_edit=None) -> str:
    shutil.copytree(src, dst)
    if config:
        with open(os.path.join(dst, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump({**cfg, **config}, f)
    if vocab_edit:
        tj = os.path.join(dst, "tokenizer.json")
        with open(tj) as f:
            data = json.load(f)
        vocab_edit(data)
        with open(tj, "w") as f:
            json.dump(data, f)
    return dst


def _swap_tokens(data: dict) -> None:
    vocab = data["model"]["vocab"]
    a, b = (next(t for t, i in vocab.items() if i == want) for want in (1000, 1001))
    vocab[a], vocab[b] = 1001, 1000


def _unspecial(data: dict) -> None:
    data["added_tokens"][-1]["special"] = False


@pytest.mark.parametrize("config, vocab_edit, message", [
    ({"vocab_size": 50000}, None, "different vocabulary sizes"),
    (None, _swap_tokens, "different tokenizers: token id 1000 is"),
    (None, _unspecial, "different special tokens"),
])
def test_a_draft_with_another_vocabulary_is_refused(make_llm, tiny_draft_dir, model_path, tmp_path,
                                                     config, vocab_edit, message):
    bad = _copy_with(tiny_draft_dir, str(tmp_path / "bad-draft"), config, vocab_edit)
    with pytest.raises(NextokError, match=message) as e:
        make_llm(speculative="draft", draft_model=bad)
    assert bad in str(e.value) and model_path in str(e.value)  # names both models


@pytest.mark.parametrize("kw, message", [
    ({"speculative": "self-draft", "self_draft_layers": 0}, r"--self-draft-layers must be in \[1, 29\]"),
    ({"speculative": "self-draft", "self_draft_layers": 30}, r"--self-draft-layers must be in \[1, 29\]"),
    ({"speculative": "draft"}, "--speculative draft needs --draft-model"),
    ({"draft_model": "x"}, "--draft-model is an option of --speculative draft"),
    ({"speculative": "ngram", "draft_model": "x"}, "--draft-model is an option of --speculative draft"),
    ({"speculative": "ngram", "self_draft_layers": 4}, "--self-draft-layers is an option"),
    ({"speculative": "self-draft", "draft_num_kv_blocks": 1}, "--draft-num-kv-blocks must be >= 2"),
])
def test_bad_draft_options_fail_at_startup(make_llm, kw, message):
    with pytest.raises(NextokError, match=message):
        make_llm(**kw)


@pytest.mark.parametrize("args, message", [
    (["--speculative", "draft"], "--speculative draft needs --draft-model"),
    (["--speculative", "self-draft", "--self-draft-layers", "30"], "--self-draft-layers must be in"),
])
def test_cli_draft_errors_are_one_line(model_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "nextok", "generate", "x", "--model", model_path,
                           *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
