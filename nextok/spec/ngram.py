"""Prompt lookup ("n-gram") proposals: the continuation of the sequence's own last n tokens where
they occurred before, in its prompt or its output. Free to run (no model), and strong on code,
where a completion copies identifiers, lines and whole blocks from the file around it."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max

    def propose_batch(self, seqs: list, k: int) -> list[list[int]]:
        return [self.propose(seq.token_ids, k) for seq in seqs]

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest suffix
        of token_ids (n_max tokens down to n_min) that occurred before; [] when none did."""
        length = len(token_ids)
        if length < self.n_min + 1 or k < 1:
            return []
        arr = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            suffix = arr[length - n:]
            # windows[i] = arr[i:i + n] for every i whose window ends before the suffix starts
            # at the latest, so at least one token follows it
            windows = sliding_window_view(arr[:length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the most recent occurrence
                return arr[start:start + k].tolist()
        return []
