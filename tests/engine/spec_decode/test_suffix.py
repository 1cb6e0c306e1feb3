"""Suffix (model-free) drafting: exact proposals on repeated context and from recent outputs."""

from __future__ import annotations

from engine.spec_decode.proposer import ProposalRequest
from engine.spec_decode import suffix
from engine.spec_decode.suffix import SuffixProposer


def _propose(proposer: SuffixProposer, req_id: str, prompt: list[int], output: list[int], k: int):
    return proposer.propose([ProposalRequest(req_id, prompt, output, num_drafts=k)])[req_id]


def test_continues_the_longest_earlier_match() -> None:
    proposer = SuffixProposer(max_ngram=4, min_ngram=2)
    prompt = [5, 6, 7, 8, 9, 10, 1, 2, 3]
    # The context ends in "6 7", seen before followed by 8 9 10.
    proposal = _propose(proposer, "a", prompt, [5, 6, 7], k=3)
    assert proposal.token_ids == [8, 9, 10]
    assert proposal.expected_accepted == 3.0
    # Grows incrementally with the request's outputs: now "9 10" -> 1 2 3 5
    proposal = _propose(proposer, "a", prompt, [5, 6, 7, 8, 9, 10], k=4)
    assert proposal.token_ids == [1, 2, 3, 5]


def test_a_draft_is_at_most_twice_as_long_as_its_match() -> None:
    """SuffixDecoding's bound: a 2-token match drafts at most 4 tokens, a longer one more."""
    prompt = [1, 2, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 0]
    proposal = _propose(SuffixProposer(), "a", prompt, [7, 1, 2], k=16)  # "1 2" seen once: a 2-token match
    assert proposal.token_ids == [30, 31, 32, 33]
    unbounded = _propose(SuffixProposer(spec_factor=0.0), "a", prompt, [7, 1, 2], k=16)
    assert unbounded.token_ids == [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 0, 7, 1, 2]
    # A 3-token match ("1 2 3"; "9 1 2 3" never occurred): up to 6.
    prompt = [1, 2, 3, *range(40, 60)]
    proposal = _propose(SuffixProposer(), "b", prompt, [9, 1, 2, 3], k=16)
    assert proposal.token_ids == [40, 41, 42, 43, 44, 45]


def test_majority_vote_and_uncertainty_stop() -> None:
    proposer = SuffixProposer(max_ngram=2, min_ngram=2, min_vote_share=0.6)
    # "1 2" was followed by 3 4 twice and by 3 9 once: 3 is certain, 4 wins 2 of 3 votes.
    prompt = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 9, 0]
    proposal = _propose(proposer, "a", prompt, [1, 2], k=4)
    assert proposal.token_ids[:2] == [3, 4]
    assert proposal.expected_accepted < len(proposal.token_ids)


def test_no_match_proposes_nothing() -> None:
    proposer = SuffixProposer()
    assert _propose(proposer, "a", [1, 2, 3, 4], [5], k=4).token_ids == []


def test_finished_outputs_feed_later_requests_and_are_bounded() -> None:
    proposer = SuffixProposer(max_ngram=3, min_ngram=2, global_max_requests=2)
    proposer.propose([ProposalRequest("old", [100], [40, 41, 42, 43, 44], num_drafts=1)])
    proposer.finish("old", [40, 41, 42, 43, 44])
    # A new request whose context ends with "41 42" gets the old output's continuation.
    assert _propose(proposer, "new", [7, 8, 41, 42], [], k=2).token_ids == [43, 44]
    for i in range(3):  # older entries fall out of the bounded index
        proposer.finish(f"filler{i}", [200 + i, 201 + i, 202 + i, 203 + i])
    assert _propose(proposer, "newer", [9, 41, 42], [], k=2).token_ids == []


def _brute_force_sources(proposer: SuffixProposer, key: tuple[int, ...]) -> list[tuple[list[int], int]]:
    """key's occurrences with a continuation in the recent outputs the proposer still holds, by a
    scan of every output: the newest output first, the latest position first."""
    found = []
    for tokens in reversed(proposer._global.outputs.values()):
        found += [(tokens, end) for end in range(len(tokens) - 2, len(key) - 2, -1)
                  if tuple(tokens[end - len(key) + 1: end + 1]) == key]
    return found[: proposer.max_occurrences]


def test_recent_outputs_index_matches_a_scan_of_the_outputs_it_holds() -> None:
    import random

    rng = random.Random(1)
    proposer = SuffixProposer(max_ngram=4, min_ngram=2, max_occurrences=3, global_max_requests=6,
                              global_max_tokens=120)
    for r in range(40):
        proposer.finish(f"r{r}", [rng.randrange(4) for _ in range(rng.randrange(2, 40))])
        held = list(proposer._global.outputs.values())
        assert len(held) <= 6 and sum(map(len, held)) <= 120
        for n in range(1, 5):
            for _ in range(10):
                key = tuple(rng.randrange(4) for _ in range(n))
                expected = _brute_force_sources(proposer, key)
                assert proposer._global.sources(key) == expected
                assert proposer._global.occurs(key) == bool(expected)
    # Every occurrence of an output that left is gone (nothing kept alive by stale entries).
    numbers = set(proposer._global.outputs)
    assert all(packed >> suffix._END_BITS in numbers for found in proposer._global.ends.values()
               for packed in suffix._sequence(found))
    proposer.forget_outputs()
    assert not proposer._global.ends and proposer._global.num_tokens == 0


def _longest_first(proposer: SuffixProposer, index, num_drafts: int):
    """The search written the obvious way: every length from the longest down, all sources."""
    tokens = index.tokens
    for n in range(min(proposer.max_ngram, len(tokens)), proposer.min_ngram - 1, -1):
        key = tuple(tokens[-n:])
        sources = [(index.tokens, p) for p in index.occurrences(key, len(tokens))]
        sources += _brute_force_sources(proposer, key)
        if sources:
            return proposer._follow(sources[: proposer.max_occurrences], num_drafts)
    return None


def test_shortest_first_search_finds_what_longest_first_finds() -> None:
    import random

    rng = random.Random(0)
    proposer = SuffixProposer(max_ngram=6, min_ngram=2, max_occurrences=4, global_max_requests=5)
    for r in range(12):
        alphabet = rng.choice([3, 5, 12])  # small alphabets repeat, and trim the occurrence lists
        prompt = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))]
        output: list[int] = []
        for _ in range(40):
            got = _propose(proposer, f"r{r}", prompt, output, k=3)
            expected = _longest_first(proposer, proposer._requests[f"r{r}"], 3)
            assert (got.token_ids, got.confidence) == ((expected.token_ids, expected.confidence) if expected
                                                       else ([], []))
            output.append(rng.randrange(alphabet))
        proposer.finish(f"r{r}", output)


def test_single_occurrences_leave_nothing_for_the_garbage_collector_to_walk() -> None:
    """An n-gram seen once is a plain int, which gc does not track (lists of one, as before, made
    every gen-2 collection over a full global index take ~370 ms, pausing the engine mid-step);
    repeated ones keep their occurrences, oldest first, trimmed to max_occurrences."""
    import gc
    import random

    proposer = SuffixProposer(max_drafts=8)
    generator = random.Random(0)
    outputs = [[generator.randrange(500) for _ in range(60)] for _ in range(20)]
    outputs += outputs[:3]  # repeated text: n-grams with several occurrences
    for i, tokens in enumerate(outputs):
        proposer.finish(f"r{i}", tokens)
    proposer.propose([ProposalRequest("live", outputs[0][:30], [], num_drafts=4)])
    indexes = [proposer._global.ends, *(index.ends for index in proposer._requests.values())]
    entries = [found for ends in indexes for found in ends.values()]
    singles = [found for found in entries if isinstance(found, int)]
    assert len(singles) > len(entries) // 2 and not any(gc.is_tracked(found) for found in singles)
    repeated = [found for found in entries if not isinstance(found, int)]
    assert repeated and all(2 <= len(found) <= proposer.max_occurrences for found in repeated)
    assert all(list(found) == sorted(found) for found in repeated)


def test_index_prompts_indexes_a_new_requests_prompt_once_and_proposing_the_rest() -> None:
    proposer = SuffixProposer()
    prompt = [5, 6, 7, 8, 9] * 3
    request = ProposalRequest("a", prompt_token_ids=prompt, output_token_ids=[], num_drafts=4)
    proposer.index_prompts([request])
    index = proposer._requests["a"]
    assert index.tokens == prompt
    def occurrences() -> int:
        return sum(1 if isinstance(found, int) else len(found) for found in index.ends.values())

    before = occurrences()
    proposer.index_prompts([request])  # indexed already: nothing added
    assert index.tokens == prompt and occurrences() == before
    # Proposing indexes the outputs since, and follows the prompt's repeat.
    request.output_token_ids.extend([5, 6])
    assert proposer.propose([request])["a"].token_ids == [7, 8, 9, 5]
    assert index.tokens == prompt + [5, 6]
