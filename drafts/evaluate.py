"""Acceptance of a draft against its target, on held-out prompts, without running speculation.

For each held-out prompt the target writes its own continuation (engine.LLM; greedy, and
sampled at temperature 1). One teacher-forced forward of the draft (and of the target) over
prompt + continuation then gives, at every continuation position, what a draft step starting
there would propose:

- greedy: a step that starts at position t drafts up to k tokens; while the draft's previous
  proposals matched the target's tokens its context is the true one, so its proposal at
  t + j is the argmax of its teacher-forced logits there. Steps are replayed exactly as the
  engine runs them: accept the longest matching run (at most k), take the target's token after
  it (the bonus or the correction), start the next step there;
- temperature 1: rejection sampling accepts a drafted token with probability
  alpha_i = sum_x min(p_i(x), q_i(x)) when the draft samples from q (the standard result), so a
  step starting at t accepts E_t = sum_{j<=k} prod_{i<j} alpha_{t+i} tokens in expectation,
  averaged over every start t. For a greedy draft (proposals = argmax q) the probability is
  p_i(argmax q_i); both are reported.

Reported per kind of prompt (code, chat, tool) and k = 1..max_k: acceptance rate (accepted /
drafted), mean accepted drafts per step, and mean accepted length = accepted drafts per step + 1
(tokens per target forward, the bonus token included: vLLM's and docs/speculative.md's convention).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from engine.llm import LLM
from engine.sampling_params import SamplingParams

from drafts.model import TrainableLlama


@dataclass
class AcceptanceCounts:
    """Totals for one (mode, kind, k)."""

    steps: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    # [k] accepted / drafted counts of each drafted position within a step
    accepted_per_pos: list[float] = field(default_factory=list)
    drafted_per_pos: list[float] = field(default_factory=list)

    def add_step(self, drafted: int, accepted: float | list[float]) -> None:
        """accepted: a count (greedy) or the per-position acceptance probabilities' running
        products (sampled), one per drafted position."""
        self.steps += 1
        self.drafted += drafted
        per_pos = accepted if isinstance(accepted, list) else [1.0 if j < accepted else 0.0 for j in range(drafted)]
        self.accepted += sum(per_pos)
        while len(self.accepted_per_pos) < drafted:
            self.accepted_per_pos.append(0.0)
            self.drafted_per_pos.append(0.0)
        for j in range(drafted):
            self.accepted_per_pos[j] += per_pos[j]
            self.drafted_per_pos[j] += 1

    def merge(self, other: AcceptanceCounts) -> None:
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        for j in range(len(other.drafted_per_pos)):
            if j >= len(self.drafted_per_pos):
                self.accepted_per_pos.append(0.0)
                self.drafted_per_pos.append(0.0)
            self.accepted_per_pos[j] += other.accepted_per_pos[j]
            self.drafted_per_pos[j] += other.drafted_per_pos[j]

    def summary(self) -> dict[str, Any]:
        return {
            "acceptance_rate": self.accepted / max(self.drafted, 1e-9),
            # vLLM's convention (docs/speculative.md): tokens per target step, the bonus included.
            "mean_accepted_length": self.accepted / max(self.steps, 1e-9) + 1,
            "mean_accepted_drafts": self.accepted / max(self.steps, 1e-9),
            "steps": self.steps,
            "per_position_acceptance": [a / max(d, 1e-9) for a, d in zip(self.accepted_per_pos, self.drafted_per_pos)],
        }


def greedy_steps(matches: list[bool], k: int) -> AcceptanceCounts:
    """Replays greedy speculation over one continuation. matches[i]: the draft's teacher-forced
    argmax before continuation token i equals it."""
    return replay_greedy(lambda t, j: matches[t + j], len(matches), k)


def replay_greedy(match: Callable[[int, int], bool], n: int, k: int) -> AcceptanceCounts:
    """Greedy speculation over a continuation of n tokens: match(t, j) says whether the j-th
    draft of a step that starts before continuation token t equals token t + j (asked only while
    the drafts before it matched)."""
    counts = AcceptanceCounts()
    t = 0
    while t < n:
        drafted = min(k, n - t)
        accepted = 0
        while accepted < drafted and match(t, accepted):
            accepted += 1
        counts.add_step(drafted, accepted)
        t += accepted + 1  # the target's own token after the accepted run
    return counts


@torch.no_grad()
def eagle_rollout_matches(proposer: Any, states: torch.Tensor, prompt: list[int], continuation: list[int],
                          max_k: int) -> list[list[bool]]:
    """An EAGLE head's drafts from every start of a continuation, through the engine's own
    proposer (engine/spec_decode/eagle.py): matches[t][j] says whether the j-th draft of a step
    starting before continuation token t equals token t + j. states: [len(prompt + continuation),
    hidden] the target's final states (teacher-forced). They are stored as the runner stores a
    step's states; each start's catch-up then writes the head's KV from them up to its context
    (the first start over the prompt, each later one over one more position, rewriting what
    the previous start's drafts wrote from predicted states)."""
    from engine.spec_decode.draft_model import position_slots
    from engine.spec_decode.proposer import ProposalRequest

    sequence = prompt + continuation
    length = len(sequence)
    block_ids = list(range(-(-(length + max_k) // proposer.block_size)))
    proposer.finish("eval", None)  # a new sequence in the same blocks
    proposer.forget_blocks(block_ids)
    proposer.observe(states, np.asarray(sequence, dtype=np.int64), position_slots(block_ids, proposer.block_size, 0, length))
    matches: list[list[bool]] = []
    for t in range(len(continuation)):
        newest = len(prompt) + t - 1  # the context's last token; the head's newest output is before it
        if newest < 1:
            matches.append([])
            continue
        wanted = min(max_k, len(continuation) - t)
        request = ProposalRequest("eval", sequence[: newest + 1], [], num_drafts=wanted, block_ids=block_ids)
        drafts = proposer.propose([request])["eval"].token_ids
        matches.append([d == c for d, c in zip(drafts, continuation[t: t + wanted])])
    return matches


def sampled_steps(alphas: list[float], k: int) -> AcceptanceCounts:
    """Expected acceptance of a step starting at every position. alphas[i]: the probability of
    accepting the drafted token before continuation token i given an accepted prefix."""
    counts = AcceptanceCounts()
    n = len(alphas)
    for t in range(n):
        drafted = min(k, n - t)
        survive = 1.0
        per_pos = []
        for j in range(drafted):
            survive *= alphas[t + j]
            per_pos.append(survive)
        counts.add_step(drafted, per_pos)
    return counts


@torch.no_grad()
def position_scores(
    draft: TrainableLlama,
    teacher: TrainableLlama | None,
    prompt: list[int],
    continuation: list[int],
    device: torch.device,
) -> dict[str, list[float] | list[bool]]:
    """Per continuation token: greedy match, and (with a teacher) alpha = sum min(p, q),
    beta = p(argmax q) and whether the teacher's own argmax is the token (on a greedy
    continuation, a check that the teacher computes what the engine generated with)."""
    sequence = torch.tensor([prompt + continuation], dtype=torch.int64, device=device)
    # Logits at position i predict token i + 1: the continuation is predicted from len(prompt) - 1.
    first, last = len(prompt) - 1, len(prompt) + len(continuation) - 1
    draft_logits = draft.logits(draft(sequence)[0, first:last])  # [n, num_outputs]
    next_tokens = sequence[0, first + 1: last + 1]  # [n]
    draft_rows = draft_logits.argmax(-1)
    draft_top = draft_rows if draft.vocab_ids is None else draft.vocab_ids[draft_rows]  # [n] target ids
    out: dict[str, list[float] | list[bool]] = {"match": (draft_top == next_tokens).tolist()}
    if teacher is not None:
        p = torch.softmax(teacher.logits(teacher(sequence)[0, first:last]), dim=-1)  # [n, vocab]
        q = torch.softmax(draft_logits, dim=-1)  # [n, num_outputs]
        p_on_draft_vocab = p if draft.vocab_ids is None else p[:, draft.vocab_ids]
        out["alpha"] = torch.minimum(p_on_draft_vocab, q).sum(-1).clamp(max=1.0).tolist()
        out["beta"] = p.gather(1, draft_top[:, None])[:, 0].tolist()
        out["target_match"] = (p.argmax(-1) == next_tokens).tolist()
    return out


def continuations(llm: LLM, prompts: list[list[int]], *, temperature: float, max_new_tokens: int, seed: int,
                  cache_path: str | None) -> list[list[int]]:
    """The target's continuations (cached on disk under a key of everything they depend on)."""
    key = hashlib.sha256(json.dumps([prompts, temperature, max_new_tokens, seed, llm.config.model.model,
                                     llm.config.model.dtype]).encode()).hexdigest()[:16]
    if cache_path is not None and os.path.isfile(cache_path):
        with open(cache_path, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("key") == key:
            return cached["continuations"]
    params = [SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed + i)
              for i in range(len(prompts))]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    result = [list(o.token_ids) for o in outputs]
    if cache_path is not None:
        os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
        with open(cache_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"key": key, "continuations": result}, f)
        os.replace(cache_path + ".tmp", cache_path)
    return result


def evaluate_acceptance(
    draft: TrainableLlama,
    teacher: TrainableLlama | None,
    prompts: list[tuple[str, list[int]]],
    greedy_continuations: list[list[int]] | None,
    sampled_continuations: list[list[int]] | None,
    *,
    max_k: int = 8,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict[str, Any]:
    """{"greedy": {kind: {k: summary}}, "t1_sampled_draft": ..., "t1_greedy_draft": ...,
    "greedy_target_agreement": share of greedy continuation tokens that are the teacher's argmax}.
    kinds include "all"."""
    device = torch.device(device)
    report: dict[str, Any] = {}
    modes: list[tuple[str, list[list[int]] | None]] = [("greedy", greedy_continuations), ("t1", sampled_continuations)]
    self_agree = [0, 0]
    for mode, conts in modes:
        if conts is None:
            continue
        if len(conts) != len(prompts):
            raise ValueError(f"{len(conts)} continuations for {len(prompts)} prompts")
        if mode == "t1" and teacher is None:
            raise ValueError("temperature-1 acceptance needs the target (teacher) model")
        per_kind: dict[str, dict[int, AcceptanceCounts]] = {}
        per_kind_beta: dict[str, dict[int, AcceptanceCounts]] = {}
        for (kind, prompt), continuation in tqdm(list(zip(prompts, conts)), desc=f"eval {mode}", disable=not progress):
            if not continuation:
                continue
            scores = position_scores(draft, teacher, prompt, continuation, device)
            for k in range(1, max_k + 1):
                for name in (kind, "all"):
                    if mode == "greedy":
                        per_kind.setdefault(name, {}).setdefault(k, AcceptanceCounts()).merge(
                            greedy_steps(scores["match"], k))  # type: ignore[arg-type]
                    else:
                        per_kind.setdefault(name, {}).setdefault(k, AcceptanceCounts()).merge(
                            sampled_steps(scores["alpha"], k))  # type: ignore[arg-type]
                        per_kind_beta.setdefault(name, {}).setdefault(k, AcceptanceCounts()).merge(
                            sampled_steps(scores["beta"], k))  # type: ignore[arg-type]
            if mode == "greedy" and "target_match" in scores:
                self_agree[0] += sum(scores["target_match"])  # type: ignore[arg-type]
                self_agree[1] += len(scores["target_match"])
        name = "greedy" if mode == "greedy" else "t1_sampled_draft"
        report[name] = {kind: {k: c.summary() for k, c in ks.items()} for kind, ks in per_kind.items()}
        if per_kind_beta:
            report["t1_greedy_draft"] = {kind: {k: c.summary() for k, c in ks.items()}
                                         for kind, ks in per_kind_beta.items()}
    if self_agree[1]:
        report["greedy_target_agreement"] = self_agree[0] / self_agree[1]
    return report


def format_report(report: dict[str, Any], ks: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    """A plain-text table: rows mode/kind, columns acceptance rate and mean accepted length per k."""
    lines = []
    header = f"{'mode':<17} {'kind':<5} " + " ".join(f"{'k=' + str(k) + ' rate/len':>16}" for k in ks)
    lines.append(header)
    for mode in ("greedy", "t1_sampled_draft", "t1_greedy_draft"):
        for kind, per_k in report.get(mode, {}).items():
            cells = []
            for k in ks:
                summary = per_k.get(k) or per_k.get(str(k))
                cells.append(f"{summary['acceptance_rate']:.3f}/{summary['mean_accepted_length']:.2f}".rjust(16)
                             if summary else " " * 16)
            lines.append(f"{mode:<17} {kind:<5} " + " ".join(cells))
    return "\n".join(lines)


def evaluate_eagle_acceptance(
    proposer: Any,  # engine.spec_decode.eagle.EagleProposer over the head
    teacher: TrainableLlama,
    prompts: list[tuple[str, list[int]]],
    greedy_continuations: list[list[int]],
    *,
    max_k: int = 8,
    progress: bool = True,
) -> dict[str, Any]:
    """{"greedy": {kind: {k: summary}}} for an EAGLE head, replayed exactly (eagle_rollout_matches).
    Temperature-1 figures are not computed for a head: its later drafts depend on the drafted
    tokens, which a teacher-forced pass over a sampled continuation does not follow."""
    if len(greedy_continuations) != len(prompts):
        raise ValueError(f"{len(greedy_continuations)} continuations for {len(prompts)} prompts")
    per_kind: dict[str, dict[int, AcceptanceCounts]] = {}
    device = proposer.device
    for (kind, prompt), continuation in tqdm(list(zip(prompts, greedy_continuations)), desc="eval eagle",
                                             disable=not progress):
        if not continuation:
            continue
        sequence = torch.tensor([prompt + continuation], dtype=torch.int64, device=device)
        with torch.no_grad():
            states = teacher(sequence)[0]  # [length, hidden]
        matches = eagle_rollout_matches(proposer, states, prompt, continuation, max_k)
        for k in range(1, max_k + 1):
            counts = replay_greedy(lambda t, j: j < len(matches[t]) and matches[t][j], len(continuation), k)
            for name in (kind, "all"):
                per_kind.setdefault(name, {}).setdefault(k, AcceptanceCounts()).merge(counts)
    return {"greedy": {kind: {k: c.summary() for k, c in ks.items()} for kind, ks in per_kind.items()}}
