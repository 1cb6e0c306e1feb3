"""The draft-confidence calibration: a calibrated prior, only tried drafts counted, learnt rates
per bin, and never a lower chance for a higher probability."""

from __future__ import annotations

import pytest

from engine.spec_decode.calibration import (MAX_ACCEPTANCE, NUM_BINS, PRIOR_TRIALS, ConfidenceCalibration,
                                            VoteCalibration)


def test_before_any_verification_a_draft_is_taken_at_its_word() -> None:
    calibration = ConfidenceCalibration()
    for b in range(NUM_BINS):
        assert calibration.acceptance((b + 0.5) / NUM_BINS) == pytest.approx((b + 0.5) / NUM_BINS)
    assert calibration.acceptance(0.0) == pytest.approx(0.05)
    assert calibration.acceptance(1.0) == pytest.approx(0.95)  # the top bin's midpoint
    assert calibration.next_chance == 0.5


def test_only_tried_drafts_count() -> None:
    calibration = ConfidenceCalibration()
    # Accepted, rejected, never tried: bins 9, 5 and 2.
    calibration.update([0.95, 0.55, 0.25], 1)
    assert calibration.trials[9] == pytest.approx(1.0) and calibration.accepted[9] == pytest.approx(1.0)
    assert calibration.trials[5] == pytest.approx(1.0) and calibration.accepted[5] == 0.0
    assert calibration.trials[2] == 0.0
    calibration.update([0.95, 0.95], 2)  # both accepted: nothing after them was tried
    assert calibration.trials[9] == pytest.approx(0.995 + 2)


def test_a_confident_draft_that_is_often_wrong_is_believed_less() -> None:
    calibration = ConfidenceCalibration()
    for _ in range(40):
        calibration.update([0.85], 0)
        calibration.update([0.85], 1)
    # Half of the 0.8-0.9 bin's drafts were accepted: the bin moves from 0.85 toward 0.5, below
    # the priors of the bins under it, which are pooled with it (a higher probability never
    # predicts less): 0.5-0.9 share one rate, a little above the bin's own.
    chance = calibration.acceptance(0.85)
    weight = sum(0.995 ** i for i in range(80))
    own = (weight / 2 + PRIOR_TRIALS * 0.85) / (weight + PRIOR_TRIALS)
    assert own <= chance < 0.6
    assert calibration.acceptance(0.55) == pytest.approx(chance)
    assert calibration.acceptance(0.45) == pytest.approx(0.45)
    table = [calibration.acceptance((b + 0.5) / NUM_BINS) for b in range(NUM_BINS)]
    assert table == sorted(table)
    assert calibration.acceptance(0.95) == pytest.approx(0.95)  # untouched bins keep their prior


def test_an_unlikely_token_that_is_always_right_caps_below_certainty() -> None:
    calibration = ConfidenceCalibration()
    for _ in range(500):
        calibration.update([0.15], 1)
    table = [calibration.acceptance((b + 0.5) / NUM_BINS) for b in range(NUM_BINS)]
    assert table == sorted(table)  # the bins above are pooled up to it
    assert max(table) <= MAX_ACCEPTANCE
    assert calibration.acceptance(0.15) > 0.9


def test_next_chance_follows_the_positions_computed() -> None:
    calibration = ConfidenceCalibration()
    for _ in range(1000):
        calibration.observe_next(0.3)
    assert calibration.next_chance == pytest.approx(0.3, abs=1e-4)


def test_a_vote_is_taken_at_its_share_before_any_verification() -> None:
    votes = VoteCalibration()
    # Each share at its bin's midpoint: 1.0 in the top bin (0.95), 0.55 in its own.
    assert votes.chances([1.0, 1.0, 0.55]) == pytest.approx([0.95, 0.95 ** 2, 0.95 ** 2 * 0.55])
    assert votes.chances([]) == []


def test_vote_trials_go_to_their_positions_table() -> None:
    votes = VoteCalibration()
    # Accepted, accepted, accepted, rejected, never tried.
    votes.update([1.0, 0.55, 0.55, 1.0, 1.0], 3)
    first, second, later = votes.tables
    assert (first.trials[9], first.accepted[9]) == (1.0, 1.0) and sum(first.trials) == 1.0
    assert (second.trials[5], second.accepted[5]) == (1.0, 1.0) and sum(second.trials) == 1.0
    assert (later.trials[5], later.accepted[5]) == (1.0, 1.0)  # the third draft
    assert (later.trials[9], later.accepted[9]) == (1.0, 0.0)  # the fourth; the fifth never tried
    assert sum(later.trials) == 2.0
    votes.update([0.55], 0)  # a first draft rejected: only the first table moves
    assert first.trials[5] == 1.0 and first.accepted[5] == 0.0 and sum(later.trials) == 2.0


def test_a_unanimous_first_draft_that_fails_half_the_time_does_not_doom_what_follows_it() -> None:
    votes = VoteCalibration()
    for _ in range(100):  # unanimous votes: the first draft half right; once it is, the rest hold
        votes.update([1.0] * 6, 0)
        votes.update([1.0] * 6, 6)
    chances = votes.chances([1.0] * 6)
    assert 0.45 < chances[0] < 0.6
    # Later drafts keep nearly all of the first's chance (a rate shared by every position would
    # have halved it at each).
    assert chances[5] / chances[0] > 0.9
    # A split vote at the first draft keeps its own (untouched) prior, below the unanimous one's.
    assert votes.chances([0.35])[0] == pytest.approx(0.35)

