"""A server started with --speculative ngram: /v1/code/complete and /v1/completions speculate by
default, give what the plain server gives (greedy), and /metrics counts drafts per method."""
from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MAIN_KEY, ServerProcess, metric_value
from tests.server.test_code_api import STACK, complete

EDIT = ("def area(width, height):\n    return width * height\n\n\n"
        "# the same function, with width renamed to w\ndef area(w, height):\n    return")


@pytest.fixture(scope="module")
def spec_http(model_path, key_file, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("spec-server") / "server.log")
    proc = ServerProcess(["--api-key-file", key_file, "--speculative", "ngram",
                          "--num-speculative-tokens", "5"], log, model_path)
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, headers={"Authorization": f"Bearer {MAIN_KEY}"},
                          timeout=120) as c:
            yield c
    finally:
        proc.stop()


def test_speculating_server_equals_plain_and_counts_drafts(spec_http, http):
    for body in ({"prefix": STACK, "suffix": "", "language": "python", "mode": "multi_line"},
                 {"prefix": EDIT, "suffix": "", "language": "python", "mode": "single_line"}):
        assert complete(spec_http, **body)["completion"] == complete(http, **body)["completion"]
    req = {"prompt": EDIT, "max_tokens": 40, "temperature": 0}
    a = spec_http.post("/v1/completions", json=req).json()["choices"][0]["text"]
    b = http.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert a == b
    text = spec_http.get("/metrics").text
    steps = metric_value(text, "nextok:spec_decode_num_verify_steps_total", method="ngram")
    drafts = metric_value(text, "nextok:spec_decode_num_draft_tokens_total", method="ngram")
    accepted = metric_value(text, "nextok:spec_decode_num_accepted_tokens_total", method="ngram")
    assert steps > 0 and drafts >= steps and 0 < accepted <= drafts
    # The plain server exports no speculation samples.
    assert metric_value(http.get("/metrics").text, "nextok:spec_decode_num_verify_steps_total") == 0
