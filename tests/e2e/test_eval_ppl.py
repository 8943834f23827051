"""`nextok eval ppl` on CPU with the default model in float32: one CLI run (one engine) whose
perplexity must equal transformers' on the same windows, computed here independently in the
usual sliding-window loop; the JSON's fields; bad input failing before any model loads."""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
import torch

from nextok.cli import main

CONTEXT, STRIDE = 128, 64
MAX_TOKENS = 1250  # all of the first eval file (1189 scored) and the start of the second


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("ppl") / "ppl.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["eval", "ppl", "--model", model_path, "--dtype", "float32", "--dataset", "code",
                   "--context", str(CONTEXT), "--stride", str(STRIDE), "--max-tokens", str(MAX_TOKENS),
                   "--kv-cache-memory", "64MiB", "--output", str(out)])
    assert rc == 0
    return json.loads(out.read_text()), stdout.getvalue()


def hf_nll_sum(model, ids: list[int]) -> tuple[float, int]:
    """The textbook loop: windows of CONTEXT tokens every STRIDE; each scores the tokens past the
    previous window's end (the first: all but token 0)."""
    total, scored, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), STRIDE):
        end = min(begin + CONTEXT, len(ids))
        x = torch.tensor([ids[begin:end]])
        with torch.inference_mode():
            logp = model(x).logits[0, :-1].float().log_softmax(-1)  # row i predicts token begin + i + 1
        targets = x[0, 1:]
        nll = -logp.gather(1, targets[:, None])[:, 0]
        new = min(end - prev_end, end - begin - 1)  # the window's own first token has no logits
        total += nll[-new:].double().sum().item()
        scored += new
        prev_end = end
        if end == len(ids):
            break
    return total, scored


def test_perplexity_equals_transformers_on_the_same_windows(cli_run, hf_model, model_path):
    from nextok.eval.ppl import load_documents
    from nextok.tokenizer import Tokenizer

    r, _ = cli_run
    docs = load_documents("code", Tokenizer.from_gguf(model_path), MAX_TOKENS)
    assert [d[0] for d in docs] == [f["file"] for f in r["per_file"]]
    sums = [hf_nll_sum(hf_model, ids) for _, ids in docs]
    assert [n for _, n in sums] == [f["tokens"] for f in r["per_file"]]
    assert sum(n for _, n in sums) == r["tokens_scored"] == MAX_TOKENS
    for (hf_sum, n), f in zip(sums, r["per_file"]):
        assert f["nll_sum"] / n == pytest.approx(hf_sum / n, rel=1e-4)
    hf_ppl = math.exp(sum(s for s, _ in sums) / MAX_TOKENS)
    print(f"nextok ppl {r['ppl']:.6f}, transformers ppl {hf_ppl:.6f}, "
          f"relative difference {r['ppl'] / hf_ppl - 1:.2e}")
    assert r["ppl"] == pytest.approx(hf_ppl, rel=1e-3)


def test_json_has_the_run_its_setting_and_its_cost(cli_run):
    r, stdout = cli_run
    assert r["benchmark"] == "eval_ppl" and {"machine", "commit", "command", "nextok_version"} <= set(r)
    assert (r["dataset"], r["split"], r["context"], r["stride"]) == ("code", "eval", CONTEXT, STRIDE)
    assert (r["dtype"], r["device"], r["quantization"]) == ("float32", "cpu", None)
    assert r["files"] == len(r["per_file"]) == 2 and r["python_version"].count(".") == 2
    assert r["tokens_scored"] == MAX_TOKENS == r["max_tokens"]
    assert r["ppl"] == pytest.approx(math.exp(r["nll_mean"]))
    assert 1 < r["ppl"] < 100  # real code under a real (small) model
    assert r["seconds"] > 0 and r["tokens_per_s"] == pytest.approx(MAX_TOKENS / r["seconds"])
    assert 530e6 < r["weight_bytes"] < 545e6 and r["peak_rss_mib"] > 0
    # the first file's 1190 tokens: 18 windows scoring 127 + 16 * 64 + 38, fed 127 each but the
    # last (101: 1088..1188); the second file, cut to 62 tokens: 1 window fed 61
    assert r["windows"] == 19 and r["tokens_fed"] == 17 * 127 + 101 + 61
    assert "perplexity" in stdout and f"{r['ppl']:.4f}" in stdout


@pytest.mark.parametrize("flags,message", [
    (["--context", "1"], "--context must be >= 2"),
    (["--stride", "0"], "--stride must be in"),
    (["--context", "64", "--stride", "65"], "--stride must be in"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--dataset", "wikitext"], "unknown dataset 'wikitext'")])
def test_bad_input_fails_with_one_line_before_loading(flags, message, capsys):
    rc = main(["eval", "ppl", "--model", "/nonexistent.gguf", *flags])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
