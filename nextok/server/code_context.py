"""The cursor, the file's language, and how much code fits: the inputs of a code-completion prompt.

`split_document` turns an editor document and an LSP position into the text before and after the
cursor. `keep_tail_lines` / `keep_head_lines` trim code at line boundaries to a token budget,
keeping the lines nearest the cursor. `keep_tail_lines` rounds its first kept line up to a
multiple of `align`: the prefix grows by a token or so per keystroke, and without rounding the
first kept line would move down every few keystrokes, changing the very start of the prompt and
wasting the engine's prefix cache. With rounding it moves once every `align` lines.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

CountTokens = Callable[[str], int]

# LSP: "\n", "\r\n" and "\r" all end a line.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_document(code: str, line: int, character: int) -> tuple[str, str]:
    """-> (prefix, suffix), with prefix + suffix == code.

    `line` is 0-based; `character` counts UTF-16 code units, as LSP and VS Code send it (a
    character outside the Basic Multilingual Plane, e.g. an emoji, counts 2). Line endings are
    kept as they are. A `character` past the end of its line is clamped to the line end, as the
    LSP specification says ("defaults back to the line length"); a `line` past the last line, a
    negative value, or a `character` between the two halves of a surrogate pair raises ValueError.
    """
    if line < 0 or character < 0:
        raise ValueError(f"cursor position must not be negative "
                         f"(line={line}, character={character})")
    starts = [0] + [m.end() for m in _LINE_BREAK.finditer(code)]
    if line >= len(starts):
        raise ValueError(f"cursor line {line} is out of range: the document has {len(starts)} "
                         f"line(s), numbered from 0")
    start = starts[line]
    brk = _LINE_BREAK.search(code, start)
    text = code[start:brk.start() if brk else len(code)]
    cut = start + _utf16_offset_to_index(text, character, line)
    return code[:cut], code[cut:]


def _utf16_offset_to_index(text: str, units: int, line: int) -> int:
    count = 0
    for i, ch in enumerate(text):
        if count == units:
            return i
        width = 2 if ord(ch) > 0xFFFF else 1
        if count + width > units:
            raise ValueError(f"cursor character {units} on line {line} falls inside a surrogate "
                             f"pair (UTF-16 offsets must be at character boundaries)")
        count += width
    return len(text)  # at or past the line end: clamp


# ---- languages ------------------------------------------------------------------------------
BlockStyle = Literal["indent", "braces", "none"]


@dataclass(frozen=True)
class LanguageSpec:
    name: str
    comment: tuple[str, str]  # (open, close); close is "" for a line comment
    blocks: BlockStyle        # how code blocks end: by dedent, by closing brace, or unknown


_HASH, _SLASH, _DASH = ("#", ""), ("//", ""), ("--", "")
_LANGUAGES: dict[str, tuple[tuple[str, str], BlockStyle]] = {
    **{k: (_HASH, "indent") for k in ("python", "yaml", "nim", "coffeescript")},
    **{k: (_SLASH, "indent") for k in ("pug", "sass")},
    **{k: (_SLASH, "braces") for k in (
        "c", "cpp", "csharp", "java", "javascript", "typescript", "javascriptreact",
        "typescriptreact", "go", "rust", "kotlin", "swift", "scala", "dart", "php", "groovy",
        "zig", "solidity", "objective-c", "objective-cpp", "jsonc", "proto")},
    **{k: (("/*", "*/"), "braces") for k in ("css", "scss", "less")},
    **{k: (_HASH, "none") for k in (
        "ruby", "shellscript", "perl", "r", "toml", "dockerfile", "makefile", "powershell",
        "julia", "elixir", "cmake", "graphql")},
    **{k: (_DASH, "none") for k in ("sql", "lua", "haskell", "elm", "ada")},
    **{k: ((";;", ""), "none") for k in ("clojure", "lisp", "scheme")},
    **{k: (("%", ""), "none") for k in ("erlang", "matlab", "latex")},
    **{k: (("<!--", "-->"), "none") for k in ("html", "xml", "markdown", "vue", "svelte")},
    "fortran": (("!", ""), "none"),
    "ocaml": (("(*", "*)"), "none"),
}
_ALIASES = {
    "py": "python", "js": "javascript", "ts": "typescript", "jsx": "javascriptreact",
    "tsx": "typescriptreact", "c++": "cpp", "cs": "csharp", "c#": "csharp", "golang": "go",
    "rs": "rust", "kt": "kotlin", "rb": "ruby", "sh": "shellscript", "bash": "shellscript",
    "zsh": "shellscript", "shell": "shellscript", "yml": "yaml", "objc": "objective-c",
    "md": "markdown", "tex": "latex", "hs": "haskell", "protobuf": "proto",
}
_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript",
    ".cjs": "javascript", ".jsx": "javascriptreact", ".ts": "typescript", ".mts": "typescript",
    ".tsx": "typescriptreact", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp",
    ".hpp": "cpp", ".hh": "cpp", ".cs": "csharp", ".java": "java", ".go": "go", ".rs": "rust",
    ".kt": "kotlin", ".kts": "kotlin", ".swift": "swift", ".scala": "scala", ".dart": "dart",
    ".php": "php", ".rb": "ruby", ".sh": "shellscript", ".bash": "shellscript", ".yaml": "yaml",
    ".yml": "yaml", ".toml": "toml", ".lua": "lua", ".sql": "sql", ".hs": "haskell",
    ".html": "html", ".xml": "xml", ".md": "markdown", ".css": "css", ".scss": "scss",
    ".less": "less", ".vue": "vue", ".svelte": "svelte", ".zig": "zig", ".sol": "solidity",
    ".r": "r", ".jl": "julia", ".ex": "elixir", ".exs": "elixir", ".erl": "erlang",
    ".clj": "clojure", ".nim": "nim", ".pl": "perl", ".proto": "proto", ".ml": "ocaml",
}
# Unknown languages get a '#' header: shell-like config files are the most common unknowns.
_UNKNOWN = LanguageSpec("unknown", _HASH, "none")


def language_spec(language: str | None, filepath: str | None = None) -> LanguageSpec:
    """The language's comment syntax and block style, by VS Code languageId (or a common alias),
    else by the file extension of `filepath`."""
    name = (language or "").strip().lower()
    name = _ALIASES.get(name, name)
    if name not in _LANGUAGES and filepath:
        name = _EXTENSIONS.get(os.path.splitext(filepath)[1].lower(), name)
    if name not in _LANGUAGES:
        return _UNKNOWN
    comment, blocks = _LANGUAGES[name]
    return LanguageSpec(name, comment, blocks)


def comment_line(spec: LanguageSpec, text: str) -> str:
    """One comment line holding `text`, e.g. '# src/app.py\\n' or '<!-- index.html -->\\n'."""
    open_, close = spec.comment
    return f"{open_} {text} {close}\n" if close else f"{open_} {text}\n"


# ---- context files --------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextFile:
    """A snippet of another file in the repository, sent by the client as {filepath, content}."""
    filepath: str
    content: str


def as_context_files(items: Sequence[ContextFile | Mapping]) -> list[ContextFile]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, ContextFile):
            out.append(item)
            continue
        path, content = item.get("filepath"), item.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            raise ValueError(f"extra_context[{i}] must have string 'filepath' and 'content'")
        out.append(ContextFile(path, content))
    return out


# ---- trimming to a token budget -------------------------------------------------------------
# Whole-text counts decide; line groups only make a first guess, so that a prompt costs a few
# encodes of its own size instead of a binary search's dozen.
_GROUP = 16  # lines per group, at fixed line numbers so the groups stay put across keystrokes


def _line_bounds(text: str) -> list[int]:
    """[0, end of line 0, end of line 1, ..., len(text)]; the last line may be empty."""
    return [0] + [m.end() for m in re.finditer("\n", text)] + [len(text)]


def keep_tail_lines(text: str, budget: int, count_tokens: CountTokens, align: int = 1) -> str:
    """The end of `text` that fits `budget` tokens, starting at a line start (the code nearest a
    cursor that follows `text`). The first kept line's index is rounded up to a multiple of
    `align`. If the last line alone does not fit, its last characters that do are kept."""
    if budget <= 0:
        return ""
    bounds = _line_bounds(text)
    n = len(bounds) - 1
    if count_tokens(text[bounds[n - 1]:]) > budget:
        return _fit_chars(text[bounds[n - 1]:], budget, count_tokens, keep_end=True)
    kept = _lines_that_fit(text, bounds, budget, count_tokens, from_end=True)
    first = min(-(-(n - kept) // align) * align, n - 1)
    return text[bounds[first]:]


def keep_head_lines(text: str, budget: int, count_tokens: CountTokens,
                    partial_line: bool = True) -> str:
    """The start of `text` that fits `budget` tokens, ending at a line end (the code nearest a
    cursor that precedes `text`). If the first line alone does not fit, its first characters that
    do are kept when `partial_line`, else nothing."""
    if budget <= 0:
        return ""
    bounds = _line_bounds(text)
    if count_tokens(text[:bounds[1]]) > budget:
        return _fit_chars(text[:bounds[1]], budget, count_tokens, False) if partial_line else ""
    return text[:bounds[_lines_that_fit(text, bounds, budget, count_tokens, from_end=False)]]


def _lines_that_fit(text, bounds, budget, count_tokens, from_end: bool) -> int:
    """The most lines, taken from one end of `text`, that fit `budget` (one line is known to)."""
    n = len(bounds) - 1

    def span(m0: int, m1: int) -> str:  # the lines m0..m1-1, counted from the chosen end
        return text[bounds[n - m1]:bounds[n - m0]] if from_end else text[bounds[m0]:bounds[m1]]

    def fits(m: int) -> bool:
        return count_tokens(span(0, m)) <= budget

    edges = ([n - b for b in reversed(range(0, n, _GROUP))] if from_end
             else [*range(_GROUP, n, _GROUP), n])
    guess, total, prev = n, 0, 0
    for edge in edges:  # sum group counts until the budget runs out, then bisect in that group
        cost = count_tokens(span(prev, edge))
        if total + cost > budget:
            lo, hi = prev, edge
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if total + count_tokens(span(prev, mid)) <= budget else (lo, mid)
            guess = lo
            break
        total, prev = total + cost, edge
    return _max_fitting(fits, 1, n, guess)


def _max_fitting(fits: Callable[[int], bool], lo: int, hi: int, guess: int) -> int:
    """The largest m in [lo, hi] with fits(m), for fits true up to some m and false after, and
    fits(lo) true. Gallops out from `guess`: the checks grow with the guess's error only."""
    guess = min(max(guess, lo), hi)
    step, bad = 1, None
    if fits(guess):
        good = guess
        while good < hi:
            cand = min(guess + step, hi)
            if not fits(cand):
                bad = cand
                break
            good, step = cand, step * 2
        if bad is None:
            return good
    else:
        bad = guess
        while not fits(cand := max(guess - step, lo)):
            bad, step = cand, step * 2
        good = cand
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def _fit_chars(text: str, budget: int, count_tokens: CountTokens, keep_end: bool) -> str:
    """The most characters from one end of a single over-long line that fit (minified code)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = text[len(text) - mid:] if keep_end else text[:mid]
        if count_tokens(part) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[len(text) - lo:] if keep_end else text[:lo]


def fit_context(files: Sequence[ContextFile], budget: int, count_tokens: CountTokens,
                render: Callable[[ContextFile], str]) -> list[ContextFile]:
    """The context files that fit `budget` tokens once rendered, in the given order (the caller
    lists them most important first). Files are kept whole until one does not fit: that one keeps
    its first whole lines that do, and every later file is dropped. Depending only on the files
    and the budget, never on the cursor, the result is the same for every keystroke."""
    kept: list[ContextFile] = []
    used = 0
    for f in files:
        room = budget - used - count_tokens(render(ContextFile(f.filepath, "")))
        content = keep_head_lines(f.content, room, count_tokens, partial_line=False)
        if content == f.content:
            kept.append(f)
            used += count_tokens(render(f))
            continue
        if content.strip():
            kept.append(ContextFile(f.filepath, content))
        break
    return kept
