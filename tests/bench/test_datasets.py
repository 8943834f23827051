"""Prompt sets of the benchmarks: exact lengths in the model's tokens, seeded, from real code."""
from __future__ import annotations

import os

import pytest

from nextok.bench import datasets
from nextok.bench.compare import Workload, ratio_table
from nextok.bench.serve_bench import build_requests


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from nextok.tokenizer import Tokenizer

    return Tokenizer.from_gguf(model_path)


def test_random_prompts_have_exact_length_and_no_special_tokens(tokenizer):
    prompts = datasets.random_prompts(tokenizer, 8, 128, seed=3)
    assert len(prompts) == 8 and all(len(p) == 128 for p in prompts)
    special = set(tokenizer.all_special_ids)
    assert not special & {i for p in prompts for i in p}
    assert prompts == datasets.random_prompts(tokenizer, 8, 128, seed=3)
    assert prompts != datasets.random_prompts(tokenizer, 8, 128, seed=4)


def test_code_prompts_are_windows_of_real_stdlib_files(tokenizer):
    prompts = datasets.code_prompts(tokenizer, 6, 64, seed=0)
    assert all(len(p) == 64 for p in prompts)
    assert prompts == datasets.code_prompts(tokenizer, 6, 64, seed=0)
    corpus = {}
    for path in datasets.stdlib_files():
        text = tokenizer.decode(prompts[0])
        with open(path, encoding="utf-8", errors="replace") as f:
            if text in f.read():
                corpus[path] = True
                break
    assert corpus, "the first code prompt is not text of any stdlib file"


def test_bench_requests_ignore_eos_and_carry_token_ids(tokenizer):
    reqs = build_requests("random", tokenizer, 3, 16, 5, seed=0)
    assert [(r.prompt_len, r.max_tokens, r.ignore_eos) for r in reqs] == [(16, 5, True)] * 3
    assert all(isinstance(r.prompt, list) for r in reqs)
    with pytest.raises(ValueError):
        build_requests("nonsense", tokenizer, 1, 4, 4, seed=0)


def test_workload_spec_parsing():
    w = Workload.parse("random:128:64:8:16")
    assert (w.dataset, w.input_len, w.output_len, w.concurrency, w.num_requests) == ("random", 128, 64, 8, 16)
    assert w.name == "random 128->64 c=8"
    for bad in ("random:128:64:8", "sharegpt:1:1:1:1", "random:0:1:1:1", "random:a:1:1:1"):
        with pytest.raises(ValueError):
            Workload.parse(bad)


def test_compare_table_is_the_median_of_per_pair_ratios():
    w = Workload("random", 8, 8, 1, 1)

    def run(server, tput, ttft):
        return {"server": server, "workload": w.name,
                "summary": {"output_throughput": tput, "request_throughput": 1.0,
                            **{k: {"median": ttft, "p99": ttft} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}}}
    # pairs: (300 vs 100), (200 vs 100), (90 vs 30): ratios 3, 2, 3 -> median 3
    runs = [run("nextok", 300, 10), run("llama.cpp", 100, 40), run("nextok", 200, 20), run("llama.cpp", 100, 40),
            run("nextok", 90, 10), run("llama.cpp", 30, 10)]
    table = {r["figure"]: r for r in ratio_table(runs, [w])}
    tput = table["output tok/s"]
    assert tput["ratio_median"] == pytest.approx(3.0)
    assert (tput["ratio_min"], tput["ratio_max"], tput["pairs"]) == (pytest.approx(2.0), pytest.approx(3.0), 3)
    assert tput["nextok"] == 200 and tput["llama_cpp"] == 100  # medians of each side's runs
    assert table["TTFT P50 ms"]["ratio_median"] == pytest.approx(0.5)  # 0.25, 0.5, 1.0


def test_compare_against_a_second_nextok_names_it_as_the_peer():
    from nextok.bench.compare import markdown

    w = Workload("random", 8, 8, 1, 1)
    summary = {"output_throughput": 50.0, "request_throughput": 1.0, "duration_s": 1.0, "completed": 1,
               "failed": 0, **{k: {"median": 5.0, "p99": 5.0} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}}
    runs = [{"server": "nextok", "workload": w.name, "summary": dict(summary, output_throughput=60.0)},
            {"server": "nextok-baseline", "workload": w.name, "summary": summary},
            {"server": "llama.cpp", "workload": w.name, "summary": dict(summary, output_throughput=1.0)}]
    tput = {r["figure"]: r for r in ratio_table(runs, [w], "nextok-baseline")}["output tok/s"]
    assert tput["ratio_median"] == pytest.approx(1.2) and tput["pairs"] == 1  # llama.cpp's run ignored
    argv = ["python", "-m", "nextok", "serve", "--dtype", "bfloat16", "--no-gguf-blocks"]
    result = {"time_utc": "2026-12-04T00:00:00Z", "machine": {}, "commit": "abc", "dirty": False,
              "command": "nextok bench compare", "model": "m.gguf", "threads": 2, "parallel": 4,
              "peer": "nextok-baseline", "peer_argv": argv, "table": ratio_table(runs, [w], "nextok-baseline"),
              "runs": [dict(r, server_cpu_s=0, other_processes_cpu_s=0, steal_s=0) for r in runs[:2]]}
    md = markdown(result)
    assert "nextok vs nextok-baseline (`nextok serve --dtype bfloat16 --no-gguf-blocks`)" in md
    assert "| workload | figure | nextok | nextok-baseline |" in md


def test_compare_plots_are_pngs_per_workload_and_figure(tmp_path):
    from nextok.bench import plots

    w = {"dataset": "random", "input_len": 8, "output_len": 4, "concurrency": 2, "num_requests": 2}
    reqs = [{"ok": True, "ttft": 0.1 * i, "latency": 0.5 * i} for i in (1, 2)] + [{"ok": False, "ttft": 0, "latency": 9}]
    result = {"workloads": [w], "runs": [{"server": s, "workload": "random 8->4 c=2", "requests": reqs}
                                         for s in ("nextok", "llama.cpp", "nextok", "llama.cpp")]}
    paths = plots.draw_compare(result, str(tmp_path / "cmp"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["cmp-random-8-4-c2-ttft-cdf.png", "cmp-random-8-4-c2-e2e-cdf.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_stdlib_split_is_disjoint_complete_deterministic_and_about_one_in_ten():
    split = datasets.stdlib_split()
    ev, cal = split[datasets.EVAL_SPLIT], split[datasets.CALIBRATION_SPLIT]
    assert ev and cal and not set(ev) & set(cal)
    assert sorted(ev + cal) == sorted(datasets.stdlib_files())
    assert split == datasets.stdlib_split()
    assert 0.04 < len(ev) / (len(ev) + len(cal)) < 0.2
    assert ev == sorted(ev, key=lambda p: os.path.relpath(p, datasets.stdlib_root()))


def test_split_depends_only_on_the_relative_path():
    # pinned: a change of the hash rule would silently change every recorded perplexity
    assert datasets.split_of("_aix_support.py") == datasets.EVAL_SPLIT
    assert datasets.split_of("asyncio/locks.py") == datasets.EVAL_SPLIT
    assert datasets.split_of("os.py") == datasets.CALIBRATION_SPLIT
    assert datasets.split_of(os.path.join("asyncio", "locks.py")) == datasets.EVAL_SPLIT
