"""RequestStream: a reader that fell behind gets the outputs queued meanwhile as one, with their
deltas joined; an abort or a failure queued after them still comes, after them."""
from __future__ import annotations

import asyncio

import pytest

from nextok.engine.async_engine import EngineDeadError, RequestStream
from nextok.outputs import CompletionOutput, RequestOutput

WORDS = ["def", " f", "(x", "):", "\n   ", " return", " x"]


def outputs(n: int = 1, steps: int = len(WORDS)) -> list[RequestOutput]:
    """Cumulative outputs of `steps` steps, one word (id 100 + step) each, for n sequences
    (sequence i's words end in i '#')."""
    outs = []
    for k in range(steps):
        last = k == steps - 1
        comps = [CompletionOutput(index=i, text="".join(w + "#" * i for w in WORDS[:k + 1]),
                                  token_ids=[100 + j for j in range(k + 1)],
                                  finish_reason="length" if last else None,
                                  delta_text=WORDS[k] + "#" * i, delta_token_ids=[100 + k])
                 for i in range(n)]
        outs.append(RequestOutput("r", None, [1, 2], comps, finished=last))
    return outs


def read(items, keep_up: bool = False) -> tuple[list, RequestStream, BaseException | None]:
    """Queues `items` (all at once, or one before each read with keep_up) and reads the stream."""
    async def go():
        stream = RequestStream(engine=None, request_id="r")
        got, pending = [], list(items)
        if not keep_up:
            for it in pending:
                stream.queue.put_nowait(it)
            pending = []
        try:
            while True:
                if pending:
                    stream.queue.put_nowait(pending.pop(0))
                got.append(await stream.__anext__())
        except StopAsyncIteration:
            return got, stream, None
        except (RuntimeError, EngineDeadError) as e:
            return got, stream, e

    return asyncio.run(go())


def joined_text(got: list[RequestOutput], i: int = 0) -> str:
    return "".join(out.outputs[i].delta_text for out in got)


def test_a_reader_that_keeps_up_gets_every_output():
    outs = outputs()
    got, stream, err = read(outs, keep_up=True)
    assert got == outs and err is None and stream.finished and stream.last is outs[-1]


@pytest.mark.parametrize("n", [1, 2])
def test_outputs_queued_meanwhile_come_as_one(n):
    outs = outputs(n)
    got, stream, err = read(outs)
    assert len(got) == 1 and err is None and got[0].finished and stream.finished
    for i in range(n):
        o = got[0].outputs[i]
        assert o.text == outs[-1].outputs[i].text == joined_text(got, i)
        assert o.delta_token_ids == o.token_ids == [100 + k for k in range(len(WORDS))]
        assert o.finish_reason == "length"


def test_an_abort_after_queued_outputs_comes_after_them():
    outs = outputs()[:4]
    got, stream, err = read(outs + ["cancelled"])
    assert len(got) == 1 and joined_text(got) == "".join(WORDS[:4]) and got[0].outputs[0].delta_token_ids == [100, 101, 102, 103]
    assert err is None and stream.aborted == "cancelled" and stream.finished
    assert stream.last is got[0]


def test_a_failure_after_queued_outputs_is_raised_after_them():
    outs = outputs()[:3]
    failed = RequestOutput("r", None, [1, 2], [], finished=True, error="ValueError: bad state")
    got, _, err = read(outs + [failed])
    assert len(got) == 1 and joined_text(got) == "".join(WORDS[:3])
    assert isinstance(err, RuntimeError) and "bad state" in str(err)
    got, _, err = read(outs[:2] + [EngineDeadError("the engine loop has stopped")])
    assert len(got) == 1 and joined_text(got) == "".join(WORDS[:2]) and isinstance(err, EngineDeadError)
