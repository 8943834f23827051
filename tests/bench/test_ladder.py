"""`nextok bench ladder`: the arithmetic of a row, the editor workload, the plots, and the
transformers baseline server (a tiny random Llama over the real tokenizer, so it runs in seconds)."""
from __future__ import annotations

import asyncio
import json

import pytest

from nextok.bench import ladder_report as R
from nextok.bench.ladder import STEPS, editor_prompt_sets, parse_rates

SLO_MS = 4000.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def summary(p99: float, *, failed: int = 0, n: int = 10, rate: float = 1.0, out_tps: float = 32.0) -> dict:
    dist = {"mean": p99 / 2, "median": p99 / 2, "std": 1.0, "p50": p99 / 2, "p90": p99 * 0.9, "p99": p99}
    return {"num_requests": n, "completed": n - failed, "failed": failed, "request_throughput": rate,
            "output_throughput": out_tps, "total_input_tokens": 4000, "e2e_ms": dist,
            "ttft_ms": {k: v / 4 for k, v in dist.items()}}


def point(rate, p99, **kw) -> dict:
    return {"rate": rate, "summary": summary(p99, rate=rate * 0.9, out_tps=rate * 30, **kw)}


# ---- arithmetic -------------------------------------------------------------------------------
def test_cost_per_million_output_tokens():
    # $0.36/h = $0.0001/s; at 100 tok/s a million tokens take 10,000 s: $1.
    assert R.cost_per_million(0.36, 100.0) == pytest.approx(1.0)
    assert R.cost_per_million(0.10, 50.0) == pytest.approx(0.10 / 3600 / 50 * 1e6)
    assert R.cost_per_million(0.10, 0.0) is None


def test_operating_point_is_the_highest_rate_within_the_slo():
    points = [point(0.25, 900), point(0.5, 2500), point(1.0, 3999), point(2.0, 4001)]
    op = R.operating_point(points, SLO_MS, usd_per_hour=0.36)
    assert op["met_slo"] and op["qps_at_slo"] == 1.0 and op["rate"] == 1.0
    assert op["p99_e2e_ms"] == 3999 and op["p50_e2e_ms"] == 3999 / 2
    assert op["request_throughput"] == pytest.approx(0.9)
    assert op["cost_per_1m_output_usd"] == pytest.approx(0.36 / 3600 / 30.0 * 1e6)


def test_a_rate_with_failed_requests_never_counts():
    points = [point(0.5, 1000), point(1.0, 1000, failed=1)]
    assert R.operating_point(points, SLO_MS, 0.1)["qps_at_slo"] == 0.5
    # the highest passing rate wins even when a lower one (noise) missed
    points = [point(0.5, 5000), point(1.0, 3000)]
    assert R.operating_point(points, SLO_MS, 0.1)["qps_at_slo"] == 1.0


def test_no_rate_within_the_slo_reports_the_lowest_rate_flagged():
    op = R.operating_point([point(1.0, 9000), point(0.5, 6000)], SLO_MS, 0.1)
    assert not op["met_slo"] and op["qps_at_slo"] is None and op["rate"] == 0.5
    assert op["p99_e2e_ms"] == 6000
    assert R.operating_point([], SLO_MS, 0.1) is None


def test_sweep_stops_once_the_slo_is_missed_widely_or_requests_fail():
    assert not R.should_stop(summary(7000), SLO_MS, stop_factor=2.0)
    assert R.should_stop(summary(8001), SLO_MS, stop_factor=2.0)
    assert R.should_stop(summary(100, failed=1), SLO_MS, stop_factor=2.0)


def test_parse_rates_sorts_and_rejects_nonsense():
    assert parse_rates("1, 0.25,0.5") == [0.25, 0.5, 1.0]
    for bad in ("", "0", "-1", "inf"):
        with pytest.raises(ValueError):
            parse_rates(bad)


# ---- the table --------------------------------------------------------------------------------
def ladder_result() -> dict:
    measured = {"key": "chunked", "label": "+ chunked prefill", "status": "measured", "notes": "",
                "peak_rss_mib": 1234.4, "other_processes_cpu_s": 1.5, "server_cpu_s": 60.0, "sweep_s": 40.0,
                "cached_prompt_fraction": 0.5,
                "sweep": [dict(point(0.5, 1000), requests=[{"ok": True, "latency": 0.8, "ttft": 0.1, "output_len": 32}]),
                          dict(point(1.0, 3000), requests=[{"ok": True, "latency": 2.9, "ttft": 0.2, "output_len": 32}])]}
    measured["operating_point"] = R.operating_point(measured["sweep"], SLO_MS, 0.10)
    missed = {"key": "transformers", "label": "transformers, one request at a time", "status": "measured",
              "notes": "", "peak_rss_mib": 900.0, "other_processes_cpu_s": 0.0, "server_cpu_s": 50.0,
              "sweep_s": 50.0, "cached_prompt_fraction": 0.0,
              "sweep": [dict(point(0.25, 9000), requests=[{"ok": True, "latency": 9.0, "ttft": 5, "output_len": 32}])]}
    missed["operating_point"] = R.operating_point(missed["sweep"], SLO_MS, 0.10)
    not_yet = {"key": "spec", "label": "+ speculative decoding", "status": R.NOT_YET, "notes": ""}
    failed = {"key": "paged", "label": "+ paged KV and prefix caching", "status": "failed", "notes": "",
              "error": "server exited with 1 while starting"}
    return {"time_utc": "2026-12-03T12:00:00Z", "commit": "0123456789abcdef", "dirty": False, "command": "nextok bench ladder",
            "machine": {"cpu_model": "Test CPU", "cpu_count_usable": 2}, "benchmark": "ladder",
            "config": {"num_threads": 2, "dtype": "float32", "model": "m.gguf", "workload_description": "w",
                       "slo_p99_e2e_ms": SLO_MS, "rates": [0.25, 0.5, 1.0], "seed": 0, "usd_per_hour": 0.10},
            "rows": [missed, measured, failed, not_yet]}


def test_table_rows_say_what_was_measured_and_nothing_else():
    rows = ladder_result()["rows"]
    missed, measured, failed, not_yet = (R.table_row(r) for r in rows)
    assert all(len(cells) == len(R.COLUMNS) for cells in (missed, measured, failed, not_yet))
    assert measured[:5] == ["+ chunked prefill", "1", "0.90", "1500", "3000"]
    assert measured[6] == "1234" and measured[8] == f"{0.10 / 3600 / 30.0 * 1e6:.3f}"
    assert missed[1] == "none (≥ 0.25)" and missed[4] == "9000 †"
    assert not_yet == ["+ speculative decoding"] + ["not yet"] * (len(R.COLUMNS) - 1)
    assert failed[1].startswith("failed: server exited") and set(failed[2:]) == {""}


def test_markdown_holds_the_table_the_flag_note_and_row_notes():
    md = R.format_markdown(ladder_result())
    lines = md.splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 4 and all(line.count("|") == len(R.COLUMNS) + 1 for line in table)
    assert "† no swept rate met the SLO" in md
    assert "50% of prompt tokens served from the prefix cache" in md
    assert "other processes used 1.5 CPU-s" in md


def test_the_ladder_has_its_steps_in_order_with_later_steps_not_built():
    assert [s.key for s in STEPS] == ["transformers", "batching", "paged", "chunked", "quant", "spec"]
    assert [s.server for s in STEPS[-2:]] == [None, None]
    flags = {s.key: s.flags for s in STEPS}
    assert "--no-prefix-caching" in flags["batching"] and "--no-chunked-prefill" in flags["batching"]
    assert "--no-prefix-caching" not in flags["paged"] and "--no-chunked-prefill" in flags["paged"]
    assert flags["chunked"] == ()


# ---- workload ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(model_path):
    from nextok.tokenizer import Tokenizer

    return Tokenizer.from_gguf(model_path)


def test_editor_workload_is_deterministic_shared_and_in_range(tokenizer):
    sets = editor_prompt_sets(tokenizer, num_sets=3, num_requests=10, prompts_per_file=4,
                              min_len=100, max_len=200, seed=7)
    assert sets == editor_prompt_sets(tokenizer, 3, 10, 4, 100, 200, seed=7)
    assert sets != editor_prompt_sets(tokenizer, 3, 10, 4, 100, 200, seed=8)
    num_files = 3  # ceil(10 / 4)
    for prompts in sets:
        assert len(prompts) == 10 and all(100 <= len(p) <= 200 for p in prompts)
        for f in range(num_files):  # round-robin: file f's prompts sit at f, f + 3, f + 6, ...
            mine = prompts[f::num_files]
            for shorter, longer in zip(mine, mine[1:]):
                assert len(shorter) < len(longer) and longer[:len(shorter)] == shorter
        for a, b in zip(prompts, prompts[1:]):  # neighbours come from different files
            assert a[:50] != b[:50]
    # every set has the same lengths, but its own files: no prefix carries over between rates
    assert [len(p) for p in sets[1]] == [len(p) for p in sets[2]]
    starts = [{tuple(p[:32]) for p in s} for s in sets]
    assert not (starts[0] & starts[1]) and not (starts[1] & starts[2])


# ---- plots ------------------------------------------------------------------------------------
def test_plots_write_png_files(tmp_path):
    pytest.importorskip("matplotlib")
    from nextok.bench import plots

    paths = plots.draw_ladder(ladder_result(), str(tmp_path / "ladder"))
    paths.append(plots.throughput_vs_rate([("a", [(1, 30.0), (2, 55.0)])], str(tmp_path / "t.png"),
                                          ylabel="output tokens/s"))
    paths.append(plots.latency_cdf({"a": [1.0, 2.0, 5.0], "empty": []}, str(tmp_path / "c.png"), slo_ms=4))
    assert len(paths) == 6
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == PNG_MAGIC


def test_plot_command_redraws_saved_results(tmp_path):
    pytest.importorskip("matplotlib")
    from nextok.cli import main

    ladder_json = tmp_path / "ladder.json"
    ladder_json.write_text(json.dumps(ladder_result()))
    serve_json = tmp_path / "serve.json"
    serve_json.write_text(json.dumps({"summary": {}, "requests": [
        {"ok": True, "latency": 0.5, "ttft": 0.1, "output_len": 8},
        {"ok": False, "latency": 0.0, "ttft": 0.0, "output_len": 0}]}))
    assert main(["bench", "plot", str(ladder_json), str(serve_json), "--output-dir", str(tmp_path / "out")]) == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["ladder-bars.png", "ladder-cdf.png", "ladder-e2e-cdf.png", "ladder-p99.png",
                     "ladder-throughput.png", "ladder-ttft-cdf.png"]


# ---- the transformers baseline server ---------------------------------------------------------
@pytest.fixture(scope="module")
def hf_app(tokenizer):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nextok.bench.hf_server import SerialGenerator, build_app

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    return build_app(SerialGenerator(model, list(tokenizer.eos_token_ids)), tokenizer, "tiny"), model


def events(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_hf_server_streams_chunks_with_usage_last(hf_app, tokenizer):
    import torch
    from fastapi.testclient import TestClient

    app, model = hf_app
    prompt = tokenizer.encode("def fibonacci(n):", add_special_tokens=False)
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with TestClient(app) as client:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev = events(r.text)
        assert ev[-1] == "[DONE]"
        usage_chunk, last = ev[-2], ev[-3]
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["prompt_tokens"] == len(prompt)
        assert usage_chunk["usage"]["completion_tokens"] == 6 and usage_chunk["usage"]["total_tokens"] == len(prompt) + 6
        assert last["choices"][0]["finish_reason"] == "length"
        assert all(e["object"] == "text_completion" and e["id"] == ev[0]["id"] for e in ev[:-1])
        text = "".join(c["text"] for e in ev[:-2] for c in e["choices"])
        with torch.inference_mode():  # the same greedy tokens generate() gives directly
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                                 do_sample=False, pad_token_id=0)
        assert text == tokenizer.decode(out[0, len(prompt):].tolist())
        # a text prompt, not streamed: one response with usage; no usage chunk unless asked
        r = client.post("/v1/completions", json={"prompt": "import os", "max_tokens": 3, "temperature": 0,
                                                 "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["finish_reason"] == "length"
        r = client.post("/v1/completions", json={**body, "stream_options": None})
        assert all("usage" not in e for e in events(r.text)[:-1])
        assert client.post("/v1/completions", json={"prompt": [], "max_tokens": 3}).status_code == 400
        assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
        assert client.get("/health").status_code == 200


def test_hf_server_serves_one_request_at_a_time_to_the_bench_client(hf_app, tokenizer):
    import httpx

    from nextok.bench.load import BenchRequest, HttpBackend, run_load

    app, _ = hf_app
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("x = 1", "class A:", "for i in")]

    async def go():
        backend = HttpBackend("http://hf")
        await backend.client.aclose()
        backend.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://hf")
        try:  # all three at once: two must wait for the lock
            return await run_load(backend, [BenchRequest(p, len(p), 5, ignore_eos=True) for p in prompts])
        finally:
            await backend.aclose()

    results, _ = asyncio.run(go())
    assert [(r.ok, r.output_len, r.prompt_len) for r in results] == [(True, 5, len(p)) for p in prompts]
    assert app.state.generator.max_active == 1


def test_a_saved_ladder_is_reported_again_under_a_looser_slo(tmp_path):
    import argparse

    from nextok.bench import ladder

    saved = ladder_result()
    saved["config"]["stop_factor"] = 4.0  # sweeps ran until P99 > 4 x SLO_MS
    path = tmp_path / "2026-12-03-ladder.json"
    path.write_text(json.dumps(saved))
    args = argparse.Namespace(from_result=str(path), name=None, output_dir="benchmarks/results", plots=False,
                              slo_p99_e2e=f"{SLO_MS * 3}ms")
    assert ladder.run(args) == 0
    again = json.loads((tmp_path / f"2026-12-03-ladder-slo{SLO_MS * 3 / 1000:g}s.json").read_text())
    rows = {r["key"]: r for r in again["rows"]}
    # 9000 ms now meets 3 x SLO_MS for the one-at-a-time row; the chunked row keeps its best rate
    assert rows["transformers"]["operating_point"]["qps_at_slo"] == (0.25 if 9000 <= SLO_MS * 3 else None)
    assert rows["chunked"]["operating_point"]["qps_at_slo"] == 1.0
    assert again["config"]["measured_with_slo_p99_e2e_ms"] == SLO_MS
    assert "reported again from" in (tmp_path / f"2026-12-03-ladder-slo{SLO_MS * 3 / 1000:g}s.md").read_text()
    args.slo_p99_e2e = f"{SLO_MS * 5}ms"  # beyond what the sweeps measured
    with pytest.raises(ValueError, match="did not measure"):
        ladder.run(args)
