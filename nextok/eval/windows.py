"""Which tokens a sliding-window perplexity run scores, and with which context (no torch here).

A document of L tokens is cut into windows of at most `context` tokens whose starts advance by
`stride` (1 <= stride < context, so consecutive windows overlap by at least one token):

    window k:  tokens [k * stride, min(k * stride + context, L))
    scores:    window 0 every token but its first (token 0 has nothing to be predicted from);
               window k > 0 only the tokens past the end of window k - 1, i.e. its last `stride`
               (fewer in the last window, which is cut at L)
    stops:     after the first window that reaches L.

So every token 1..L-1 is scored exactly once, in order, each predicted by one forward over the
window's tokens before it: the first window's tokens see 0..context-2 tokens of left context,
later windows' tokens at least context - stride. A window's last token is only a target, so a
forward feeds at most context - 1 tokens. Documents are scored independently (no window spans
two), and a `max_tokens` cap keeps a prefix of each document in order (`cap_documents`), which
leaves every kept token's score unchanged: windows depend only on the tokens before them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator


@dataclass(frozen=True)
class Window:
    start: int  # the window's first token (position 0 of its forward)
    end: int  # one past its last token
    first_scored: int  # tokens [first_scored, end) are scored; start < first_scored <= end

    @property
    def fed(self) -> tuple[int, int]:
        """Token range of the forward: [start, end - 1); its last end - first_scored rows of
        logits predict tokens [first_scored, end)."""
        return self.start, self.end - 1


def check_settings(context: int, stride: int, max_tokens: int | None = None) -> None:
    if context < 2:
        raise ValueError(f"--context must be >= 2 (a token and one to predict), got {context}")
    if not 1 <= stride < context:
        raise ValueError(f"--stride must be in [1, context - 1] = [1, {context - 1}] so that "
                         f"windows overlap and every token is scored, got {stride}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {max_tokens}")


def plan_windows(num_tokens: int, context: int, stride: int) -> list[Window]:
    """The windows of one document of num_tokens tokens (none if it has fewer than 2)."""
    check_settings(context, stride)
    windows: list[Window] = []
    start, scored_to = 0, 1  # tokens [1, scored_to) are scored already
    while scored_to < num_tokens:
        end = min(start + context, num_tokens)
        windows.append(Window(start, end, scored_to))
        scored_to = end
        start += stride
    return windows


def cap_documents(docs: Iterable[tuple[str, list[int]]],
                  max_tokens: int | None) -> Iterator[tuple[str, list[int]]]:
    """(name, ids) documents in order, skipping those under 2 tokens, until max_tokens tokens
    would be scored (a document of n tokens scores n - 1); the last one is cut to reach exactly
    max_tokens. Lazy: documents after the cap are never pulled (nor read or tokenized)."""
    left = max_tokens
    for name, ids in docs:
        if len(ids) < 2:
            continue
        if left is not None and len(ids) - 1 >= left:
            yield name, ids[:left + 1]
            return
        if left is not None:
            left -= len(ids) - 1
        yield name, ids
