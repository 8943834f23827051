"""Simulated editor sessions for the keystroke workload: real files, typed at a typing pace.

Each session is one editor: it opens a real source file (Python from the standard library; C,
JavaScript and Go from files installed on this machine), puts the cursor at the start of a
non-blank line past the first fifth of the file and types the next 60-120 characters of that file
(to the end of a line), sending a request every few characters. The document while `k` characters
are typed is `text[:start + k] + text[end:]`: what follows the typed span stays as the suffix.
The editor sends windows around the cursor in whole lines (the cursor line plus the lines before
it that fit in `prefix_chars`; likewise after it), as editor plugins do, so the prompt's start
only moves when the cursor changes line: that is what lets a server's prefix cache work.

Everything here is deterministic from the seed: no clock, no network.
"""
from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field

LANGUAGES = ("python", "c", "javascript", "go")
PEER_LLAMA_CPP = os.path.expanduser("~/.cache/nextok/peer/llama-cpp-python-0.3.36/src/vendor/llama.cpp")
GO_EXAMPLES = "/usr/share/doc/prometheus/examples"  # Debian's prometheus package
HEADERS = "/usr/include"
MIN_BYTES, MAX_BYTES = 2_000, 200_000
MAX_AVG_LINE = 120   # longer on average: minified or generated, no one types that
SKIP_START = 0.2     # no session starts in the first fifth of a file: there is a real prefix


# ---- source files ---------------------------------------------------------------------------
def _walk(root: str, suffix: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "node_modules")
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(suffix)]
    return found


def candidate_files(language: str, *, llama_cpp: str = PEER_LLAMA_CPP, headers: str = HEADERS,
                    go_examples: str = GO_EXAMPLES) -> list[str]:
    """Files of `language` within the size bounds (their text is checked when a session opens
    one: /usr/include alone holds thousands)."""
    from nextok.bench.datasets import stdlib_files

    if language == "python":  # the codec tables under encodings/ are generated, not typed
        paths = [p for p in stdlib_files() if f"{os.sep}encodings{os.sep}" not in p]
    elif language == "c":
        paths = _walk(llama_cpp, ".c") if os.path.isdir(llama_cpp) else _walk(headers, ".h")
    elif language == "javascript":
        paths = [p for sub in ("tools", "examples") for p in _walk(os.path.join(llama_cpp, sub), ".js")]
    elif language == "go":
        paths = _walk(go_examples, ".go")
    else:
        raise ValueError(f"unknown language {language!r} ({', '.join(LANGUAGES)})")
    return [p for p in paths if os.path.isfile(p) and MIN_BYTES <= os.path.getsize(p) <= MAX_BYTES]


def read_source(path: str) -> str | None:
    """The file's text, or None when no one would type it: not UTF-8, or minified/generated."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_BYTES + 1)
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.count("\n") + 1
    if not MIN_BYTES <= len(text) <= MAX_BYTES or len(text) / lines >= MAX_AVG_LINE or "\r" in text:
        return None
    return text


# ---- sessions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TypingSpec:
    every: int = 3              # characters typed between two requests
    cps: float = 8.0            # typing pace, characters per second
    jitter: float = 0.3         # each character takes 1/cps times uniform(1 - jitter, 1 + jitter)
    line_pause: float = 1.0     # seconds a typist stops after a newline (reading, thinking): where
                                # an editor's completion has time to arrive and be accepted
    min_chars: int = 60         # the typed span: at least this long, to the end of its line ...
    max_chars: int = 120        # ... but never longer than this
    prefix_chars: int = 4000    # editor windows around the cursor, in whole lines
    suffix_chars: int = 1000


@dataclass(frozen=True)
class Keystroke:
    at: float       # seconds after the session began typing
    typed: int      # characters of the span typed; the cursor is at start + typed
    prefix: str     # the editor's window before the cursor ...
    suffix: str     # ... and after it


@dataclass
class Session:
    session_id: str
    language: str
    path: str
    start: int      # the typed span is text[start:end]
    end: int
    keystrokes: list[Keystroke]
    text: str = field(repr=False, default="")

    def document(self, typed: int) -> str:
        return self.text[:self.start + typed] + self.text[self.end:]

    @property
    def filepath(self) -> str:
        """What an editor would send as the file's path: its folder and name."""
        return os.path.join(os.path.basename(os.path.dirname(self.path)), os.path.basename(self.path))


def _line_starts(text: str, min_chars: int) -> list[int]:
    """Offsets where a non-blank line begins, past the first fifth and with room to type."""
    lo, hi = int(len(text) * SKIP_START), len(text) - min_chars
    return [m.end() for m in re.finditer(r"\n(?=[ \t]*\S)", text) if lo <= m.end() < hi]


def editor_windows(doc: str, cursor: int, prefix_chars: int, suffix_chars: int) -> tuple[str, str]:
    """(prefix, suffix) as an editor cuts them: the cursor line's head plus the whole lines before
    it that fit in `prefix_chars`; the rest of the cursor line plus whole lines after it that fit
    in `suffix_chars`. While typing within a line the prefix window's start does not move."""
    line_start = doc.rfind("\n", 0, cursor) + 1
    lo = max(0, line_start - prefix_chars)
    if lo > 0:
        lo = doc.find("\n", lo - 1) + 1  # forward to a line start (line_start at worst)
    hi = min(len(doc), cursor + suffix_chars)
    if hi < len(doc):
        last_nl = doc.rfind("\n", cursor, hi)
        hi = last_nl + 1 if last_nl >= 0 else hi
    return doc[lo:cursor], doc[cursor:hi]


def _typing_times(typed: str, spec: TypingSpec, rng: random.Random) -> list[float]:
    """times[k]: seconds until the k-th character of `typed` is typed (times[0] = 0); after a
    newline the typist pauses `line_pause` before the next character."""
    times = [0.0]
    for i in range(len(typed)):
        pause = spec.line_pause if i and typed[i - 1] == "\n" else 0.0
        times.append(times[-1] + pause + rng.uniform(1 - spec.jitter, 1 + spec.jitter) / spec.cps)
    return times


def make_session(session_id: str, language: str, path: str, text: str, spec: TypingSpec,
                 rng: random.Random) -> Session | None:
    """Types a span of `text` from a random line start; None if the file has no room for one."""
    starts = _line_starts(text, spec.min_chars)
    if not starts:
        return None
    start = rng.choice(starts)
    target = start + rng.randint(spec.min_chars, spec.max_chars)
    line_end = text.find("\n", target)
    end = min(line_end if line_end >= 0 else len(text), start + spec.max_chars)
    n = end - start
    times = _typing_times(text[start:end], spec, rng)
    # every `every` characters, and right after each newline (an editor asks at a new line)
    newlines = {i + 1 for i in range(start, end) if text[i] == "\n"}
    steps = sorted(set(range(spec.every, n, spec.every)) | {k - start for k in newlines} | {n})
    session = Session(session_id, language, path, start, end, [], text)
    for k in steps:
        prefix, suffix = editor_windows(session.document(k), start + k, spec.prefix_chars, spec.suffix_chars)
        session.keystrokes.append(Keystroke(times[k], k, prefix, suffix))
    return session


class _FilePool:
    """One language's files in a seeded order, read when first needed; the n-th session of the
    language opens the n-th usable one (cycling when there are fewer files than sessions)."""

    def __init__(self, language: str, paths: list[str], seed: int, spec: TypingSpec):
        self.language, self.spec = language, spec
        self.order = sorted(paths)
        random.Random(f"{seed}:{language}").shuffle(self.order)
        self.usable: list[tuple[str, str]] = []
        self._next = 0

    def get(self, n: int) -> tuple[str, str]:
        while len(self.usable) <= n and self._next < len(self.order):
            path = self.order[self._next]
            self._next += 1
            text = read_source(path)
            if text is not None and _line_starts(text, self.spec.min_chars):
                self.usable.append((path, text))
        if not self.usable:
            raise ValueError(f"no usable {self.language} file among {len(self.order)} candidates")
        return self.usable[n % len(self.usable)]


def build_sessions(num: int, files: dict[str, list[str]], spec: TypingSpec, seed: int,
                   id_prefix: str = "keystroke") -> list[Session]:
    """`num` sessions, the languages of `files` taken in turn; the same seed gives the same
    sessions, and session i does not depend on how many follow it."""
    if num < 1 or not files:
        raise ValueError("the keystroke workload needs at least one session and one language")
    if spec.every < 1 or spec.cps <= 0 or spec.line_pause < 0 or not 0 <= spec.jitter < 1 or not 1 <= spec.min_chars <= spec.max_chars:
        raise ValueError(f"bad typing settings {spec}")
    pools = {lang: _FilePool(lang, paths, seed, spec) for lang, paths in files.items()}
    languages = list(files)
    sessions = []
    for i in range(num):
        lang = languages[i % len(languages)]
        path, text = pools[lang].get(i // len(languages))
        session = make_session(f"{id_prefix}-{i}", lang, path, text, spec, random.Random(f"{seed}:session:{i}"))
        assert session is not None  # the pool only keeps files with room for a span
        sessions.append(session)
    return sessions
