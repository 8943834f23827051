"""Prompt lookup ("n-gram") proposals: the continuation of the sequence's own last n tokens where
they occurred before, in its prompt or its output. Free to run (no model), and strong on code,
where a completion copies identifiers, lines and whole blocks from the file around it.

How many tokens to propose depends on how long the match is. Each draft token is one more row
of the verify step, and on a CPU rows are not free (SmolLM2-135M, 2-core Xeon, float32: a step
of 2 / 5 / 8 rows costs 1.13 / 1.38 / 1.65 decode steps; 9 rows 2.3). Measured on the greedy
outputs of `nextok bench spec` (edit, code; 8 prompts each), the first draft token is accepted
after 30-45% of one-token matches and their later ones after under 20%, after 45-90% of 2-3
token matches with a quick fall-off, and after 90% of matches of 4+ tokens, which mostly go on
accepting (a copy in progress). So: 1 token after a 1-token match, up to 4 after 2-3 tokens,
up to k after longer ones (DRAFT_CAP).

A token that never occurred before is often a substitution in a copy (an edit renames a name,
changes a literal): when the SUB_MATCH tokens before it did occur, the proposal is what followed
the token they preceded there, SUB_DRAFT_CAP tokens at most. Replayed on greedy outputs of
`nextok bench spec` prompts (edit and code, the bench's and another seed's, costs measured on
the 2-core Xeon), that raised the speedup 1-3 % on each set; random prompts never take it."""
from __future__ import annotations

import numpy as np

# Longest draft after a match of 1, 2, 3 tokens (index: length - 1); longer matches: k.
DRAFT_CAP = (1, 4, 4)
SUB_MATCH = 3  # tokens before a never-seen token that must have occurred together
SUB_DRAFT_CAP = 2


class NgramProposer:
    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 8):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest suffix
        of token_ids (n_max tokens down to n_min) that occurred before; [] when none did.
        The draft is cut to DRAFT_CAP for short matches, and continues a repeat past the end of
        the sequence (a loop of period p proposes its next k tokens, not only p). A last token
        never seen before is taken for a substitution (_substitution)."""
        length = len(token_ids)
        if length < self.n_min + 1 or k < 1:
            return []
        arr = np.asarray(token_ids, dtype=np.int64)
        start, n = self._match(arr)
        if n == 0:
            return self._substitution(arr, k)
        if n < self.n_min:
            return []
        k = min(k, DRAFT_CAP[n - 1]) if n <= len(DRAFT_CAP) else k
        draft = arr[start:start + k].tolist()
        period = length - start  # past the end, the copy reads what it has just proposed
        while len(draft) < k:
            draft.append(draft[len(draft) - period])
        return draft

    def _substitution(self, arr: np.ndarray, k: int) -> list[int]:
        """arr's last token never occurred before: if the SUB_MATCH+ tokens before it did, the
        token after the one they preceded, and on (at most SUB_DRAFT_CAP); else []."""
        start, n = self._match(arr[:-1])  # start: the place of the token that was replaced
        if n < max(SUB_MATCH, self.n_min):
            return []
        return arr[start + 1:min(start + 1 + min(k, SUB_DRAFT_CAP), len(arr) - 1)].tolist()

    def _match(self, arr: np.ndarray) -> tuple[int, int]:
        """(where the continuation starts, match length n) for the longest suffix of arr of at
        most n_max tokens that occurred earlier, the most recent occurrence among the longest;
        n = 0 when the last token never occurred before."""
        length = len(arr)
        # ends[i]: an earlier position holding the last token; extended leftwards one token at
        # a time while the tokens before it agree with those before the suffix
        ends = np.flatnonzero(arr[:length - 1] == arr[length - 1])
        n = 1
        while ends.size and n < self.n_max:
            prev = ends - n
            agree = ends[(prev >= 0) & (arr[np.maximum(prev, 0)] == arr[length - 1 - n])]
            if not agree.size:
                break
            ends, n = agree, n + 1
        if not ends.size:
            return 0, 0
        return int(ends[-1]) + 1, n
