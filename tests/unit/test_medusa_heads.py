"""Medusa heads on tiny random models (spec/medusa_heads.py, spec/medusa_train.py): a few training
steps lower the heads' loss on their windows; the written file loads back bit-exactly; heads made
for another model (hidden size, vocabulary, weights) are refused with what differs, and the CLI
says so in one line."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nextok.cli import main
from nextok.errors import NextokError
from nextok.spec.medusa_heads import FILE_NAME, MedusaHeads, load_heads
from nextok.spec import medusa_train
from nextok.spec.medusa_train import head_loss, hidden_pool, targets, train, training_windows

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "vocab_size": 49152}


def _tiny_llm(tmp_path, model_path, name, seed=0, **changes):
    from nextok import LLM

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, **changes}))
    return LLM(model=str(d), load_format="dummy", tokenizer=model_path, dtype="float32",
               num_kv_blocks=8, enable_prefix_caching=False, seed=seed, cpu_kernels=False)


def _args(out, **kw):
    base = dict(out=str(out), data="code", steps=12, heads=3, projection="shared", labels="data",
                lr=5e-2, batch=4, seq_len=32, generate=0, pool_windows=8, windows_per_file=2, val_windows=2,
                seed=0)
    return SimpleNamespace(**{**base, **kw})


def _pool_loss(heads, pool, base_weight) -> float:
    idx = torch.arange(pool["ids"].shape[0])
    h = pool["hidden"].float()
    return sum(head_loss(heads, i, h, targets(pool, idx, i, "data"), base_weight).item()
               for i in range(heads.num_heads))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_path):
    tmp = tmp_path_factory.mktemp("medusa")
    llm = _tiny_llm(tmp, model_path, "base")
    out = tmp / "heads"
    result = train(llm, _args(out))
    return SimpleNamespace(llm=llm, out=out, result=result, tmp=tmp)


def test_training_lowers_the_heads_loss(tiny):
    model = tiny.llm.engine.runner.model
    windows = training_windows(tiny.llm.get_tokenizer(), 32, 2, 10, 0)[2:]  # the training pool
    pool = hidden_pool(tiny.llm, windows)
    fresh = MedusaHeads(3, 64, 49152)
    with torch.no_grad():
        before = _pool_loss(fresh, pool, model.embed_tokens.weight)
        after = _pool_loss(tiny.result["heads"], pool, model.embed_tokens.weight)
    assert after < before - 1.0, (before, after)  # nats, summed over the 3 heads
    log = json.loads((tiny.out / "training.json").read_text())
    assert len(log["loss_curve"]) == 12 and len(log["head_accuracy"]) == 3
    assert {"commit", "command", "machine"} <= log.keys()  # where and how it was trained


def test_windows_in_one_forward_equal_one_at_a_time(tiny):
    """hidden_pool's batches: B windows as B prefills of one step (each on its own blocks of the
    pool, 3 here: 7 free blocks, 2 a window) give each window's hidden states alone."""
    from nextok.eval.ppl import WindowScorer

    scorer = WindowScorer(tiny.llm, 33)
    assert scorer.max_windows == 3 and scorer.batch_size(32) == 3
    ids = torch.randint(0, 49152, (3, 32), generator=torch.Generator().manual_seed(1))
    many = scorer.hidden_many(ids)
    assert many.shape == (3, 32, 64)
    for i in range(3):
        torch.testing.assert_close(many[i], scorer.hidden(ids[i]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="holds 3"):
        scorer.hidden_many(torch.zeros(4, 32, dtype=torch.long))


@pytest.mark.parametrize("native", [True, False])
def test_heads_loss_in_bfloat16_only_where_the_cpu_has_it(monkeypatch, native):
    """The vocabulary projection runs in bfloat16 on a CPU with native bfloat16 only: torch
    emulates it on an AVX2 CPU, 27x slower than float32 (the e2e test's training ran for 30
    minutes instead of seconds). Without it the logits stay float32."""
    monkeypatch.setattr(medusa_train, "cpu_has_native_bf16", lambda: native)
    with medusa_train.bf16_autocast(torch.device("cpu")):
        logits = torch.nn.functional.linear(torch.randn(3, 8), torch.randn(5, 8))
    assert logits.dtype == (torch.bfloat16 if native else torch.float32)


def test_targets_are_two_and_more_places_ahead():
    """Head i at position t: the data's token t + 2 + i, or the model's guess made at t + 1 + i."""
    ids = torch.arange(10).unsqueeze(0)  # token t at position t
    pool = {"ids": ids, "greedy": ids + 100}  # the model's guess at t: 100 + t
    idx = torch.tensor([0])
    assert targets(pool, idx, 0, "data").tolist() == [list(range(2, 10))]
    assert targets(pool, idx, 2, "data").tolist() == [list(range(4, 10))]
    assert targets(pool, idx, 2, "model").tolist() == [list(range(103, 109))]


def test_fresh_head_is_the_base_head():
    """W_i = 0, b_i = 0: every head's logits are the base projection of h itself."""
    torch.manual_seed(0)
    proj = torch.randn(100, 16)
    h = torch.randn(5, 16)
    for projection in ("shared", "own"):
        heads = MedusaHeads(2, 16, 100, projection, proj)
        got = heads.logits(h, lambda x: x @ proj.T)
        assert torch.allclose(got, (h @ proj.T).unsqueeze(1).expand(5, 2, 100), atol=1e-5)


def test_saved_heads_load_back_bit_exactly(tiny):
    trained = tiny.result["heads"]
    loaded = load_heads(str(tiny.out), tiny.llm.engine.runner.model)
    assert loaded.num_heads == 3 and loaded.projection == "shared"
    for name, p in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    # the file itself names the same heads
    assert load_heads(str(tiny.out / FILE_NAME), tiny.llm.engine.runner.model).num_heads == 3


def test_own_projection_trains_and_loads_back(tiny, tmp_path):
    out = tmp_path / "own"
    result = train(tiny.llm, _args(out, steps=2, heads=2, projection="own", generate=8, labels="model"))
    loaded = load_heads(str(out), tiny.llm.engine.runner.model)
    assert loaded.proj is not None and loaded.proj.shape == (2, 49152, 64)
    assert torch.equal(loaded.proj, result["heads"].proj)


@pytest.mark.parametrize("name, changes, seed, says", [
    ("wider", {"hidden_size": 96}, 0, "hidden_size 64 != this model's 96"),
    ("bigger-vocab", {"vocab_size": 50000}, 0, "vocab_size 49152 != this model's 50000"),
    ("deeper", {"num_hidden_layers": 3}, 0, "num_hidden_layers 2 != this model's 3"),
    ("reseeded", {}, 1, "embedding fingerprint"),
])
def test_heads_of_another_model_are_refused(tiny, model_path, tmp_path, name, changes, seed, says):
    other = _tiny_llm(tmp_path, model_path, name, seed=seed, **changes)
    with pytest.raises(NextokError, match="trained for another model") as e:
        load_heads(str(tiny.out), other.engine.runner.model)
    assert says in str(e.value)


def test_cli_refuses_bad_heads_in_one_line(tiny, model_path, capsys):
    base = ["generate", "x", "--max-tokens", "2", "--model", str(tiny.tmp / "base"),
            "--load-format", "dummy", "--tokenizer", model_path, "--num-kv-blocks", "8",
            "--speculative", "medusa"]
    cases = [([], "needs --medusa-heads"),
             (["--medusa-heads", str(tiny.tmp / "nowhere")], "no such file"),
             (["--medusa-heads", str(tiny.out / "training.json")], "cannot read")]
    wider = tiny.tmp / "wider"
    wider.mkdir()
    (wider / "config.json").write_text(json.dumps({**TINY, "hidden_size": 96}))
    cases.append((["--medusa-heads", str(tiny.out), "--model", str(wider)], "hidden_size 64"))
    for extra, says in cases:
        assert main(base + extra) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and "Traceback" not in err, err
