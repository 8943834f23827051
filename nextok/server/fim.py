"""Fill-in-the-middle formats per model family, and the code-completion prompt built from them.

The special-token strings are the ones in each family's released tokenizer:

- StarCoder2 (bigcode): `<fim_prefix>` `<fim_suffix>` `<fim_middle>` `<fim_pad>`, repo-level
  `<repo_name>` `<file_sep>`. Repo layout, from the StarCoder2 paper (section 5):
  `<repo_name>{repo}<file_sep>{path}\\n{code}<file_sep><fim_prefix>{path}\\n{pre}<fim_suffix>...`
  (the current file's path sits inside the prefix, as in training).
- StarCoder / SantaCoder: the same FIM tokens, no repo-level tokens (context goes in comments).
- Qwen2.5-Coder: `<|fim_prefix|>` `<|fim_suffix|>` `<|fim_middle|>` `<|fim_pad|>`,
  `<|repo_name|>` `<|file_sep|>`. Repo layout, from the Qwen2.5-Coder report (figure 4):
  `<|repo_name|>{repo}\\n<|file_sep|>{path}\\n{code}\\n<|file_sep|>{path}\\n<|fim_prefix|>...`.
- CodeLlama: the vocabulary pieces are `▁<PRE>` `▁<SUF>` `▁<MID>` `▁<EOT>` (with SentencePiece's
  U+2581). Meta's `infilling_prompt_tokens` is `<PRE> {pre} <SUF>{suf} <MID>`, where the spaces
  before <SUF>/<MID> are the ▁ inside those tokens and the one after <PRE> is the prefix's
  SentencePiece dummy space; as text with the real pieces: `▁<PRE> {pre}▁<SUF>{suf}▁<MID>`.
- DeepSeek-Coder: `<｜fim▁begin｜>{pre}<｜fim▁hole｜>{suf}<｜fim▁end｜>` (U+FF5C fullwidth bars and
  U+2581); no repo tokens (its README shows repo context as `#path` comment headers).

SPM (suffix first) where the family trained on it: StarCoder's Megatron-LM FIM used it for half
of the FIM samples, as `<fim_prefix><fim_suffix>{suf}<fim_middle>{pre}`; CodeLlama's
`suffix_first` is `<PRE> <SUF>{suf} <MID> {pre}`. Qwen2.5-Coder and DeepSeek-Coder document PSM
only, so an SPM request uses PSM for them (`CodePrompt.order` says which was used).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from nextok.server.code_context import (ContextFile, CountTokens, LanguageSpec,
                                        as_context_files, comment_line, fit_context,
                                        keep_head_lines, keep_tail_lines, language_spec)

Order = Literal["psm", "spm"]


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix: str
    suffix: str
    middle: str
    stop_tokens: tuple[str, ...]   # strings that end a completion in this family
    repo_name: str | None = None   # repo-level tokens; None: context goes in comment headers
    file_sep: str | None = None
    spm: bool = False              # the family was trained on suffix-prefix-middle too
    code_lead: str = ""            # text between the prefix token and the code (CodeLlama: " ")
    repo_newlines: bool = False    # Qwen: "\n" after the repo name and after each file
    path_in_prefix: bool = False   # StarCoder2: the current file's path follows <fim_prefix>

    @property
    def required_tokens(self) -> tuple[str, ...]:
        repo = tuple(t for t in (self.repo_name, self.file_sep) if t)
        return (self.prefix, self.suffix, self.middle) + repo


_SC_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
QWEN_CODER = FimFormat(
    "qwen2.5-coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
    stop_tokens=("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>"),
    repo_name="<|repo_name|>", file_sep="<|file_sep|>", repo_newlines=True)
STARCODER2 = FimFormat(
    "starcoder2", *_SC_FIM,
    stop_tokens=("<|endoftext|>", *_SC_FIM, "<fim_pad>", "<repo_name>", "<file_sep>"),
    repo_name="<repo_name>", file_sep="<file_sep>", spm=True, path_in_prefix=True)
STARCODER = FimFormat(
    "starcoder", *_SC_FIM,
    stop_tokens=("<|endoftext|>", *_SC_FIM, "<fim_pad>", "<filename>", "<reponame>"), spm=True)
CODELLAMA = FimFormat(
    "codellama", "\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>",
    stop_tokens=("\u2581<EOT>", "</s>", "\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),
    spm=True, code_lead=" ")
_DS = "<\uff5c{}\uff5c>"  # DeepSeek's special tokens: fullwidth bars, U+2581 for spaces
DEEPSEEK_CODER = FimFormat(
    "deepseek-coder", _DS.format("fim\u2581begin"), _DS.format("fim\u2581hole"),
    _DS.format("fim\u2581end"),
    stop_tokens=(_DS.format("end\u2581of\u2581sentence"), "<|EOT|>", _DS.format("fim\u2581begin"),
                 _DS.format("fim\u2581hole"), _DS.format("fim\u2581end")))

# Detection order matters: StarCoder2 before StarCoder (same FIM tokens, plus repo tokens).
FIM_FORMATS: dict[str, FimFormat] = {
    f.name: f for f in (QWEN_CODER, STARCODER2, STARCODER, CODELLAMA, DEEPSEEK_CODER)}
_ALIASES = {"qwen": "qwen2.5-coder", "qwen-coder": "qwen2.5-coder", "qwen2.5": "qwen2.5-coder",
            "santacoder": "starcoder", "starcoder1": "starcoder", "code-llama": "codellama",
            "deepseek": "deepseek-coder", "deepseek-coder-v2": "deepseek-coder"}


def get_fim_format(name: str) -> FimFormat:
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in FIM_FORMATS:
        known = ", ".join(sorted(FIM_FORMATS))
        raise ValueError(f"unknown FIM format {name!r}; known formats: {known} (or 'none')")
    return FIM_FORMATS[key]


def _is_single_token(tokenizer, text: str) -> bool:
    """In the vocabulary and parsed whole out of prompt text (a plain vocab entry is not)."""
    i = tokenizer.token_to_id(text)
    return i is not None and tokenizer.encode(text, add_special_tokens=False) == [i]


def detect_fim_format(tokenizer) -> FimFormat | None:
    """The first family whose FIM tokens (and repo tokens, if it has them) are all single tokens
    of `tokenizer`; None for a model without FIM tokens."""
    for fmt in FIM_FORMATS.values():
        if all(_is_single_token(tokenizer, t) for t in fmt.required_tokens):
            return fmt
    return None


def resolve_fim_format(tokenizer, name: str | None = None) -> FimFormat | None:
    """A server setting: None or 'auto' detects, 'none' disables FIM, else a format name."""
    if name is None or name.strip().lower() == "auto":
        return detect_fim_format(tokenizer)
    if name.strip().lower() == "none":
        return None
    return get_fim_format(name)


def stop_token_ids(fmt: FimFormat | None, tokenizer) -> list[int]:
    """Token ids that end a code completion: the format's stop tokens this tokenizer has, and its
    EOS ids. Without a format every special token counts: code never contains one (SmolLM2's EOS
    is <|im_end|>, but a code continuation ends with <|endoftext|> or <file_sep>)."""
    if fmt is None:
        ids = list(tokenizer.all_special_ids)
    else:
        ids = [tokenizer.token_to_id(t) for t in fmt.stop_tokens]
    ids += list(tokenizer.eos_token_ids)
    return list(dict.fromkeys(i for i in ids if i is not None))


# ---- prompt building ------------------------------------------------------------------------
@dataclass
class CodePrompt:
    text: str
    fim: bool
    stop: list[str]
    format: str | None
    order: Order | None           # the order used (an SPM request on a PSM-only family: "psm")
    prompt_tokens: int
    context_files: int = 0        # extra_context snippets kept (the last one maybe trimmed)
    prefix_start: int = 0         # chars cut from the start of the prefix
    suffix_kept: int = 0          # chars of the suffix kept
    context_paths: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Frame:
    """The prompt around the code: `stable` does not depend on the cursor; the prefix code is
    written after `prefix_lead`."""
    stable: str
    prefix_lead: str

    def render(self, fmt: FimFormat | None, order: Order, prefix: str, suffix: str) -> str:
        if fmt is None:
            return self.stable + self.prefix_lead + prefix
        pre = fmt.code_lead + self.prefix_lead + prefix
        if order == "spm":
            return self.stable + fmt.prefix + fmt.suffix + suffix + fmt.middle + pre
        return self.stable + fmt.prefix + pre + fmt.suffix + suffix + fmt.middle


def _uses_repo_layout(fmt: FimFormat | None, files, filepath, repo_name) -> bool:
    return bool(fmt and fmt.file_sep and (files or filepath or repo_name))


def _context_renderer(fmt: FimFormat | None, repo: bool, spec: LanguageSpec):
    if not repo:
        def render(f: ContextFile) -> str:
            body = f.content if f.content.endswith("\n") or not f.content else f.content + "\n"
            return comment_line(spec, f.filepath) + body
        return render
    assert fmt is not None and fmt.file_sep is not None
    if fmt.repo_newlines:  # Qwen: every file ends with a newline before the next <|file_sep|>
        return lambda f: (f"{fmt.file_sep}{f.filepath}\n{f.content}"
                          + ("" if f.content.endswith("\n") else "\n"))
    return lambda f: f"{fmt.file_sep}{f.filepath}\n{f.content}"


def _frame(fmt, files, render, spec, filepath, repo_name, repo: bool) -> _Frame:
    context = "".join(render(f) for f in files)
    if not repo:
        header = comment_line(spec, filepath) if filepath else ""
        return _Frame("", context + header)
    nl = "\n" if fmt.repo_newlines else ""
    head = f"{fmt.repo_name}{repo_name}{nl}" if repo_name else ""
    path = f"{filepath}\n" if filepath else ("\n" if fmt.repo_newlines else "")
    if fmt.path_in_prefix:
        return _Frame(head + context + fmt.file_sep, path)
    return _Frame(head + context + fmt.file_sep + path, "")


def build_code_prompt(fmt: FimFormat | None, prefix: str, suffix: str, *,
                      count_tokens: CountTokens, language: str | None = None,
                      filepath: str | None = None,
                      extra_context: Sequence[ContextFile | Mapping] = (),
                      repo_name: str | None = None, order: Order = "psm",
                      max_prompt_tokens: int = 4096, context_tokens: int = 1024,
                      suffix_share: float = 0.25, align_lines: int = 8) -> CodePrompt:
    """The prompt for completing code between `prefix` and `suffix`.

    With a FIM format: PSM `<pre>{prefix}<suf>{suffix}<mid>` or, where the family trained on it,
    SPM (see the module docstring), inside the family's repo-level layout when it has one, else
    with context files and the file path as comment headers inside the prefix.

    Without one (the default SmolLM2 model has no FIM tokens): context files and the path as
    comment headers, then the prefix; the suffix is left out. A plain LM never saw text from
    after the cursor placed before it, so a "next lines" hint is out of distribution and small
    models tend to copy it verbatim; leaving it out also keeps the prompt's start independent of
    the suffix. `CodeStopper` uses the suffix instead, to stop where the completion meets it.

    Budgets: context files get at most `context_tokens` (and never more than half of
    `max_prompt_tokens`), laid out in the given order and trimmed against that budget alone, so
    that part of the prompt is identical for every keystroke and comes first. The current file
    gets the rest: the suffix up to `suffix_share` of it (under SPM exactly that, so the
    suffix-first part stays stable; under PSM also what the prefix leaves), the prefix the rest,
    trimmed at line boundaries with its first kept line rounded to a multiple of `align_lines`
    (see `keep_tail_lines`). A prompt for the next keystroke therefore shares this one's text up
    to the cursor's line.
    """
    if order not in ("psm", "spm"):
        raise ValueError(f"order must be 'psm' or 'spm', not {order!r}")
    if max_prompt_tokens <= 0 or context_tokens < 0:
        raise ValueError("need max_prompt_tokens > 0 and context_tokens >= 0 "
                         f"(got {max_prompt_tokens} and {context_tokens})")
    used_order: Order | None = None if fmt is None else (order if fmt.spm else "psm")
    spec = language_spec(language, filepath)
    files = as_context_files(extra_context)
    repo = _uses_repo_layout(fmt, files, filepath, repo_name)
    render = _context_renderer(fmt, repo, spec)
    files = fit_context(files, min(context_tokens, max_prompt_tokens // 2), count_tokens, render)
    frame = _frame(fmt, files, render, spec, filepath, repo_name, repo)

    code_budget = max_prompt_tokens - count_tokens(frame.render(fmt, used_order, "", ""))
    for _ in range(4):  # pieces are counted apart; re-trim if joining them added tokens
        pre, suf = _trim_code(fmt, used_order, prefix, suffix, code_budget, count_tokens,
                              suffix_share, align_lines)
        text = frame.render(fmt, used_order, pre, suf)
        n = count_tokens(text)
        if n <= max_prompt_tokens or code_budget <= 0:
            break
        code_budget -= n - max_prompt_tokens
    return CodePrompt(text=text, fim=fmt is not None, stop=list(fmt.stop_tokens) if fmt else [],
                      format=fmt.name if fmt else None, order=used_order, prompt_tokens=n,
                      context_files=len(files), prefix_start=len(prefix) - len(pre),
                      suffix_kept=len(suf), context_paths=[f.filepath for f in files])


def _trim_code(fmt, order, prefix, suffix, budget, count_tokens, suffix_share, align):
    """-> (prefix, suffix) kept within `budget` tokens, nearest the cursor."""
    if fmt is None:
        return keep_tail_lines(prefix, budget, count_tokens, align), ""
    suf = keep_head_lines(suffix, int(max(budget, 0) * suffix_share), count_tokens)
    pre = keep_tail_lines(prefix, budget - count_tokens(suf), count_tokens, align)
    if order == "psm" and len(suf) < len(suffix):  # the suffix follows the cursor here,
        suf = keep_head_lines(suffix, budget - count_tokens(pre), count_tokens)  # so take the rest
    return pre, suf
