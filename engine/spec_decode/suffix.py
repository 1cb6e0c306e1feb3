"""Model-free drafting from repeated text (prompt lookup / SuffixDecoding style).

Agent and code traffic repeats itself: tool names and arguments, file contents being edited,
JSON structure, earlier answers. For each request the proposer indexes every n-gram (n up to
max_ngram) of its own context as it grows, plus a bounded global index over recent requests'
outputs. To propose, it finds the longest suffix of the context that occurred before and follows
what came after it, position by position, by majority vote over the most recent occurrences
(a small frequency tree, like SuffixDecoding's): it stops where the vote gets too uncertain.
Where a fixed corpus of the target's past outputs (corpus.py) could draft more than the context
and recent outputs do, its occurrences vote instead (MIN_CORPUS_NGRAM). The
product of the vote shares estimates how many drafts the target will accept, which the hybrid
proposer compares with the draft model's.
"""

from __future__ import annotations

from array import array
from collections import Counter, OrderedDict

from engine.spec_decode.corpus import WINDOW, SuffixCorpus
from engine.spec_decode.proposer import Proposal, ProposalRequest

# An n-gram's occurrences: one occurrence is a plain int, more an int64 array (oldest first).
# The indexes hold one entry per distinct n-gram (1.8M for a full global index of 256 outputs of
# 1,000 tokens), and most occur once: an int is not tracked by the garbage collector, where every
# list (and every array: tracked too on this Python) is walked by each gen-2 collection. As
# lists, a collection over a full global index took 370 ms (and paused an 8-stream benchmark
# step for 62 ms); as arrays 226 ms; with the single occurrences as ints, see
# tests/engine/spec_decode/test_suffix.py.
_POSITIONS = "q"
_END_BITS = 32  # a global occurrence is packed as (output number << _END_BITS) | end
_END_MASK = (1 << _END_BITS) - 1
Occurrences = int | array


def _add_occurrence(ends: dict[tuple[int, ...], Occurrences], key: tuple[int, ...], value: int,
                    max_occurrences: int) -> None:
    found = ends.get(key)
    if found is None:
        ends[key] = value
        return
    if type(found) is int:
        found = ends[key] = array(_POSITIONS, (found,))
    found.append(value)
    if len(found) > max_occurrences:
        del found[0]


def _sequence(found: Occurrences | None) -> tuple[int, ...] | array:
    """The occurrences as a sequence, oldest first."""
    if found is None:
        return ()
    return (found,) if type(found) is int else found


class NgramIndex:
    """n-gram -> end positions (most recent last) over one growing token sequence."""

    def __init__(self, max_ngram: int, max_occurrences: int) -> None:
        self.max_ngram = max_ngram
        self.max_occurrences = max_occurrences
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], Occurrences] = {}  # n-gram -> end positions, increasing

    def extend(self, new_tokens: list[int]) -> None:
        tokens, ends = self.tokens, self.ends
        for token in new_tokens:
            tokens.append(token)
            end = len(tokens) - 1
            for n in range(1, min(self.max_ngram, len(tokens)) + 1):
                _add_occurrence(ends, tuple(tokens[end - n + 1 : end + 1]), end, self.max_occurrences)

    def occurrences(self, key: tuple[int, ...], before: int) -> list[int]:
        """End positions of `key` that end strictly before `before` and have a continuation,
        most recent first."""
        return [p for p in reversed(_sequence(self.ends.get(key))) if p < before - 1]

    def occurs(self, key: tuple[int, ...], before: int) -> bool:
        """Whether occurrences(key, before) is not empty (positions are kept in increasing order)."""
        positions = _sequence(self.ends.get(key))
        return bool(positions) and positions[0] < before - 1


class RecentOutputsIndex:
    """n-gram -> (output, end position) over recent finished outputs, most recent last: one dict
    for all of them, so a lookup costs the same with 256 outputs held as with one (a dict per
    output made every lookup walk all of them: 1.1 ms of an 8-stream step with 256 held).

    Outputs are numbered in the order they arrive and leave oldest first (bounded in count and
    tokens); leaving removes an output's occurrences from the front of each of its n-grams' lists,
    where the oldest are. Only positions with a continuation are indexed, so every occurrence
    can be followed."""

    def __init__(self, max_ngram: int, max_occurrences: int, max_outputs: int, max_tokens: int) -> None:
        self.max_ngram = max_ngram
        self.max_occurrences = max_occurrences
        self.max_outputs = max_outputs
        self.max_tokens = max_tokens
        self.outputs: OrderedDict[int, list[int]] = OrderedDict()  # number -> tokens, oldest first
        # n-gram -> (number << _END_BITS) | end of its occurrences, oldest first
        self.ends: dict[tuple[int, ...], Occurrences] = {}
        self.num_tokens = 0
        self._next = 0

    def _ngrams(self, tokens: list[int]):  # -> (key, end) for every end with a continuation
        for end in range(len(tokens) - 1):
            for n in range(1, min(self.max_ngram, end + 1) + 1):
                yield tuple(tokens[end - n + 1: end + 1]), end

    def add(self, tokens: list[int]) -> None:
        if len(tokens) > _END_MASK:
            raise ValueError(f"an output of {len(tokens)} tokens is longer than the index packs")
        number = self._next
        self._next += 1
        self.outputs[number] = tokens
        self.num_tokens += len(tokens)
        ends = self.ends
        packed_number = number << _END_BITS
        for key, end in self._ngrams(tokens):
            _add_occurrence(ends, key, packed_number | end, self.max_occurrences)
        while self.outputs and (len(self.outputs) > self.max_outputs or self.num_tokens > self.max_tokens):
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        number, tokens = self.outputs.popitem(last=False)
        self.num_tokens -= len(tokens)
        ends = self.ends
        for key, _ in self._ngrams(tokens):
            found = ends.get(key)
            if found is None:
                continue  # an earlier n-gram of this output emptied it already
            if type(found) is int:
                if found >> _END_BITS == number:
                    del ends[key]
                continue
            while found and found[0] >> _END_BITS == number:  # (trimmed to max_occurrences, maybe gone)
                del found[0]
            if not found:
                del ends[key]

    def occurs(self, key: tuple[int, ...]) -> bool:
        return key in self.ends

    def sources(self, key: tuple[int, ...]) -> list[tuple[list[int], int]]:
        """(tokens, end) of key's occurrences, most recent first."""
        outputs = self.outputs
        found = reversed(_sequence(self.ends.get(key)))
        return [(outputs[packed >> _END_BITS], packed & _END_MASK) for packed in found]

    def clear(self) -> None:
        self.outputs.clear()
        self.ends.clear()
        self.num_tokens = 0


# A draft is at most this many times as long as the suffix it continues (SuffixDecoding's
# max_spec_factor): a 2-token match is weak evidence for 16 tokens to come, an 8-token one is not.
# Side by side (a throwaway A/B script, engines' steps interleaved as in the speculative
# benchmark; bf16, 2 CPU threads; against drafting up to the cap whatever the match): suffix at
# one stream code 1.64x against 1.60x, agent turns 3.55x against 3.47x; at two streams code 1.17x
# against 1.14x, agent 2.26x against 2.21x; hybrid at one stream code 1.88x against 1.72x (a
# second run: 1.97x both). A factor of 1 cut too much (agent 3.13x).
SPEC_FACTOR = 2.0
# The shortest suffix of the context followed in a corpus (corpus.py). The corpus is only
# consulted where it could draft more than the context and recent outputs did (its match allows
# more drafts than they proposed) and is followed only where it drafts more: side by side (hybrid,
# one stream, code, float32, 2 rounds), taking the corpus's drafts whenever it matched longer made
# 1.62x of none against 1.66x without a corpus (the head lost steps it would have won), this rule
# 1.72x at a minimum of 3 and of 5 alike.
MIN_CORPUS_NGRAM = 3


class SuffixProposer:
    def __init__(self, *, max_drafts: int = 16, max_ngram: int = 8, min_ngram: int = 2, max_occurrences: int = 32,
                 min_vote_share: float = 0.5, global_max_requests: int = 256, global_max_tokens: int = 1 << 18,
                 spec_factor: float = SPEC_FACTOR, corpus: SuffixCorpus | None = None,
                 min_corpus_ngram: int = MIN_CORPUS_NGRAM) -> None:
        self.max_drafts = max_drafts  # per request per step (SpeculativeConfig.num_suffix_tokens)
        self.spec_factor = spec_factor  # drafts per matched token at most (0: no such bound)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_occurrences = max_occurrences
        self.min_vote_share = min_vote_share
        self._requests: dict[str, NgramIndex] = {}
        # Recent finished outputs, bounded in count and tokens.
        self._global = RecentOutputsIndex(max_ngram, max_occurrences, global_max_requests, global_max_tokens)
        # A fixed corpus of the target's past outputs (corpus.py), or None; kept by forget_outputs.
        self.corpus = corpus
        self.min_corpus_ngram = min_corpus_ngram

    # ---- bookkeeping -------------------------------------------------------------------------
    def _index_for(self, request: ProposalRequest) -> NgramIndex:
        index = self._requests.get(request.req_id)
        if index is None:
            index = self._requests[request.req_id] = NgramIndex(self.max_ngram, self.max_occurrences)
        num_prompt = len(request.prompt_token_ids)
        have = len(index.tokens)
        if have < num_prompt:
            index.extend(request.prompt_token_ids[have:])
            have = num_prompt
        index.extend(request.output_token_ids[have - num_prompt :])
        return index

    def index_prompts(self, requests: list[ProposalRequest]) -> None:
        """Indexes the prompts not indexed yet (a new request's: once, and a 2k-token agent prompt
        takes ~10 ms; propose indexes the rest). The controller times it apart: not a step's cost."""
        for request in requests:
            index = self._requests.get(request.req_id)
            if index is None or len(index.tokens) < len(request.prompt_token_ids):
                self._index_for(request)

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        self._requests.pop(req_id, None)
        if not output_token_ids or len(output_token_ids) < self.min_ngram + 1:
            return
        self._global.add(list(output_token_ids))

    def forget_outputs(self) -> None:
        """Drops the global index of finished requests' outputs (running requests keep theirs)."""
        self._global.clear()

    # ---- proposing ---------------------------------------------------------------------------
    def propose(self, requests: list[ProposalRequest], max_drafts: int | None = None) -> dict[str, Proposal]:
        """Up to request.num_drafts tokens each, never more than max_drafts (None: self.max_drafts)."""
        cap = self.max_drafts if max_drafts is None else min(max_drafts, self.max_drafts)
        proposals: dict[str, Proposal] = {}
        for request in requests:
            index = self._index_for(request)
            proposals[request.req_id] = self._propose_one(index, min(request.num_drafts, cap))
        return proposals

    def _propose_one(self, index: NgramIndex, num_drafts: int) -> Proposal:
        tokens = index.tokens
        # The longest suffix that occurred before. Searched from the shortest up: wherever an
        # n-gram occurs its last n - 1 tokens occur too, so the first miss ends the search, and
        # the common case (no repeat at all) costs one lookup per index instead of one per length.
        longest = 0
        for n in range(self.min_ngram, min(self.max_ngram, len(tokens)) + 1):
            key = tuple(tokens[-n:])
            if not (index.occurs(key, len(tokens)) or self._global.occurs(key)):
                break
            longest = n
        proposal = Proposal([])
        if longest:
            key = tuple(tokens[-longest:])
            sources = [(index.tokens, p) for p in index.occurrences(key, len(tokens))]
            if len(sources) < self.max_occurrences:
                sources += self._global.sources(key)
            proposal = self._follow(sources[: self.max_occurrences], self._bounded(num_drafts, longest))
        if self.corpus is not None:
            proposal = self._from_corpus(tokens, num_drafts, proposal)
        return proposal

    def _bounded(self, num_drafts: int, longest: int) -> int:
        return min(num_drafts, int(self.spec_factor * longest)) if self.spec_factor else num_drafts

    def _from_corpus(self, tokens: list[int], num_drafts: int, proposal: Proposal) -> Proposal:
        """The corpus's drafts where they are more than `proposal`'s (see MIN_CORPUS_NGRAM)."""
        longest_possible = min(self.max_ngram, WINDOW, len(tokens))
        if self._bounded(num_drafts, longest_possible) <= len(proposal.token_ids):
            return proposal  # (agent turns: their own context's matches run long)
        # The longest suffix of the context that occurs in the corpus, by bisection (wherever an
        # n-gram occurs its shorter suffixes do too): each lookup is a few binary searches.
        longest, high = 0, longest_possible
        low = self.min_corpus_ngram
        while low <= high:
            n = (low + high) // 2
            if self.corpus.occurs(tuple(tokens[-n:])):
                longest, low = n, n + 1
            else:
                high = n - 1
        room = self._bounded(num_drafts, longest) if longest else 0
        if room <= len(proposal.token_ids):
            return proposal
        sources = self.corpus.sources(tuple(tokens[-longest:]), self.max_occurrences, room)
        found = self._follow(sources, room)
        if len(found.token_ids) <= len(proposal.token_ids):
            return proposal
        found.from_corpus = True
        return found

    def _follow(self, sources: list[tuple[list[int], int]], num_drafts: int) -> Proposal:
        """Majority vote, position by position, over what followed each occurrence."""
        drafted: list[int] = []
        shares: list[float] = []  # per draft, the share of the occurrences still followed that vote for it
        survival: list[float] = []  # the vote's estimate that each draft is accepted
        confidence = 1.0
        alive = sources
        for offset in range(1, num_drafts + 1):
            votes = Counter(seq[end + offset] for seq, end in alive if end + offset < len(seq))
            if not votes:
                break
            token, count = votes.most_common(1)[0]
            share = count / len(alive)
            if share < self.min_vote_share and offset > 1:
                break
            confidence *= share
            shares.append(share)
            survival.append(confidence)
            drafted.append(token)
            alive = [(seq, end) for seq, end in alive if end + offset < len(seq) and seq[end + offset] == token]
        return Proposal(drafted, None, sum(survival), survival, token_probs=shares)
