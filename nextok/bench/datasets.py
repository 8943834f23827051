"""Prompt sets for the offline benchmarks.

- `random`: token ids drawn uniformly from the ordinary (non-special) vocabulary, exactly
  `input_len` long; generation ignores EOS so every request yields exactly `output_len` tokens.
- `code`: windows of exactly `input_len` tokens cut from real source files: the Python standard
  library installed on this machine, a real corpus present everywhere Python is.

`stdlib_split()` also cuts that library into two disjoint parts by a stable hash of each file's
path relative to the stdlib root (`split_of`): about 1 file in 10 is EVAL (held out: what
`nextok eval ppl` scores) and the rest CALIBRATION (what quantization methods may look at).
The part a file lands in depends only on its relative path, never on walk order, the machine
or the Python version; which files exist does depend on the Python version, so results record it.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig

EVAL_SPLIT, CALIBRATION_SPLIT = "eval", "calibration"
EVAL_ONE_IN = 10  # about 1 stdlib file in EVAL_ONE_IN is held out for evaluation


def random_prompts(tokenizer, num: int, input_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    # Skip the first ids too: byte-level vocabularies keep special and control tokens low.
    candidates = [i for i in range(256, tokenizer.vocab_size) if i not in special]
    return [[rng.choice(candidates) for _ in range(input_len)] for _ in range(num)]


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(limit: int | None = None) -> list[str]:
    root = stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests",
                                                               "idlelib", "__pycache__"))
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return files[:limit] if limit else files


def split_of(relpath: str) -> str:
    """EVAL_SPLIT or CALIBRATION_SPLIT for a path relative to the stdlib root ('/' or os.sep):
    the first 8 bytes of its sha256, as an integer, modulo EVAL_ONE_IN == 0 -> eval."""
    key = relpath.replace(os.sep, "/").encode("utf-8")
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return EVAL_SPLIT if h % EVAL_ONE_IN == 0 else CALIBRATION_SPLIT


def stdlib_split() -> dict[str, list[str]]:
    """{"eval": paths, "calibration": paths}: every file of `stdlib_files()` in exactly one,
    each list sorted by the path relative to the stdlib root."""
    root = stdlib_root()
    parts: dict[str, list[str]] = {EVAL_SPLIT: [], CALIBRATION_SPLIT: []}
    rel = sorted(os.path.relpath(p, root).replace(os.sep, "/") for p in stdlib_files())
    for r in rel:
        parts[split_of(r)].append(os.path.join(root, *r.split("/")))
    return parts


def shuffled_sources(rng: random.Random, max_chars: int = 200_000, files: list[str] | None = None):
    """(path, the first max_chars characters) of every readable stdlib file (or of `files`), in an
    order shuffled by rng (the shuffle happens at the first item, before the caller draws from
    rng again)."""
    files = list(stdlib_files() if files is None else files)
    rng.shuffle(files)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                yield path, f.read(max_chars)
        except (OSError, UnicodeDecodeError):
            continue


def code_prompts(tokenizer, num: int, input_len: int, seed: int,
                 split: str | None = None) -> list[list[int]]:
    """`num` windows of `input_len` tokens, each from a different stdlib file; split: EVAL_SPLIT
    or CALIBRATION_SPLIT to take files of that part only (None: any file)."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    files = None if split is None else stdlib_split()[split]
    for _, text in shuffled_sources(rng, files=files):
        if len(prompts) == num:
            break
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < input_len + 1:
            continue
        start = rng.randrange(0, len(ids) - input_len)
        prompts.append(ids[start:start + input_len])
    if len(prompts) < num:
        raise RuntimeError(f"found only {len(prompts)} stdlib files with {input_len}+ tokens")
    return prompts


def build(name: str, tokenizer, num: int, input_len: int, seed: int,
          split: str | None = None) -> list[list[int]]:
    if name == "random":
        return random_prompts(tokenizer, num, input_len, seed)
    if name == "code":
        return code_prompts(tokenizer, num, input_len, seed, split)
    raise ValueError(f"unknown dataset {name!r} (random | code)")
