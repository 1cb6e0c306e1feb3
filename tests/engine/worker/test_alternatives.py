"""Runners-up of a first draft, verified as pairs [x0, a_j] in scratch blocks: the rows, slots
and block tables they get, which requests get them, and the KV copies around the step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.worker.alternatives import copy_blocks, copy_slots, pair_inputs
from engine.worker.input_batch import CachedRequestState, build_step_inputs

BLOCK = 4
SCRATCH = 100  # the first scratch block


def state(req_id: str, num_prompt: int, computed: int, drafts: list[int], blocks: list[int],
          alternatives: list[int]) -> CachedRequestState:
    """A request with num_prompt prompt tokens (ids 1..), one output token (50), computed up to
    `computed`, verifying `drafts` this step."""
    return CachedRequestState(req_id, list(range(1, num_prompt + 1)), [50], SamplingParams(), blocks, computed,
                              spec_token_ids=list(drafts), spec_alternatives=list(alternatives))


def build(states: list[CachedRequestState], max_pairs: int = 8):
    by_id = {s.req_id: s for s in states}
    scheduled = {s.req_id: s.num_tokens + len(s.spec_token_ids) - s.num_computed_tokens for s in states}
    step = build_step_inputs(by_id, list(by_id), scheduled, BLOCK)
    alternatives = {s.req_id: s.spec_alternatives for s in states}
    return step, pair_inputs(step, by_id, alternatives, BLOCK, SCRATCH, max_pairs)


def test_a_pair_inside_one_block_reads_a_copy_of_it() -> None:
    # 6 prompt tokens + 1 output: x0 (token 50) at P = 6, drafts at 7 and 8; blocks 3, 5, 9.
    step, paired = build([state("a", 6, 6, [20, 21], [3, 5, 9], [30, 31])])
    assert [p.token for p in paired.pairs] == [30, 31] and [p.rank for p in paired.pairs] == [0, 1]
    # The chain's 3 rows, then two rows per pair.
    assert paired.input_ids.tolist() == [50, 20, 21, 50, 30, 50, 31]
    assert paired.positions.tolist() == [6, 7, 8, 6, 7, 6, 7]
    assert paired.query_start_loc == [0, 3, 5, 7] and paired.seq_lens == [9, 8, 8]
    # P and P + 1 share logical block 1: each pair's table points it at its own scratch block.
    assert paired.block_table.tolist() == [[3, 5, 9], [3, 100, 9], [3, 102, 9]]
    assert paired.slot_mapping.tolist()[3:] == [100 * 4 + 2, 100 * 4 + 3, 102 * 4 + 2, 102 * 4 + 3]
    assert (paired.copy_from, paired.copy_to) == ([5, 5], [100, 102])
    first, second = paired.pairs
    assert (first.x0_row, first.leaf_row, second.leaf_row) == (0, 4, 6)
    assert first.leaf_slot == 100 * 4 + 3 and first.target_slot == 5 * 4 + 3  # c1's slot
    assert step.slot_mapping[1] == first.target_slot


def test_a_pair_across_a_block_boundary_uses_a_second_scratch_block() -> None:
    # x0 at P = 7, the last slot of logical block 1; P + 1 = 8 opens logical block 2.
    _, paired = build([state("b", 7, 7, [20], [3, 5, 9], [30])])
    assert paired.block_table.tolist()[1] == [3, 100, 101]
    assert paired.slot_mapping.tolist()[2:] == [100 * 4 + 3, 101 * 4 + 0]
    assert paired.pairs[0].target_slot == 9 * 4 + 0
    assert paired.copy_from == [5]  # the block holding P (its positions before P are read)


def test_only_requests_verifying_drafts_after_one_new_token_get_pairs() -> None:
    states = [state("none", 6, 6, [], [3, 5], [30]),  # no drafts scheduled: nothing to pair with
              state("two", 6, 5, [20], [4, 6], [31]),  # two new tokens (recomputing): skipped
              state("ok", 6, 6, [20], [7, 8], [32]),
              state("bare", 6, 6, [20], [10, 11], [])]  # no runners-up
    step, paired = build(states)
    assert [(p.token, p.sample_index) for p in paired.pairs] == [(32, 2)]
    assert paired.pairs[0].x0_row == step.query_start_loc[2]
    assert build([state("none", 6, 6, [], [3, 5], [30])])[1] is None


def test_pairs_stop_at_the_cap() -> None:
    _, paired = build([state("a", 6, 6, [20], [3, 5], [30, 31, 32]), state("b", 6, 6, [21], [7, 8], [33])],
                      max_pairs=2)
    assert [p.token for p in paired.pairs] == [30, 31]
    assert paired.copy_to == [100, 102]


def caches(num_blocks: int = 6, layers: int = 2) -> list[torch.Tensor]:
    return [torch.randn(2, num_blocks, 3, BLOCK, 5) for _ in range(layers)]


@pytest.mark.parametrize("layout", ["separate", "views of one tensor"])
def test_copy_blocks_copies_whole_blocks_of_every_layer(layout: str) -> None:
    kv = caches() if layout == "separate" else list(torch.randn(2, 2, 6, 3, BLOCK, 5).unbind(0))
    before = [c.clone() for c in kv]
    copy_blocks(kv, [1, 1], [4, 5])
    for old, new in zip(before, kv):
        assert torch.equal(new[:, 4], old[:, 1]) and torch.equal(new[:, 5], old[:, 1])
        assert torch.equal(new[:, :4], old[:, :4])


def test_copy_slots_moves_one_position_and_nothing_else() -> None:
    kv = caches()
    before = [c.clone() for c in kv]
    copy_slots(kv, [4 * 4 + 3], [2 * 4 + 1], BLOCK)  # block 4 offset 3 -> block 2 offset 1
    for old, new in zip(before, kv):
        assert torch.equal(new[:, 2, :, 1], old[:, 4, :, 3])
        changed = (new != old).any(dim=(0, 2, 4))  # [num_blocks, block_size]
        expected = np.zeros((6, BLOCK), dtype=bool)
        expected[2, 1] = True
        assert np.array_equal(changed.numpy(), expected)
