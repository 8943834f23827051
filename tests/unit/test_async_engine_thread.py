"""AsyncEngine.build_in_thread: the engine is built in the thread that then steps it (so its
OpenMP team is the only one: see AsyncEngine's docstring), serves requests once started, and a
failed build is raised to the caller."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from nextok import SamplingParams
from nextok.engine.async_engine import AsyncEngine
from nextok.engine.factory import EngineArgs, create_engine

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "vocab_size": 49152}


def test_built_and_stepped_in_one_thread(tmp_path, model_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    threads = {}

    def build():
        threads["build"] = threading.get_ident()
        return create_engine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer=model_path,
                                        dtype="float32", num_kv_blocks=32))

    def on_step(outputs, stats):
        threads.setdefault("step", threading.get_ident())

    engine = AsyncEngine.build_in_thread(build, on_step=on_step)
    assert "build" in threads and not engine.is_running  # built, waiting for start()
    # the detokenizer's byte table is built with the engine, not on the first request
    assert "_byte_pieces" in vars(engine.engine.tokenizer)

    async def serve():
        engine.start()
        assert engine.is_running
        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        return [out async for out in engine.add("r1", [100, 200, 300], params)]

    try:
        outs = asyncio.run(serve())
    finally:
        engine.shutdown()
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 5
    assert threads["step"] == threads["build"] != threading.get_ident()
    assert not engine._thread.is_alive()


def test_a_failed_build_is_raised_and_shutdown_before_start_returns(tmp_path, model_path):
    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine.build_in_thread(broken)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    engine = AsyncEngine.build_in_thread(lambda: create_engine(EngineArgs(
        model=str(tmp_path), load_format="dummy", tokenizer=model_path, num_kv_blocks=32)))
    engine.shutdown(timeout=10)  # never started: its thread ends at once
    assert not engine._thread.is_alive() and not engine.is_running


def test_a_request_not_streamed_comes_out_once_finished(tmp_path, model_path):
    """streamed=False (the server's non-streamed responses): the one output is the finished one,
    with the text and tokens a streamed twin gets; stop strings still cut it."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    engine = AsyncEngine.build_in_thread(lambda: create_engine(EngineArgs(
        model=str(tmp_path), load_format="dummy", tokenizer=model_path, dtype="float32", num_kv_blocks=64)))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    async def serve():
        engine.start()
        runs = {}
        for rid, stream in (("streamed", True), ("whole", False)):
            runs[rid] = [out async for out in engine.add(rid, [100, 200, 300], params, streamed=stream)]
        streamed_text = runs["streamed"][-1].outputs[0].text
        stop = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[streamed_text[3:6]])
        for rid, stream in (("stop-streamed", True), ("stop-whole", False)):
            runs[rid] = [out async for out in engine.add(rid, [100, 200, 300], stop, streamed=stream)]
        return runs

    try:
        runs = asyncio.run(serve())
    finally:
        engine.shutdown()
    # the streamed twin: an output a step, fewer where its reader fell behind (RequestStream joins
    # those queued meanwhile), their deltas adding up to the whole
    streamed = runs["streamed"]
    assert len(streamed) <= 12 and len(streamed[-1].outputs[0].token_ids) == 12
    assert sum((o.outputs[0].delta_token_ids for o in streamed), []) == streamed[-1].outputs[0].token_ids
    assert len(runs["whole"]) == len(runs["stop-whole"]) == 1
    for streamed, whole in (("streamed", "whole"), ("stop-streamed", "stop-whole")):
        a, b = runs[streamed][-1], runs[whole][0]
        assert b.finished and b.outputs[0].text == a.outputs[0].text
        assert b.outputs[0].token_ids == a.outputs[0].token_ids and b.outputs[0].finish_reason == a.outputs[0].finish_reason
        assert b.metrics["arrival"] <= b.metrics["first_token"] <= b.metrics["finished"]
    assert runs["stop-whole"][0].outputs[0].finish_reason == "stop"
    assert len(runs["stop-whole"][0].outputs[0].token_ids) < 12
