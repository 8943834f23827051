"""Token ids -> text, one step at a time, with stop strings.

Two layers of holding back keep a streamed client from ever seeing text that changes later:

1. Bytes: a character may be split across byte tokens. We decode a small window of recent
   tokens (the prefix/read offset technique of HF TGI and vLLM) and release text only when the
   window does not end in U+FFFD, i.e. its last character is complete. Tokenizers whose decode
   strips a leading space (SentencePiece) get the right space because the window starts one
   released chunk back, seeded from the prompt's last tokens.
2. Stop strings: text that could still grow into a stop string stays unreleased until it
   cannot; on a match the text is cut there, so no delta ever carries text that is cut later.

For byte-level BPE (SmolLM2, GPT-2, Llama 3, Qwen2) decode is concatenative at character
boundaries, so the deltas join up to exactly `tokenizer.decode(output ids)`. There layer 1 needs
no decode call at all: each token's bytes (`Tokenizer.byte_pieces`) go through an incremental
UTF-8 decoder, which holds back a character's first bytes until its last one comes (at a batch of
256 the two decode calls a token took ~2 ms of the engine's host work a step).
"""
from __future__ import annotations

import codecs

_REPLACEMENT = "\ufffd"
# Prompt tokens that seed the window: enough to hold a character's bytes and a merge context.
_CONTEXT = 5
# A character has at most 4 UTF-8 bytes, so more pending tokens than this mean the trailing
# U+FFFD is real output (or skipped special tokens); release it instead of growing the window.
_MAX_PENDING = 16


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool,
                 stop: list[str] | None, include_stop_str_in_output: bool, deferred: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stops = [s for s in (stop or []) if s]
        # deferred (a request nobody reads before it ends: not streamed) and no stop string to
        # watch for: step() only keeps the ids and finish() decodes them in one call. Why: at
        # a batch of 256 incremental decoding took 2.0 of the engine's ~6 ms of host work a
        # step on this project's CPU machine, time in which a fast GPU may already wait.
        self._deferred = deferred and not self._stops
        # Longest tail of the text that can be an unfinished stop string.
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._include_stop = include_stop_str_in_output
        self.token_ids: list[int] = []
        self.stop_reason: str | None = None
        self._stopped = False
        # Decoded output text (cut at a stop string once matched) and how much of it is released.
        self._text = ""
        self._released = 0
        pieces = getattr(tokenizer, "byte_pieces", None)
        self._pieces = pieces(skip_special_tokens) if pieces is not None else None
        if self._pieces is not None:  # layer 1 by bytes: token_ids[:_fed] went into _utf8
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
            self._fed = 0
            return
        # The window: ids[:read] were decoded already (context), ids[read:] are pending.
        tail = list(prompt_token_ids[-_CONTEXT:])
        if tail and self._decode(tail).endswith(_REPLACEMENT):
            # The prompt ends inside a character: seeding would glue its bytes to our output.
            tail = []
        self._window = tail
        self._read = len(tail)
        self._read_text = self._decode(tail)

    # ---- public --------------------------------------------------------------------------
    @property
    def output_text(self) -> str:
        """What the user has been shown so far; after finish() or a stop, the final text."""
        return self._text[:self._released]

    def step(self, new_token_ids: list[int]) -> tuple[str, bool]:
        """Add generated tokens -> (newly released text, whether a stop string matched)."""
        if self._stopped:
            return "", True
        self.token_ids.extend(new_token_ids)
        if self._pieces is None:
            self._window.extend(new_token_ids)
        if self._deferred:  # (all of it decoded by finish())
            return "", False
        if self._pieces is not None:
            return self._consume(self._feed_bytes(final=False))
        force = len(self._window) - self._read > _MAX_PENDING
        return self._consume(self._advance_window(force))

    def finish(self) -> str:
        """The sequence ended for another reason (EOS, length): release everything held back
        (deferred: decode every token since the prompt, in one call)."""
        if self._stopped:
            return ""
        if self._pieces is not None:
            delta, stopped = self._consume(self._feed_bytes(final=True))
        else:
            delta, stopped = self._consume(self._advance_window(force=True))
        if not stopped:
            delta += self._text[self._released:]
            self._released = len(self._text)
        return delta

    # ---- layer 1: bytes -> characters ----------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _feed_bytes(self, final: bool) -> str:
        """Text of the ids not fed yet, up to the last complete character (final: all of it)."""
        n, pieces = len(self._pieces), self._pieces
        data = b"".join(pieces[i] if 0 <= i < n else b"" for i in self.token_ids[self._fed:])
        self._fed = len(self.token_ids)
        return self._utf8.decode(data, final)

    def _advance_window(self, force: bool) -> str:
        """Text the pending tokens add, once it ends in a complete character (or if forced)."""
        new_text = self._decode(self._window)
        grew = len(new_text) > len(self._read_text)
        # Not grown: e.g. a skipped special token. Trailing U+FFFD: a character's bytes are
        # still arriving. Either way wait, unless the window got too long.
        if not force and (not grew or new_text.endswith(_REPLACEMENT)):
            return ""
        delta = new_text[len(self._read_text):] if grew else ""
        # Slide: the tokens just released become the context for the next ones.
        self._window = self._window[self._read:]
        self._read = len(self._window)
        self._read_text = self._decode(self._window)
        return delta

    # ---- layer 2: stop strings -----------------------------------------------------------
    def _consume(self, delta: str) -> tuple[str, bool]:
        if not delta:
            return "", False
        # A stop string not found before must end inside the new text.
        search_from = max(0, len(self._text) - self._max_hold)
        self._text += delta
        if self._stops:
            hit = self._find_stop(search_from)
            if hit is not None:
                return self._stop_at(*hit), True
        release_to = max(self._released, len(self._text) - self._held_back())
        out = self._text[self._released:release_to]
        self._released = release_to
        return out, False

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """Earliest match; on a tie the shorter stop string, which completes first."""
        best = None
        for s in self._stops:
            i = self._text.find(s, start)
            if i >= 0 and (best is None or (i, len(s)) < (best[0], len(best[1]))):
                best = (i, s)
        return best

    def _stop_at(self, index: int, stop: str) -> str:
        end = index + len(stop) if self._include_stop else index
        self._text = self._text[:end]
        self.stop_reason = stop
        self._stopped = True
        out = self._text[self._released:]
        self._released = len(self._text)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text = self._text
        for k in range(min(self._max_hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
