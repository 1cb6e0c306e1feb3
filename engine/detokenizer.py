"""Incremental detokenization with stop strings, one instance per request.

Each engine step hands the request's new token ids to `update`, which returns the text that is
safe to show now. Two things make text unsafe:
- a character split across tokens (byte-level BPE spells an emoji or a CJK character in several
  tokens): the tokenizer's decode stream holds those bytes back until the character is whole;
- text that may be the beginning of a stop string ("<|" when a stop string is "<|user|>"): held
  back until the next tokens confirm or refute it.

Invariant: every occurrence of a stop string lies entirely in text not yet emitted. The held-back
tail is the longest suffix of the unemitted text that is a proper prefix of some stop string, so
a stop string starting in emitted text would contradict its maximality. Once a stop string is
found, the text before it (and the stop string itself with include_stop_str_in_output) is
emitted and everything after it is dropped for good.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.model.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a request's generated token ids into text deltas, applying stop strings.

    `update(new_token_ids)` returns the new safe text; `stop_string` is set once a stop string was
    found (the request should then finish with finish_reason "stop"); `flush()` returns the text
    held back, once, when the request ends for another reason; `text` is all text emitted so far.
    Concatenating everything update and flush returned always equals `text`, and without stop
    strings `text` ends up equal to `tokenizer.decode(all_ids, skip_special_tokens)`.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        if any(not stop_string for stop_string in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = tokenizer.new_decode_stream(skip_special_tokens)
        self._stop = tuple(dict.fromkeys(stop))  # unique, in the caller's order
        # Characters that can end a prefix of a stop string: a cheap first test before holding back.
        self._stop_chars = frozenset("".join(self._stop))
        self._include_stop = include_stop_str_in_output
        self._token_ids: list[int] = []
        self._num_decoded_chars = 0  # characters the decode stream has produced so far
        self._stream_pending = False  # the decode stream holds ids back (it returned None since its last text)
        self._held = ""  # decoded text not yet emitted (could start a stop string)
        self._emitted: list[str] = []
        self.stop_string: str | None = None
        self.finished = False

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._emitted)

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids

    def update(self, new_token_ids: Sequence[int]) -> str:
        """Feeds the next generated ids; returns the text delta safe to emit now ("" after a stop)."""
        if self.finished or not new_token_ids:
            return ""
        self._token_ids.extend(new_token_ids)
        piece = self._stream.step(list(new_token_ids) if len(new_token_ids) > 1 else new_token_ids[0])
        if piece is None:
            self._stream_pending = True
            return ""
        self._stream_pending = False
        self._num_decoded_chars += len(piece)
        return self._accept(piece, final=False)

    def flush(self) -> str:
        """Ends the request: returns everything still held back (unless a stop string ended it)."""
        if self.finished:
            return ""
        piece = ""
        if self._stream_pending:
            # The stream holds an incomplete character (or only skipped specials); the one-shot
            # decode shows what it finally becomes (usually U+FFFD for a truncated sequence).
            full = self._tokenizer.decode(self._token_ids, skip_special_tokens=self._skip_special_tokens)
            piece = full[self._num_decoded_chars:]
            self._num_decoded_chars = len(full)
            self._stream_pending = False
        delta = self._accept(piece, final=True)
        self.finished = True
        return delta

    def _accept(self, piece: str, *, final: bool) -> str:
        if not self._stop:
            self._emitted.append(piece)
            return piece
        buffer = self._held + piece
        match = self._find_stop(buffer)
        if match is not None:
            start, stop_string = match
            end = start + len(stop_string) if self._include_stop else start
            self.stop_string = stop_string
            self.finished = True
            self._held = ""
            delta = buffer[:end]
        else:
            hold = 0 if final else self._held_back_length(buffer)
            self._held = buffer[len(buffer) - hold:] if hold else ""
            delta = buffer[:len(buffer) - hold]
        if delta:
            self._emitted.append(delta)
        return delta

    def _find_stop(self, buffer: str) -> tuple[int, str] | None:
        # The stop string a character-by-character stream would meet first: the one that ends
        # earliest; on a tie (one is a suffix of another) the longer one, which starts earlier.
        best: tuple[int, int, str] | None = None
        for stop_string in self._stop:
            start = buffer.find(stop_string)
            if start < 0:
                continue
            key = (start + len(stop_string), start, stop_string)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _held_back_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        if not buffer or buffer[-1] not in self._stop_chars:
            return 0
        longest = 0
        for stop_string in self._stop:
            for length in range(min(len(stop_string) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop_string[:length]):
                    longest = length
                    break
        return longest
