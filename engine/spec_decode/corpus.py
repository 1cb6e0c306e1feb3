"""A fixed corpus of the target's own past outputs for suffix drafting, searched by a sorted index.

Suffix drafting follows what came after the context's newest n-gram where it occurred before: in
the request's own context and in recent outputs (suffix.py). A fresh server has no recent
outputs, and a model's answers repeat its own idiom across requests (docstring layouts, test
blocks, `if __name__ == "__main__":`, the phrasing of its explanations). SuffixDecoding builds its
global tree from a workload's earlier outputs for this reason. A corpus is such a history kept
fixed: for the embedded model, its own answers to the prompts its draft was distilled on (drafts/
data's transcripts: the assistant turns, and the code completions whole; `python -m drafts
suffix-corpus`), which the speculative benchmark's prompts stay clear of.

Replaying the benchmark's 8 code answers (float32 greedy, one request after another), suffix
matching alone made 1.49 tokens a verification over the requests' own contexts and earlier
answers, 1.93 with the code transcripts' 342k tokens as well; choosing per step the better of
the EAGLE head's chain and the suffix drafts (an oracle) 2.28 without the corpus and 2.48 with it.

Layout: every document's tokens one after another, each followed by a separator (-1), as int32.
The index sorts every position by the WINDOW tokens starting there (a separator and what follows
it read as 0, lower than any token), packed into 64-bit words of a few tokens each (token + 1 in
as many bits as the vocabulary needs), so the positions where an n-gram (n <= WINDOW) starts are
one contiguous range of the order, found word by word with binary searches. A corpus of 440k
tokens takes ~7 MB this way and is sorted in well under a second, where a dict of its n-grams (the
index of recent outputs) would hold ~3.5M keys.
"""

from __future__ import annotations

import os

import numpy as np

from engine.config import SpeculativeConfig
from engine.model.resolve import ResolvedModel, shipped_suffix_corpus_path

WINDOW = 8  # tokens a position is sorted by: the longest n-gram looked up (suffix.py's max_ngram)
SEPARATOR = -1


class SuffixCorpus:
    def __init__(self, tokens: np.ndarray) -> None:  # [num_tokens] int, documents each ended by SEPARATOR
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size and tokens[-1] != SEPARATOR:
            tokens = np.append(tokens, np.int32(SEPARATOR))
        if tokens.size and int(tokens.min()) < SEPARATOR:
            raise ValueError("a suffix corpus holds token ids (>= 0) and separators (-1) only")
        self.tokens = tokens
        max_code = int(tokens.max()) + 1 if tokens.size else 1  # codes: token + 1, separator 0
        self.bits = max(1, max_code.bit_length())
        self.per_word = 64 // self.bits
        self.num_words = -(-WINDOW // self.per_word)
        padded = np.concatenate([tokens, np.full(WINDOW, SEPARATOR, dtype=np.int32)])
        # A separator cuts every window that reaches it: the codes from there on are 0.
        cut = np.zeros(tokens.size, dtype=bool)
        codes = []
        for i in range(WINDOW):
            cut |= padded[i: i + tokens.size] == SEPARATOR
            codes.append(np.where(cut, 0, padded[i: i + tokens.size].astype(np.uint64) + 1))
        words = []
        for w in range(self.num_words):
            word = np.zeros(tokens.size, dtype=np.uint64)
            for i in range(w * self.per_word, (w + 1) * self.per_word):  # (a last word's spare slots: 0)
                word = (word << np.uint64(self.bits)) | (codes[i] if i < WINDOW else np.uint64(0))
            words.append(word)
        self.order = np.lexsort(words[::-1]).astype(np.int32)  # [num_tokens] positions, sorted
        self.words = [word[self.order] for word in words]  # each [num_tokens] uint64, in that order

    @classmethod
    def from_documents(cls, documents: list[list[int]]) -> SuffixCorpus:
        parts = []
        for document in documents:
            parts.append(np.asarray(document, dtype=np.int32))
            parts.append(np.asarray([SEPARATOR], dtype=np.int32))
        return cls(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32))

    @classmethod
    def load(cls, path: str) -> SuffixCorpus:
        """A .npy file of token ids and separators (-1), as `python -m drafts suffix-corpus` writes."""
        tokens = np.load(path, allow_pickle=False)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"{path}: a suffix corpus is a 1-D array of integer token ids, got "
                             f"{tokens.dtype} {tokens.shape}")
        return cls(tokens.astype(np.int32))

    @property
    def num_tokens(self) -> int:
        return int(np.count_nonzero(self.tokens != SEPARATOR))

    def _range(self, key: tuple[int, ...]) -> tuple[int, int]:
        """[lo, hi) of the order where the windows start with key (len(key) <= WINDOW)."""
        if not key or len(key) > WINDOW:
            raise ValueError(f"a corpus key has 1 to {WINDOW} tokens, got {len(key)}")
        lo, hi = 0, self.order.size
        top = (1 << self.bits) - 1
        for w in range(self.num_words):
            first = w * self.per_word
            if first >= len(key) or lo >= hi:
                break
            low = high = 0
            for i in range(first, first + self.per_word):
                if i < len(key):
                    code = key[i] + 1 if key[i] >= 0 else 0
                    if code >= (1 << self.bits):
                        return 0, 0  # a token past every one in the corpus
                    low, high = (low << self.bits) | code, (high << self.bits) | code
                else:
                    low, high = low << self.bits, (high << self.bits) | top
            column = self.words[w]
            lo, hi = (lo + int(np.searchsorted(column[lo:hi], np.uint64(low), side="left")),
                      lo + int(np.searchsorted(column[lo:hi], np.uint64(high), side="right")))
        return lo, hi

    def occurs(self, key: tuple[int, ...]) -> bool:
        """Whether key occurs (maybe only at a document's end: sources() then finds nothing)."""
        lo, hi = self._range(key)
        return lo < hi

    def sources(self, key: tuple[int, ...], max_sources: int, max_follow: int) -> list[tuple[list[int], int]]:
        """Up to max_sources occurrences of key that have a continuation, as (tokens, end) for
        suffix.py's vote: tokens the key and up to max_follow tokens after it (to its document's
        end), end the key's last index. More occurrences than max_sources: evenly spaced over the
        sorted range, which orders them by what follows, so the vote's shares stay those of all."""
        lo, hi = self._range(key)
        if lo >= hi:
            return []
        starts = self.order[lo:hi]
        starts = starts[self.tokens[starts + len(key)] != SEPARATOR]
        if starts.size > max_sources:
            starts = starts[np.linspace(0, starts.size - 1, max_sources).round().astype(np.int64)]
        span = len(key) + max_follow
        out = []
        for start in starts.tolist():
            piece = self.tokens[start: start + span]
            stop = np.flatnonzero(piece == SEPARATOR)
            if stop.size:
                piece = piece[: stop[0]]
            out.append((piece.tolist(), len(key) - 1))
        return out


def resolve_suffix_corpus_path(config: SpeculativeConfig, target: ResolvedModel) -> str | None:
    """The suffix corpus to load: the configured file, none for "none", else the embedded model's
    shipped one (None where there is none)."""
    if config.suffix_corpus == "none":
        return None
    if config.suffix_corpus is not None:
        if not os.path.isfile(config.suffix_corpus):
            raise FileNotFoundError(f"suffix corpus {config.suffix_corpus!r} is not a file")
        return config.suffix_corpus
    return shipped_suffix_corpus_path(target)
