"""The suffix corpus (a fixed index of the target's past outputs): exact lookups against brute
force, documents kept apart, its drafts in the suffix proposer, their acceptance learnt apart by
the controller, and the file's resolution."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.config import SpeculativeConfig
from engine.model.resolve import EMBEDDED_MODEL_NAME, ResolvedModel
from engine.spec_decode.controller import SpeculationController
from engine.spec_decode.corpus import SEPARATOR, WINDOW, SuffixCorpus, resolve_suffix_corpus_path
from engine.spec_decode.proposer import ProposalRequest
from engine.spec_decode.suffix import SuffixProposer


def _occurrences(documents: list[list[int]], key: tuple[int, ...]) -> list[tuple[int, int]]:
    """(document, start) of every occurrence of key with at least one token after it."""
    found = []
    for d, doc in enumerate(documents):
        for start in range(len(doc) - len(key)):
            if tuple(doc[start: start + len(key)]) == key:
                found.append((d, start))
    return found


@pytest.mark.parametrize("vocab", [7, 60, 150_000])  # 16-bit codes, and 18-bit ones (3 per word)
def test_lookups_match_brute_force(vocab: int) -> None:
    rng = random.Random(vocab)
    documents = [[rng.randrange(vocab if vocab < 100 else 5) + (0 if vocab < 100 else vocab - 5)
                  for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    corpus = SuffixCorpus.from_documents(documents)
    assert corpus.num_tokens == sum(map(len, documents))
    keys = []
    for _ in range(300):
        doc = rng.choice(documents)
        n = rng.randrange(1, WINDOW + 1)
        start = rng.randrange(0, max(1, len(doc) - n + 1))
        keys.append(tuple(doc[start: start + n]))  # mostly present (shorter at a document's end)
        keys.append(tuple(rng.choice(doc) for _ in range(n)))  # often absent
    for key in keys:
        expected = _occurrences(documents, key)
        lo, hi = corpus._range(key)
        # Every position in the range starts the key, and every start of the key is in it.
        starts = sorted(corpus.order[lo:hi].tolist())
        flat = []
        offset = 0
        for d, doc in enumerate(documents):
            flat += [offset + s for s in range(len(doc) - len(key) + 1) if tuple(doc[s: s + len(key)]) == key]
            offset += len(doc) + 1
        assert starts == flat, key
        assert corpus.occurs(key) == bool(flat)
        sources = corpus.sources(key, max_sources=1000, max_follow=5)
        assert len(sources) == len(expected)
        got = sorted((tuple(seq), end) for seq, end in sources)
        want = sorted((tuple(documents[d][s: s + len(key) + 5]), len(key) - 1) for d, s in expected)
        assert got == want


def test_keys_never_cross_documents_and_long_ranges_are_sampled_evenly() -> None:
    corpus = SuffixCorpus.from_documents([[1, 2, 3], [4, 5, 6]])
    assert not corpus.occurs((3, 4))  # the end of one document and the start of the next
    assert corpus.sources((2, 3), 8, 4) == []  # at a document's end: nothing follows
    # 100 occurrences of "9 9", followed by 1 (70 times) or 2 (30): 10 sources keep the shares.
    corpus = SuffixCorpus.from_documents([[9, 9, 1]] * 70 + [[9, 9, 2]] * 30)
    sources = corpus.sources((9, 9), max_sources=10, max_follow=1)
    assert len(sources) == 10
    assert sum(seq[2] == 1 for seq, _ in sources) == 7


def test_load_checks_the_file(tmp_path) -> None:
    path = tmp_path / "c.npy"
    np.save(path, np.asarray([3, 4, 5, SEPARATOR, 6, 7], dtype=np.int32))
    corpus = SuffixCorpus.load(str(path))
    assert corpus.num_tokens == 5 and corpus.occurs((6, 7)) and not corpus.occurs((5, 6))
    np.save(path, np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="1-D array of integer"):
        SuffixCorpus.load(str(path))
    np.save(path, np.asarray([1.5, 2.0]))
    with pytest.raises(ValueError, match="1-D array of integer"):
        SuffixCorpus.load(str(path))
    with pytest.raises(ValueError, match="separators"):
        SuffixCorpus(np.asarray([1, -2, 3]))
    with pytest.raises(ValueError, match="1 to 8 tokens"):
        corpus.occurs(tuple(range(WINDOW + 1)))


def _propose(proposer: SuffixProposer, prompt: list[int], output: list[int], k: int = 16):
    proposer.finish("r", None)  # a new request each time (its context index starts over)
    return proposer.propose([ProposalRequest("r", prompt, output, num_drafts=k)])["r"]


def test_the_proposer_follows_the_corpus_where_it_drafts_more() -> None:
    corpus = SuffixCorpus.from_documents([[50, 51, 52, 53, 54, 55, 56, 57, 58, 59]])
    proposer = SuffixProposer(corpus=corpus)
    # Nothing in the context repeats; the corpus continues "51 52 53" (a 3-token match: up to 6).
    proposal = _propose(proposer, [1, 2, 3], [51, 52, 53])
    assert proposal.token_ids == [54, 55, 56, 57, 58, 59] and proposal.from_corpus
    # A 2-token match is below MIN_CORPUS_NGRAM: the corpus is not followed.
    assert _propose(proposer, [1, 2, 3], [9, 52, 53]).token_ids == []
    # The context's own match drafts as many as the corpus could (16): the context's is kept.
    context = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 0]
    corpus = SuffixCorpus.from_documents([[60, 61, 62, 63, 64, 65, 66, 67, 68, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    proposal = _propose(SuffixProposer(corpus=corpus), context, [60, 61, 62, 63, 64, 65, 66, 67, 68])
    assert proposal.token_ids == list(range(69, 81)) + [0, 60, 61, 62] and not proposal.from_corpus
    # Without a corpus, the same context proposes the same.
    assert _propose(SuffixProposer(), context, [60, 61, 62, 63, 64, 65, 66, 67, 68]).token_ids == proposal.token_ids


def test_the_controller_learns_corpus_drafts_apart() -> None:
    corpus = SuffixCorpus.from_documents([[40, 41, 42, 43, 44, 45, 46, 47, 48]])
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=4)
    spec = SpeculationController(config, suffix=SuffixProposer(corpus=corpus), draft=None)
    for n in (1, 8, 24, 8, 40, 16, *range(1, 49)):
        spec.observe_step(n, 0.030 + 0.001 * n)
    before_suffix = spec._pooled["suffix"].p
    drafted = []
    for _ in range(10):  # the target rejects every corpus draft
        proposals = spec.propose([ProposalRequest("a", [1, 2, 3], [41, 42, 43], num_drafts=6)], batch_size=1)
        drafted.append(proposals["a"].token_ids)
        spec.record("a", len(proposals["a"].token_ids), 0)
    assert drafted[0][:2] == [44, 45]
    # Corpus drafts are priced by their votes (one occurrence: every share 1.0), calibrated by
    # position: the first draft's chance fell from the prior's 0.95 (its bin, at ~0.27, is pooled
    # with the untried bins below it, which a higher share never falls under); the later
    # positions, never tried, keep theirs.
    first, second, later = spec.votes["corpus"].tables
    assert sum(first.trials) > 5 and first.acceptance(1.0) < 0.55
    assert sum(second.trials) == sum(later.trials) == 0.0
    assert spec.votes["corpus"].chances([1.0, 1.0]) == pytest.approx([first.acceptance(1.0),
                                                                     first.acceptance(1.0) * 0.95])
    # Their verifications keep no accepted/trials rates, per request or pooled, and the
    # context's drafts keep their own rates, untouched, and no vote tables.
    assert "corpus" not in spec._pooled and not any(key[0] == "a" for key in spec._acceptance)
    assert spec._pooled["suffix"].p == before_suffix
    assert "suffix" not in spec.votes
    spec.finish("a", None)
    assert "a" not in spec._method


def _resolved(name: str) -> ResolvedModel:
    return ResolvedModel("/nowhere", "hf", name)


def test_resolving_the_corpus_file(tmp_path) -> None:
    shipped = resolve_suffix_corpus_path(SpeculativeConfig(method="hybrid"), _resolved(EMBEDDED_MODEL_NAME))
    assert shipped is not None and SuffixCorpus.load(shipped).num_tokens > 100_000
    assert resolve_suffix_corpus_path(SpeculativeConfig(method="hybrid"), _resolved("other")) is None
    assert resolve_suffix_corpus_path(SpeculativeConfig(method="suffix", suffix_corpus="none"),
                                      _resolved(EMBEDDED_MODEL_NAME)) is None
    path = tmp_path / "c.npy"
    np.save(path, np.asarray([1, 2, 3], dtype=np.int32))
    assert resolve_suffix_corpus_path(SpeculativeConfig(method="suffix", suffix_corpus=str(path)),
                                      _resolved("other")) == str(path)
    with pytest.raises(FileNotFoundError, match="not a file"):
        resolve_suffix_corpus_path(SpeculativeConfig(method="suffix", suffix_corpus=str(tmp_path / "missing.npy")),
                                   _resolved("other"))
