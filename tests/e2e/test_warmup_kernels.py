"""After the engine's warm-up (worker/warmup.py), serving launches no Triton kernel in a
specialization the warm-up did not: each new one is a compile of ~1-2 s in the middle of a
step on a GPU. Recorded here in Triton's interpreter: a launch's specialization is its
constexprs and launch options, its tensors' dtypes, and the class Triton gives each integer
argument it specializes on (1, a multiple of 16, other)."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from nextok import LLM, SamplingParams  # noqa: E402
from tests.e2e.test_triton_engine import CONFIG  # noqa: E402


def _spec(name: str, value, unspecialized) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, bool) or not isinstance(value, int) or name in unspecialized:
        return type(value).__name__
    return "1" if value == 1 else "D" if value % 16 == 0 else "i"


class Recorder:
    """Wraps the interpreter's launch: records (kernel, specialization) of every launch."""

    def __init__(self, monkeypatch):
        from triton.runtime.interpreter import InterpretedFunction

        self.keys: set = set()
        self.splits: set = set()  # the decode kernels' split counts, as launched
        original = InterpretedFunction.run
        recorder = self

        def run(fn, *args, grid, warmup, **kwargs):
            unspecialized = set(fn.kwargs.get("do_not_specialize") or ())
            names = [n for n in fn.arg_names if n not in kwargs]
            spec = tuple(_spec(n, a, unspecialized) for n, a in zip(names, args))
            recorder.keys.add((fn.__name__, spec, tuple(sorted((k, str(v)) for k, v in kwargs.items()))))
            if fn.__name__ == "_decode_split_kernel":
                recorder.splits.add(args[names.index("num_splits")])
            return original(fn, *args, grid=grid, warmup=warmup, **kwargs)

        monkeypatch.setattr(InterpretedFunction, "run", run)


def _assert_each_dot_class_in_both_integer_classes(counts: set[int]) -> None:
    """counts reach each of W4A16's tl.dot row classes (9-16, 17-32, ..., 129-256) with a count
    that is a multiple of 16 and one that is not: Triton compiles each apart."""
    from nextok.kernels.triton.w4a16_tiles import DOT_CLASSES

    lo = 9
    for cls in DOT_CLASSES:
        got = {t for t in counts if lo <= t <= int(cls)}
        assert any(t % 16 == 0 for t in got) and any(t % 16 for t in got), (cls, sorted(got))
        lo = int(cls) + 1


def test_warm_up_steps_cover_each_row_class_in_both_integer_classes():
    """The warm-up's step totals, on an engine of ordinary budgets, reach each kernel row class
    (1-8 rows, W4A16's tl.dot 9-16, 17-32, ..., 129-256) with a token count that is a multiple of 16
    and one that is not, where the class holds both: Triton compiles each apart."""
    from nextok.kernels.triton import quant_linear, w4a16
    from nextok.worker.warmup import steps_for

    totals = set(map(sum, steps_for(8192, 4096)))
    _assert_each_dot_class_in_both_integer_classes(totals)
    assert {t for t in totals if t <= 8} >= {2, 3, 5, 8}
    # and a step past every kernel's most rows: W4A16's prefill path (int4_words.dequantize)
    assert max(totals) > max(w4a16.MAX_ROWS, quant_linear.MAX_ROWS)
    # also within a 256-token context (the tiny test models')
    assert max(map(sum, steps_for(8192, 256))) > w4a16.MAX_ROWS


def test_the_lm_head_is_warmed_at_each_row_class_a_step_can_sample():
    """A quantized lm_head runs the W4A16 / W8A16 kernels at the rows a step samples (one a
    sequence, 1 + k with speculation): each row class in both integer classes, as far as the
    engine's max_num_seqs (and budget) reach, and no further than the kernels' rows."""
    from nextok.worker.warmup import logit_rows

    rows = set(logit_rows(2048, 256, 0))
    assert set(range(1, 18)) <= rows and max(rows) <= 256
    _assert_each_dot_class_in_both_integer_classes(rows)
    assert logit_rows(2048, 4, 0) == [1, 2, 3, 4]
    assert max(logit_rows(2048, 4, 4)) == 17 and 20 not in logit_rows(2048, 4, 4)
    assert max(logit_rows(24, 256, 0)) == 24


def _serve(llm) -> None:
    """Prompts of 1..41 tokens in a 24-token budget: decode batches of 1..6 rows, chunks that
    continue a prefix next to decode rows, and a prefix-cache hit."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (1, 3, 9, 16, 30, 41)]
    prompts.append(prompts[-1][:33] + [5, 6])
    for max_tokens in (2, 9):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))


def _engine(tokenizer_path, tmp_path, kv_cache_dtype: str, device: str, **kwargs) -> LLM:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return LLM(model=str(tmp_path), load_format="dummy", tokenizer=tokenizer_path,
               dtype="float32" if device == "cpu" else "bfloat16", device=device,
               max_num_batched_tokens=kwargs.pop("max_num_batched_tokens", 24), num_kv_blocks=64,
               attention_backend="triton", kv_cache_dtype=kv_cache_dtype, **kwargs)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_serving_launches_only_warmed_kernels(tokenizer_path, tmp_path, monkeypatch, kv_cache_dtype):
    if torch.cuda.is_available():
        pytest.skip("records launches in Triton's interpreter (on CUDA: the test below)")
    from nextok.worker.warmup import warm_up

    llm = _engine(tokenizer_path, tmp_path, kv_cache_dtype, "cpu")
    rec = Recorder(monkeypatch)
    warm_up(llm.engine.runner)
    warmed = set(rec.keys)
    assert any(k[0] == "_prefill_kernel" for k in warmed) and any(k[0] == "_decode_split_kernel" for k in warmed)
    rec.keys.clear()
    _serve(llm)
    assert len(rec.splits) > 1  # the steps' split counts differ: one compile serves them all
    missing = rec.keys - warmed
    assert not missing, "launched but not warmed:\n" + "\n".join(map(str, sorted(missing)))


def _compiled() -> dict[str, int]:
    """Kernels compiled so far, per Triton kernel of nextok (JITFunction's per-device caches)."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import nextok.kernels.triton as pkg

    counts = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, fn in vars(mod).items():
            if isinstance(fn, JITFunction):
                counts[f"{info.name}.{name}"] = sum(len(c[0]) for c in fn.device_caches.values())
    return counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts the GPU compiler's kernels")
@pytest.mark.parametrize("kv_cache_dtype,quantization,budget", [
    ("auto", None, 24), ("fp8", None, 24), ("auto", "int4", 64), ("auto", "int4", 512),
    ("auto", "int4-lm-head", 64)])
def test_serving_compiles_nothing_after_start_on_cuda(tokenizer_path, tmp_path, monkeypatch,
                                                      kv_cache_dtype, quantization, budget):
    """On CUDA the engine warms up by itself (ModelRunner.allocate_kv_cache): serving then adds
    no compiled kernel, the fused ops' and the linears' included. int4 (groups of 32), in steps
    of up to 64 tokens: W4A16's dp4a kernel and each of its tl.dot row classes; in a 512-token
    budget, a step of 300 prompt tokens too: past the kernels' rows, the dequantize pass; with
    an int4 lm_head, decode steps of 40 sequences: the lm_head's kernel at 40 rows."""
    if kv_cache_dtype == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 caches take the Triton kernels from compute capability 8.9")
    extra = dict(quantization="int4", quant_group_size=32) if quantization else {}
    if quantization == "int4-lm-head":
        extra["quantize_lm_head"] = True
        # The lm_head's own tile at 33-64 rows, as a tuned GPU's table gives its layers theirs
        # (the tiny model's shapes have none: with the default tile everywhere the layers'
        # warm-up would compile the lm_head's kernel too).
        from nextok.kernels.triton import w4a16_tiles

        tile = dict(w4a16_tiles.DEFAULT_TILES["64"], SPLIT=1, num_stages=2)
        lm_head = f"{CONFIG['vocab_size']}x{CONFIG['hidden_size']}"  # the tiny model's (tied)
        monkeypatch.setattr(w4a16_tiles, "_tuned", lambda name: {lm_head: {"64": tile}})
    llm = _engine(tokenizer_path, tmp_path, kv_cache_dtype, "cuda", max_num_batched_tokens=budget, **extra)
    before = _compiled()
    _serve(llm)
    gen = torch.Generator().manual_seed(4)
    if budget > 300:
        llm.generate([torch.randint(100, 40000, (150,), generator=gen).tolist() for _ in range(2)],
                     SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    if quantization == "int4-lm-head":
        llm.generate([torch.randint(100, 40000, (1,), generator=gen).tolist() for _ in range(40)],
                     SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    after = _compiled()
    grew = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    assert not grew, f"compiled while serving (kernel: before, after): {grew}"
