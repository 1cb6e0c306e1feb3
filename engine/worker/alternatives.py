"""Verifying runners-up for the first drafted token (a one-level token tree) with the plain,
causal paged-attention kernels.

A draft model that proposes c1..ck after a request's newest token x0 (at position P) can also
name runners-up for the first position, a_1..a_m (its next most likely tokens). When the target
rejects c1 its own token t at P + 1 is often one of them (the shipped head's top-4 holds the
target's token half as often again as its top-1 on chat); if t == a_j, a row for a_j gives one
more token, the target's token after a_j. The chain's rows cannot hold a_j (a_j's row must see
x0 but not c1), so each runner-up is verified in a sequence of its own, a pair [x0, a_j] at
positions [P, P + 1] that reads the request's KV before P. The pair writes its two KV entries
into scratch blocks kept past the scheduler's pool, so the request's own slots are never touched:
before the step the block holding P is copied into the pair's first scratch block (the pair
attends to that block's earlier positions through it), and when P + 1 starts a new block the
pair's second scratch block stands in for that one.

Why two rows and not one row with a tree mask: the attention kernels (C++, Triton, the torch
reference) are causal over a block table, and a mask would need a variant of each; at batch 1 on
a CPU a row costs ~0.5 ms of a ~40 ms step, so the duplicated x0 is cheap where this pays.

After verification (engine/worker/model_runner.py): when the target's token at P + 1 (the one
plain decoding emits there: the argmax, or the seeded/coupled sample) is a_j, the step emits
[a_j, bonus], the bonus sampled from a_j's row exactly as plain decoding samples at P + 2;
a_j's KV is copied from its scratch slot into the request's slot P + 1 (where c1's was written),
and a_j's state replaces c1's for an EAGLE head. Output is unchanged by construction: every
emitted token is the target's own at its position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.worker.input_batch import CachedRequestState, StepInputs

SCRATCH_BLOCKS = 16  # two per pair
MAX_PAIRS = SCRATCH_BLOCKS // 2  # pairs verified in one step at most


@dataclass
class Pair:
    """One runner-up's verification rows."""

    sample_index: int  # its request's index among the step's sampling requests
    rank: int  # 0: the first runner-up
    token: int  # a_j
    x0_row: int  # flat row of the request's newest token in the chain (c1's is the next)
    leaf_row: int  # flat row of a_j in the extended batch
    leaf_slot: int  # the scratch slot a_j's KV is written to
    target_slot: int  # the request's slot at P + 1, where a_j's KV belongs if it is accepted


@dataclass
class PairedInputs:
    """The step's inputs with the pairs appended as sequences of their own."""

    pairs: list[Pair]
    input_ids: np.ndarray  # [num_tokens + 2 * len(pairs)] int64
    positions: np.ndarray  # [num_tokens + 2 * len(pairs)] int64
    slot_mapping: np.ndarray  # [num_tokens + 2 * len(pairs)] int64
    query_start_loc: list[int]  # num_reqs + len(pairs) + 1
    seq_lens: list[int]  # num_reqs + len(pairs)
    block_table: np.ndarray  # [num_reqs + len(pairs), max_blocks] int32
    copy_from: list[int]  # blocks copied into the pairs' first scratch blocks before the step
    copy_to: list[int]


def pair_inputs(step: StepInputs, states: dict[str, CachedRequestState], alternatives: dict[str, list[int]],
                block_size: int, first_scratch_block: int, max_pairs: int) -> PairedInputs | None:
    """Pairs for the sampling requests that verify drafts after exactly one new token (x0) and
    have runners-up, in sampling order, at most max_pairs; None when there are none."""
    pairs: list[Pair] = []
    ids, positions, slots, tables, seq_lens = [], [], [], [], []
    copy_from: list[int] = []
    num_tokens = len(step.input_ids)
    for sample_index, row in enumerate(step.sample_rows):
        state = states[step.req_ids[row]]
        runners_up = alternatives.get(state.req_id)
        first = step.query_start_loc[row]
        if not runners_up or step.query_start_loc[row + 1] - first != 1 + len(state.spec_token_ids) \
                or not state.spec_token_ids:
            continue
        position = int(step.positions[first])  # P, x0's
        before, after = position // block_size, (position + 1) // block_size
        for rank, token in enumerate(runners_up):
            if len(pairs) == max_pairs:
                break
            scratch = first_scratch_block + 2 * len(pairs)
            table = step.block_table[row].copy()
            table[before] = scratch
            if after != before:
                table[after] = scratch + 1
            leaf_slot = int(table[after]) * block_size + (position + 1) % block_size
            pairs.append(Pair(sample_index, rank, token, first, num_tokens + 2 * len(pairs) + 1, leaf_slot,
                              int(step.slot_mapping[first + 1])))
            ids += [int(step.input_ids[first]), token]
            positions += [position, position + 1]
            slots += [scratch * block_size + position % block_size, leaf_slot]
            tables.append(table)
            seq_lens.append(position + 2)
            copy_from.append(int(step.block_table[row, before]))
    if not pairs:
        return None
    starts = list(step.query_start_loc)
    for _ in pairs:
        starts.append(starts[-1] + 2)
    return PairedInputs(
        pairs=pairs,
        input_ids=np.concatenate([step.input_ids, np.asarray(ids, dtype=np.int64)]),
        positions=np.concatenate([step.positions, np.asarray(positions, dtype=np.int64)]),
        slot_mapping=np.concatenate([step.slot_mapping, np.asarray(slots, dtype=np.int64)]),
        query_start_loc=starts,
        seq_lens=list(step.seq_lens) + seq_lens,
        block_table=np.concatenate([step.block_table, np.stack(tables)]).astype(np.int32),
        copy_from=copy_from,
        copy_to=[first_scratch_block + 2 * i for i in range(len(pairs))],
    )


def copy_blocks(kv_caches: list[torch.Tensor], copy_from: list[int], copy_to: list[int]) -> None:
    """Every layer's [2, num_blocks, num_kv_heads, block_size, head_dim] cache: blocks copy_from
    into copy_to."""
    device = kv_caches[0].device
    source = torch.tensor(copy_from, dtype=torch.int64, device=device)
    target = torch.tensor(copy_to, dtype=torch.int64, device=device)
    storage = kv_caches[0]._base
    if storage is not None and storage.dim() == 6 and len(kv_caches) == storage.shape[0] \
            and all(cache._base is storage for cache in kv_caches):
        # The layers are views of one [num_layers, 2, num_blocks, ...] tensor (allocate_kv_caches):
        # one copy instead of one per layer (~0.6 ms a step on this CPU at 30 layers).
        storage.index_copy_(2, target, storage.index_select(2, source))
        return
    for cache in kv_caches:
        cache.index_copy_(1, target, cache.index_select(1, source))


def copy_slots(kv_caches: list[torch.Tensor], copy_from: list[int], copy_to: list[int], block_size: int) -> None:
    """Every layer's cache: the KV of slots copy_from into slots copy_to."""
    for cache in kv_caches:
        for source, target in zip(copy_from, copy_to):
            cache[:, target // block_size, :, target % block_size] = cache[:, source // block_size, :, source % block_size]
