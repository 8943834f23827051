"""Where a code completion ends: at the end of the line, or at the end of the cursor's block.

A `CodeStopper` is fed the completion text generated so far, again and again as tokens stream in,
and answers None (go on) or the cut: the completion is `text[:cut]`. It judges only complete
lines (up to a newline) until `finish`/`final_cut`, which also judge the last, unterminated
line, so the cut does not depend on how the text was chunked. Cuts fall at line boundaries (or
at a closing brace), so a cut never lands inside a token. While streaming, `safe_length` says how
much text no later cut can take back (the cut may drop line breaks already generated).

Multi-line rules:
- indentation languages (Python, YAML, ...): the block is anchored at the cursor's line when it
  has code, else at the prefix's last non-empty line (or, when the completion starts something
  less indented than that, at the completion's first line). A later line ends the block when it
  is less indented than the anchor, or no more indented when the anchor opens a block (ends in
  ':'); `else:`/`elif`/`except`/`finally` at the anchor's level continue it, and lines that
  start with a closing bracket are not judged.
- brace languages (C, C++, Java, JS/TS, Go, Rust, C#, ...): `{`/`}` are counted over the
  completion, outside strings and comments. A `}` that takes the count below zero closes the
  block the cursor is in: if the suffix already closes it (the suffix's own count goes below
  zero) the completion stops before that `}`, else it keeps that line. Where the suffix closes
  no block (top level, or the end of the file), a completion whose first line opened a block
  stops once that block is closed again.
- all languages: a line equal to the suffix's first non-empty line (with a letter or digit in it)
  means the model started repeating the code after the cursor: stop before it.
When the cursor is at the end of its line, the suffix brings the line break, so the completion
loses its trailing line breaks; otherwise a cut before a line keeps the line break.
"""
from __future__ import annotations

import re
from typing import Literal

from nextok.server.code_context import language_spec

Mode = Literal["single_line", "multi_line"]
_CONTINUATIONS = re.compile(r"(else|elif|except|finally)\b")
_TRAILING_COMMENT = re.compile(r"\s+#.*$")
_SUFFIX_SCAN_CHARS = 20_000  # enough to find the close of the cursor's block in most files


def default_mode(suffix: str) -> Mode:
    """Multi-line only when the cursor is at the end of its line (what editor clients do)."""
    return "multi_line" if _rest_of_line(suffix).strip() == "" else "single_line"


def _rest_of_line(suffix: str) -> str:
    return suffix.split("\n", 1)[0].rstrip("\r")


def _indent(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip())


def _opens_block(line: str) -> bool:
    return _TRAILING_COMMENT.sub("", line).rstrip().endswith(":")


class _BraceCounter:
    """`{`/`}` depth over lines of C-like code, skipping strings and comments (roughly: strings
    end at the line end, and a Rust `'` is a char literal only when it closes within 4 chars)."""

    def __init__(self, rust: bool = False):
        self.depth = 0
        self.in_comment = False
        self.rust = rust

    def scan(self, line: str) -> int | None:
        """Advance over one line; -> index of a `}` that takes the depth below zero, else None."""
        i, n = 0, len(line)
        while i < n:
            if self.in_comment:
                end = line.find("*/", i)
                if end < 0:
                    return None
                self.in_comment, i = False, end + 2
                continue
            ch = line[i]
            if line.startswith("//", i):
                return None
            if line.startswith("/*", i):
                self.in_comment, i = True, i + 2
                continue
            if ch in "\"'`":
                i = self._string_end(line, i)
                continue
            if ch == "{":
                self.depth += 1
            elif ch == "}":
                self.depth -= 1
                if self.depth < 0:
                    return i
            i += 1
        return None

    def _string_end(self, line: str, i: int) -> int:
        quote, j = line[i], i + 1
        while j < len(line):
            if line[j] == "\\":
                j += 2
                continue
            if line[j] == quote:
                return j + 1
            j += 1
        if quote == "'" and self.rust:
            return i + 1  # a lifetime such as 'a, not a char literal
        return len(line)


def _suffix_closes_block(suffix: str, rust: bool) -> bool:
    counter = _BraceCounter(rust)
    return any(counter.scan(line) is not None
               for line in suffix[:_SUFFIX_SCAN_CHARS].split("\n"))


class CodeStopper:
    def __init__(self, mode: Mode, language: str | None, prefix: str, suffix: str,
                 filepath: str | None = None):
        """`language`: a VS Code languageId (or alias); unknown ones fall back to `filepath`'s
        extension, then to the suffix-repeat rule alone."""
        if mode not in ("single_line", "multi_line"):
            raise ValueError(f"mode must be 'single_line' or 'multi_line', not {mode!r}")
        self.mode = mode
        spec = language_spec(language, filepath)
        self.blocks = spec.blocks
        self._rust = spec.name == "rust"
        self._head = prefix.rsplit("\n", 1)[-1]  # the cursor line, up to the cursor
        self._rest_blank = _rest_of_line(suffix).strip() == ""
        first = next((ln.strip() for ln in suffix.split("\n") if ln.strip()), "")
        self._repeat = first if any(c.isalnum() for c in first) else None
        body = prefix[:len(prefix) - len(self._head)].rstrip()
        last = body.rsplit("\n", 1)[-1] if body else ""
        self._prefix_anchor = (_indent(last), _opens_block(last)) if last.strip() else None
        self._suffix_closes = (self.blocks == "braces"
                               and _suffix_closes_block(suffix, self._rust))
        self._reset()

    def _reset(self) -> None:
        self._pos = 0        # start of the first line not judged yet
        self._index = 0      # its line number within the completion
        self._cut: int | None = None
        self._final: int | None = None
        self._anchor: tuple[int, bool] | None = None  # (indent, opens a block)
        self._braces = _BraceCounter(self._rust)
        self._first_content_seen = False
        self._opened_on_first = False

    # ---- public ------------------------------------------------------------------------------
    def feed(self, text: str) -> int | None:
        """`text`: the whole completion so far (each call extends the last). -> cut or None."""
        if self._cut is not None:
            return self._cut
        if len(text) < self._pos:  # not an extension of what we judged: start over
            self._reset()
        while (nl := text.find("\n", self._pos)) >= 0:
            line = text[self._pos:nl].removesuffix("\r")
            cut = self._judge(text, self._pos, line)
            if cut is not None:
                self._cut = cut
                return cut
            self._pos, self._index = nl + 1, self._index + 1
        return None

    def finish(self, text: str) -> str:
        """At the end of generation: the final completion, `text[:self.final_cut(text)]`."""
        return text[:self.final_cut(text)]

    def final_cut(self, text: str) -> int:
        """At the end of generation: judge the last line too. -> the final cut (<= len(text))."""
        if self._final is not None:
            return self._final
        cut = self.feed(text)
        if cut is None and self._pos < len(text):
            cut = self._judge(text, self._pos, text[self._pos:].removesuffix("\r"))
        if cut is None:
            cut = len(text)
            tail = text[len(text.rstrip()):]
            if self.mode == "multi_line" and self._rest_blank and "\n" in tail:
                cut = len(text.rstrip())
        self._final = cut
        return cut

    def safe_length(self, text: str) -> int:
        """How much of `text` (as last fed) can be streamed out now: no later cut goes below it."""
        if self._cut is not None:
            return min(self._cut, len(text))
        if self.mode == "single_line":
            return len(text) - (1 if text.endswith("\r") else 0)
        return len(text[:self._pos].rstrip())

    # ---- rules -------------------------------------------------------------------------------
    def _judge(self, text: str, start: int, line: str) -> int | None:
        if self.mode == "single_line":
            return start + len(line)
        if (self._repeat is not None and line.strip() == self._repeat
                and (self._index > 0 or not self._head.strip())):
            if self._rest_blank:
                return self._cut_before_line(text, start)
            return start + len(line) - len(line.lstrip())  # keep the indentation the suffix lacks
        if self.blocks == "indent":
            return self._judge_indent(text, start, line)
        if self.blocks == "braces":
            return self._judge_braces(text, start, line)
        return None

    def _cut_before_line(self, text: str, start: int) -> int:
        if not self._rest_blank:
            return start
        return len(text[:start].rstrip())

    def _judge_indent(self, text: str, start: int, line: str) -> int | None:
        full = self._head + line if self._index == 0 else line
        stripped = full.strip()
        if not stripped:
            return None
        if self._anchor is None:  # the first line with code anchors the block, unjudged...
            if self._index > 0 and not self._head.strip() and _indent(full) < len(self._head):
                return self._cut_before_line(text, start)  # ...unless it leaves the typed indent
            own = (_indent(full), _opens_block(full))
            at_cursor = self._index == 0 and bool(self._head.strip())
            inside = self._prefix_anchor is not None and not _ends_block(self._prefix_anchor, full)
            self._anchor = self._prefix_anchor if not at_cursor and inside else own
            return None
        if stripped[0] in ")]}":
            return None
        return self._cut_before_line(text, start) if _ends_block(self._anchor, full) else None

    def _judge_braces(self, text: str, start: int, line: str) -> int | None:
        below = self._braces.scan(line)
        if below is not None:
            if self._suffix_closes:  # the suffix has this `}` already: stop before it
                before = line[:below]
                if not before.strip():
                    return self._cut_before_line(text, start)
                return start + len(before.rstrip())
            rest = line[below + 1:]
            return start + (below + 1 if "{" in rest else len(line.rstrip()))
        has_code = bool((self._head + line if self._index == 0 else line).strip())
        if not has_code:
            return None
        if not self._first_content_seen:
            self._first_content_seen = True
            self._opened_on_first = self._braces.depth > 0
            return None
        if self._opened_on_first and self._braces.depth == 0 and not self._suffix_closes:
            return start + len(line.rstrip())
        return None


def _ends_block(anchor: tuple[int, bool], line: str) -> bool:
    indent, opens = anchor
    d = _indent(line)
    if opens:
        return d < indent or (d == indent and not _CONTINUATIONS.match(line.strip()))
    return d < indent


def apply_code_stops(text: str, mode: Mode, language: str | None, prefix: str, suffix: str,
                     filepath: str | None = None) -> str:
    """The finished (non-streamed) completion `text`, cut by the same rules."""
    return CodeStopper(mode, language, prefix, suffix, filepath).finish(text)
