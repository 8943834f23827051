"""Shared fixtures. The real model is pulled once per session (`make test` pulls it first)."""
from __future__ import annotations

import collections
import gc
import os

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter (on CPU tensors). It reads this at
# import, so it is set here, before any test module imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`make test` runs one worker per core) each worker gets its share of the
# cores: torch's default, a thread per core in every worker, oversubscribes them and its
# OpenMP threads spin waiting for each other.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // WORKERS))


# NEXTOK_TEST_RSS_LOG=FILE: a line per test, "worker rss_mib peak_mib seconds nodeid", after it
# (and its function fixtures) ended: which tests hold a worker's memory (CI has 24 GiB).
_RSS_LOG = os.environ.get("NEXTOK_TEST_RSS_LOG")


if _RSS_LOG:
    import resource
    import time

    _PAGE = os.sysconf("SC_PAGE_SIZE")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = time.monotonic()
        yield
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE >> 20
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10  # KiB on Linux
        with open(_RSS_LOG, "a") as f:
            f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {rss} {peak} "
                    f"{time.monotonic() - start:.1f} {item.nodeid}\n")


@pytest.fixture(scope="session")
def model_path() -> str:
    """Path of the default model (SmolLM2-135M-Instruct GGUF), pulled into the cache if absent."""
    from nextok import hub

    return hub.resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer_path(request) -> str:
    """A tokenizer for the random-weight models: NEXTOK_TEST_TOKENIZER, a directory the tokenizer
    saved (the GPU machine has one, not the GGUF: benchmarks/gpu/make_carry.sh), else the
    default model's."""
    return os.environ.get("NEXTOK_TEST_TOKENIZER") or request.getfixturevalue("model_path")


_ENGINES: "collections.OrderedDict" = collections.OrderedDict()
# Engines kept alive at once: each holds ~1 GB (float32 weights, blocks, a KV pool; a draft pool
# more), and the suite asks for ~30 configurations; all of them together ran CI's 24 GiB out.
# Tests come grouped by module, so the few most recent cover nearly every reuse. Each xdist
# worker keeps its own.
MAX_CACHED_ENGINES = 6 if WORKERS == 1 else 3


@pytest.fixture(scope="session")
def make_llm(model_path):
    """make_llm(**engine kwargs) -> LLM on the default model in float32, built once per kwargs
    (the least recently used beyond MAX_CACHED_ENGINES are dropped, and rebuilt if asked again)."""

    def make(**kwargs):
        from nextok import LLM

        kwargs.setdefault("kv_cache_memory", 256 << 20)
        key = tuple(sorted(kwargs.items()))
        if key in _ENGINES:
            _ENGINES.move_to_end(key)
        else:
            while len(_ENGINES) >= MAX_CACHED_ENGINES:
                _ENGINES.popitem(last=False)
                gc.collect()
            _ENGINES[key] = LLM(model=model_path, dtype="float32", **kwargs)
        return _ENGINES[key]

    return make


@pytest.fixture(scope="session")
def llm_f32(make_llm):
    """The default engine configuration, float32 (exactness tests use float32)."""
    return make_llm()


@pytest.fixture(scope="session")
def hf_model(model_path):
    """transformers' model from the same GGUF, float32: the numerical reference (~20 s, once)."""
    import os

    import torch

    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32)
    return model.eval()
