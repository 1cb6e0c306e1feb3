"""The model runner: the only place that owns a device and tensors.

`execute_model(SchedulerOutput)` runs one flattened varlen forward over every scheduled token of
every request (prefill chunks, decodes and later speculative verification alike), samples for
the requests whose context is complete, and returns torch-free results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch

from engine.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from engine.core.model_runner_output import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from engine.model.attention_metadata import AttentionMetadata
from engine.model.loader import load_model
from engine.model.resolve import ResolvedModel
from engine.sample.rejection_sampler import RejectionSampler, VerifyRequest
from engine.sample.sampler import Sampler
from engine.sample.sampling_metadata import SamplingMetadata
from engine.spec_decode.controller import SpeculationController
from engine.spec_decode.corpus import SuffixCorpus
from engine.spec_decode.cost_model import attention_work
from engine.spec_decode.draft_model import DraftModelProposer, load_draft_model
from engine.spec_decode.eagle import EagleProposer
from engine.spec_decode.proposer import ProposalRequest
from engine.spec_decode.suffix import SuffixProposer
from engine.worker.alternatives import MAX_PAIRS, SCRATCH_BLOCKS, PairedInputs, copy_blocks, copy_slots, pair_inputs
from engine.worker.huge_pages import collapse_into_huge_pages, module_tensors
from engine.worker.input_batch import CachedRequestState, build_step_inputs
from engine.worker.kv_cache import (
    KVCacheSpec,
    allocate_kv_caches,
    cuda_budget_bytes,
    default_cpu_budget_bytes,
    kv_cache_torch_dtype,
    num_blocks_for_budget,
)
from engine.worker.step_sweep import STEP_SWEEP_ROWS, sweep_step_seconds
from kernels.onednn_linear import onednn_bf16_available
from kernels.small_rows_linear import held_weights_enabled

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device_config: DeviceConfig) -> torch.device:
    if device_config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device_config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device_config.device!r} was asked for but CUDA is not available")
    return device


def auto_dtype(device: torch.device) -> torch.dtype:
    """What dtype "auto" takes on this device: the faster of bf16 and fp32."""
    if device.type == "cuda":
        return torch.bfloat16
    # With native bf16 (AMX tiles, or AVX512-BF16 dot products) oneDNN's prepacked bf16
    # matmuls beat fp32: AMX 3-6x at batch sizes 8-512; AVX512-BF16 without AMX (an AMD EPYC,
    # 2 threads, the embedded model) 2.5x single-stream decode and 3.2-3.7x at 8 streams.
    # Without either, fp32 is the faster choice.
    return torch.bfloat16 if onednn_bf16_available() else torch.float32


def resolve_dtype(model_config: ModelConfig, device: torch.device) -> torch.dtype:
    if model_config.dtype == "auto":
        return auto_dtype(device)
    return _DTYPES[model_config.dtype]


def resolve_draft_dtype(config: SpeculativeConfig, target_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The draft's dtype. "auto": on a CPU where the compiled few-row kernel takes held weights
    (held_weights_enabled: AVX2 or wider), float32 over int8-held weights (draft_weight_format),
    whatever the target's dtype: a draft position is a pass over one to a few rows, and there
    the compiled kernel and the one-call head beat oneDNN's bf16 products, whose fixed costs
    bound them (docs/speculative.md, "The draft's execution on AVX512 CPUs"); the draft reads
    the target's states and embedding in float32. Elsewhere the target's, except under a float32
    target on a machine where bf16 is the faster dtype: bf16 halves the bytes a pass reads. Its
    precision only moves acceptance (the target verifies every token)."""
    if config.draft_dtype != "auto":
        return _DTYPES[config.draft_dtype]
    if device.type == "cpu" and held_weights_enabled():
        return torch.float32
    return auto_dtype(device) if target_dtype == torch.float32 else target_dtype


def draft_weight_format(config: SpeculativeConfig, draft_dtype: torch.dtype, device: torch.device) -> str | None:
    """How a float32 draft holds its weights: "bf16" or "int8" (computing in float32 over them),
    or None (its dtype's own). Only where the compiled few-row kernel takes them (AVX2 CPUs and
    wider: held_weights_enabled), which widens bf16 and int8 weights as it reads them: a draft
    position is bound by reading the draft's weights, so bf16 reads half the bytes and int8 a
    quarter.
    - bf16: the shipped drafts' layers are stored in bf16 (drafts/), so their products are
      unchanged; the reduced output head, rows of the target's float32 head, is rounded to bf16.
    - int8 (one float32 scale per row, "auto" under draft_dtype "auto"): rounds every weight to
      127 steps of its row's largest magnitude.
    Either can move acceptance a little, never the output. draft_weights="dtype", or an explicit
    draft_dtype with draft_weights "auto", keeps it all in the dtype."""
    choice = config.draft_weights
    if choice == "auto":
        choice = "int8" if config.draft_dtype == "auto" else "dtype"
    if choice == "dtype":
        return None
    if not (draft_dtype == torch.float32 and device.type == "cpu" and held_weights_enabled()):
        if config.draft_weights != "auto":
            raise ValueError(f"draft_weights {choice!r} needs a float32 draft on a CPU whose few-row products take "
                             f"the compiled kernel (AVX2 or wider); this draft is {draft_dtype} on {device.type}")
        return None
    return choice


class ModelRunner:
    def __init__(
        self,
        resolved: ResolvedModel,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        device_config: DeviceConfig,
        eos_token_ids: frozenset[int],
        speculative_config: SpeculativeConfig | None = None,
        draft_path: str | None = None,
        suffix_corpus_path: str | None = None,
    ) -> None:
        """draft_path: the resolved draft model for speculative_config methods that use one;
        suffix_corpus_path: the resolved suffix corpus (loaded once, for every suffix proposer)."""
        self.device = resolve_device(device_config)
        self.dtype = resolve_dtype(model_config, self.device)
        if device_config.num_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(device_config.num_threads)
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.block_size = cache_config.block_size
        self.eos_token_ids = eos_token_ids
        self.seed = model_config.seed

        self.model, self.arch = load_model(resolved, dtype=self.dtype, device=self.device,
                                           quantization=model_config.quantization, inference_only=True)
        self.model.eval()
        self.vocab_size = self.arch.vocab_size
        self.kv_spec = KVCacheSpec(
            num_layers=self.arch.num_hidden_layers,
            num_kv_heads=self.arch.num_key_value_heads,
            head_dim=self.arch.head_dim,
            block_size=self.block_size,
            dtype=self.dtype,
            cache_dtype=kv_cache_torch_dtype(cache_config.kv_cache_dtype),
        )
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.kv_caches: list[torch.Tensor] = []
        self.requests: dict[str, CachedRequestState] = {}

        self.speculative_config = speculative_config or SpeculativeConfig()
        self._suffix_corpus_path = suffix_corpus_path
        self._suffix_corpus: SuffixCorpus | None = None  # loaded by the first suffix proposer
        self._draft_model_name = self.speculative_config.draft_model
        self.draft = None
        self.draft_dtype = self.dtype
        self._draft_kv_bytes_per_block = 0
        if self.speculative_config.uses_draft_model:
            if draft_path is None:
                raise ValueError(f"speculative {self.speculative_config.method!r} needs a draft model")
            self.draft_dtype = resolve_draft_dtype(self.speculative_config, self.dtype, self.device)
            self.draft = load_draft_model(
                draft_path, self.model, self.arch, self.draft_dtype, self.device,
                held=draft_weight_format(self.speculative_config, self.draft_dtype, self.device))
            # An EAGLE head (it has fc) drafts from the target's states; any other draft is a model.
            self._draft_proposer_class = EagleProposer if self.draft.fc_weight is not None else DraftModelProposer
            self._draft_kv_bytes_per_block = self._draft_proposer_class.kv_bytes_per_block(
                self.draft, self.block_size, self.draft_dtype)
        # Weights in 2 MiB pages (in place: nothing moves), and the KV caches allocated so.
        self.huge_pages = device_config.huge_pages and self.device.type == "cpu"
        self.huge_page_weight_bytes = 0
        if self.huge_pages:
            started = time.perf_counter()
            draft_tensors = [] if self.draft is None else [
                *module_tensors(self.draft.model),
                *(t for t in (self.draft.head_weight, self.draft.fc_weight) if t is not None)]
            self.huge_page_weight_bytes = collapse_into_huge_pages(module_tensors(self.model) + draft_tensors)
            logger.info("weights: %.0f MiB in 2 MiB pages (%.2f s)", self.huge_page_weight_bytes / 2**20,
                        time.perf_counter() - started)
        self.spec: SpeculationController | None = None  # built with the KV cache
        self._swept_steps: dict[int, float] | None = None  # _step_sweep()
        self.step_seconds = 0.0
        self.num_accepted_alternatives = 0  # runners-up the target took (each with its bonus token)
        self._first_scratch_block: int | None = None  # set with the KV cache
        # Unseeded requests sample from torch's default generator; seeding it from the engine
        # seed makes a whole run repeatable.
        torch.manual_seed(model_config.seed)

    # ---- KV cache ----------------------------------------------------------------------------
    @property
    def draft_held_weights(self) -> str | None:
        """"bf16" or "int8" where the draft computes in float32 over weights held so
        (draft_weight_format, as load_draft_model applied it: not for GGUF drafts, loaded as they
        are), else None."""
        return None if self.draft is None else self.draft.held

    def determine_num_blocks(self) -> int:
        if self.cache_config.num_blocks_override is not None:
            return self.cache_config.num_blocks_override
        if self.cache_config.kv_cache_memory_bytes is not None:
            budget = self.cache_config.kv_cache_memory_bytes
        elif self.device.type == "cuda":
            peak = self._profile_activation_peak()
            budget = cuda_budget_bytes(self.device, self.cache_config.gpu_memory_utilization, peak)
        else:
            budget = default_cpu_budget_bytes()
        # A draft model's KV pool is indexed by the same block ids: each block costs both.
        return num_blocks_for_budget(self.kv_spec, budget, extra_bytes_per_block=self._draft_kv_bytes_per_block)

    @torch.inference_mode()
    def _profile_activation_peak(self) -> int:
        """Peak bytes of a forward over a full token budget, measured with a throwaway cache."""
        num_tokens = self.scheduler_config.max_num_batched_tokens
        num_blocks = (num_tokens + self.block_size - 1) // self.block_size
        caches = allocate_kv_caches(self.kv_spec, num_blocks, self.device)
        meta = AttentionMetadata.build(
            query_lens=[num_tokens], seq_lens=[num_tokens], block_ids=[list(range(num_blocks))],
            block_size=self.block_size, device=self.device,
        )
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        hidden = self.model(ids, torch.arange(num_tokens, device=self.device), caches, meta)
        self.model.compute_logits(hidden[-self.scheduler_config.max_num_seqs :])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del caches, hidden
        torch.cuda.empty_cache()
        return peak

    def initialize_kv_cache(self, num_blocks: int) -> None:
        config = self.speculative_config
        # Runners-up of an EAGLE head's first draft are verified in scratch blocks past the
        # scheduler's pool (engine/worker/alternatives.py; not with fp8 KV, whose scales would
        # need the same copies).
        self._first_scratch_block = None
        if config.enabled and self.draft is not None and self._draft_proposer_class is EagleProposer \
                and not self.kv_spec.is_fp8:
            self._first_scratch_block = num_blocks
        self.kv_caches = allocate_kv_caches(
            self.kv_spec, num_blocks + (SCRATCH_BLOCKS if self._first_scratch_block is not None else 0), self.device,
            huge_pages=self.huge_pages)
        self.num_blocks = num_blocks
        self._build_speculation()
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB)", num_blocks, self.block_size,
                    num_blocks * self.kv_spec.bytes_per_block / 2**20)

    def _build_speculation(self) -> None:
        """A fresh controller and proposers for speculative_config (None without speculation)."""
        config = self.speculative_config
        self.spec = None
        if config.enabled:
            draft_proposer = None
            if config.uses_draft_model:
                draft_proposer = self._draft_proposer_class(self.draft, num_blocks=self.num_blocks,
                                                            block_size=self.block_size, device=self.device,
                                                            dtype=self.draft_dtype)
            suffix = (SuffixProposer(max_drafts=config.num_suffix_tokens, corpus=self._load_suffix_corpus())
                      if config.method in ("suffix", "hybrid") else None)
            self.spec = SpeculationController(config, suffix=suffix, draft=draft_proposer,
                                              step_sweep=self._step_sweep() if config.adaptive else None)

    def _step_sweep(self) -> dict[int, float]:
        """The target step's seconds by row count, swept once (engine/worker/step_sweep.py)."""
        if self._swept_steps is None:
            max_rows = min(STEP_SWEEP_ROWS, self.scheduler_config.max_num_batched_tokens)
            started = time.perf_counter()
            self._swept_steps = sweep_step_seconds(self.model, self.kv_spec, self.device, max_rows)
            logger.info("Swept the step at 1-%d rows in %.2f s", max_rows, time.perf_counter() - started)
        return self._swept_steps

    def _load_suffix_corpus(self) -> SuffixCorpus | None:
        if self._suffix_corpus is None and self._suffix_corpus_path is not None:
            self._suffix_corpus = SuffixCorpus.load(self._suffix_corpus_path)
        return self._suffix_corpus

    def set_speculative_method(self, method: str) -> None:
        """Another speculative method for an idle runner, with fresh proposers (a draft model's
        KV starts over); one that needs a draft model needs the runner to have loaded one."""
        config = replace(self.speculative_config, method=method, draft_model=None)  # checks the name
        if config.uses_draft_model:
            if self.draft is None:
                raise ValueError(f"speculative {method!r} needs a draft model, and this engine was built "
                                 "without one (build it with speculative='draft' or 'hybrid')")
            config = replace(config, draft_model=self._draft_model_name)  # the draft's name, as built
        self.speculative_config = config
        self._build_speculation()

    # ---- one step ----------------------------------------------------------------------------
    def _update_states(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            state = self.requests.pop(req_id, None)
            if self.spec is not None:
                finished = state is not None and req_id in out.finished_req_ids
                self.spec.finish(req_id, state.output_token_ids if finished else None)
        draft = self.spec.draft if self.spec is not None else None
        for new in out.scheduled_new_reqs:
            if draft is not None:
                # Blocks past its prefix hit are fresh: their draft KV belongs to another context.
                draft.forget_blocks(new.block_ids[new.num_computed_tokens // self.block_size:])
            params = new.sampling_params
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
            )
        for cached in out.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            if draft is not None and cached.new_block_ids:  # (most steps add no block: skip the numpy calls)
                draft.forget_blocks(cached.new_block_ids)
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
        for req_id, drafts in out.scheduled_spec_decode_tokens.items():
            self.requests[req_id].spec_token_ids = list(drafts)

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput,
                      token_bitmasks: Mapping[str, np.ndarray] | None = None) -> ModelRunnerOutput:
        """token_bitmasks: constrained decoding, by request: the packed bitmask of the tokens its
        grammar allows ([ceil(vocab_size / 32)] int32; engine/structured_output/matcher.py), or
        for a request verifying k drafts one row per position ([k + 1, words])."""
        started = time.perf_counter()
        self._update_states(out)
        req_ids = [r.req_id for r in out.scheduled_new_reqs] + [r.req_id for r in out.scheduled_cached_reqs]
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[], logprobs=None)
        step = build_step_inputs(self.requests, req_ids, out.num_scheduled_tokens, self.block_size)
        paired = self._pair_inputs(step, token_bitmasks)
        inputs = paired if paired is not None else step
        device = self.device
        starts = inputs.query_start_loc
        query_lens = [end - begin for begin, end in zip(starts, starts[1:])]  # per request (pairs included)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(inputs.slot_mapping).to(device, non_blocking=True),
            block_table=torch.from_numpy(inputs.block_table).to(device, non_blocking=True),
            query_start_loc=torch.tensor(inputs.query_start_loc, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(inputs.seq_lens, dtype=torch.int32, device=device),
            query_start_loc_cpu=inputs.query_start_loc,
            seq_lens_cpu=inputs.seq_lens,
            max_query_len=max(query_lens),
            max_seq_len=max(inputs.seq_lens),
        )
        input_ids = torch.from_numpy(inputs.input_ids).to(device, non_blocking=True)
        positions = torch.from_numpy(inputs.positions).to(device, non_blocking=True)
        if paired is not None:
            copy_blocks(self.kv_caches, paired.copy_from, paired.copy_to)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [num_tokens (+ pair rows), hidden]

        sampled_token_ids: list[list[int]] = [[] for _ in req_ids]
        row_tokens = step.input_ids  # [num_tokens] the token at each row's position (for an EAGLE head)
        logprobs: list | None = None
        spec_token_ids: dict[str, list[int]] | None = None
        if step.sample_rows:
            rows = step.logits_indices
            if paired is not None:  # the runners-up's rows follow the chains' in the same matmul
                rows = np.concatenate([rows, np.asarray([p.leaf_row for p in paired.pairs], dtype=np.int64)])
            logits = self.model.compute_logits(hidden.index_select(0, torch.from_numpy(rows).to(device)))
            num_chain_rows = len(step.logits_indices)  # logits: [num_chain_rows (+ pairs), vocab]
            sample_states = [self.requests[req_ids[row]] for row in step.sample_rows]
            if any(state.spec_token_ids for state in sample_states):
                tokens, row_logprobs = self._verify(logits[:num_chain_rows], sample_states, token_bitmasks)
            else:
                tokens, row_logprobs = self._sample(logits, sample_states, token_bitmasks)
            bonus = {}
            if paired is not None:
                row_tokens = step.input_ids.copy()  # the accepted runners-up's rows change token
                bonus = self._accept_alternatives(paired, logits[num_chain_rows:], sample_states, tokens, hidden,
                                                  row_tokens)
            if row_logprobs is not None:
                logprobs = [None] * len(req_ids)
            for i, (row, state) in enumerate(zip(step.sample_rows, sample_states)):
                if self.spec is not None and state.spec_token_ids:
                    self.spec.record(state.req_id, len(state.spec_token_ids), len(tokens[i]) - 1)
                if i in bonus:  # (after recording: the chain's own first draft was rejected)
                    tokens[i] = tokens[i] + [bonus[i]]
                state.output_token_ids.extend(tokens[i])
                state.spec_token_ids = []
                state.spec_alternatives = []
                sampled_token_ids[row] = tokens[i]
                if row_logprobs is not None and row_logprobs[i] is not None and row_logprobs[i][0] is not None:
                    logprobs[row] = row_logprobs[i]
        if self.spec is not None and isinstance(self.spec.draft, EagleProposer):
            self.spec.draft.observe(hidden, row_tokens, step.slot_mapping)  # (every row's state)
        if step.sample_rows:
            if self.spec is not None:
                # The price list of the next drafts: what this step cost for its tokens (before
                # proposing, which the draft model prices itself).
                # (query_lens, taken once above in Python: np.diff over the list here cost ~70
                # us a step, its Python run with caches the forward had just streamed through.)
                self.spec.observe_step(len(inputs.input_ids), time.perf_counter() - started,
                                       attention_work(query_lens, inputs.seq_lens))
                spec_token_ids = self._propose(sample_states, num_running=len(req_ids))
        self.step_seconds += time.perf_counter() - started
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids, logprobs=logprobs,
                                 spec_token_ids=spec_token_ids)

    def _pair_inputs(self, step, token_bitmasks: Mapping[str, np.ndarray] | None) -> PairedInputs | None:
        """The step's inputs with its runners-up's pairs, or None (engine/worker/alternatives.py).
        Not for constrained requests (a pair's bonus would need the grammar's state after a_j),
        and never past the step's token budget."""
        if self._first_scratch_block is None:
            return None
        alternatives = {row_req: self.requests[row_req].spec_alternatives for row_req in step.req_ids
                        if self.requests[row_req].spec_alternatives
                        and not (token_bitmasks and row_req in token_bitmasks)}
        if not alternatives:
            return None
        room = (self.scheduler_config.max_num_batched_tokens - len(step.input_ids)) // 2
        return pair_inputs(step, self.requests, alternatives, self.block_size, self._first_scratch_block,
                           min(MAX_PAIRS, room))

    def _accept_alternatives(self, paired: PairedInputs, pair_logits: torch.Tensor,
                             states: list[CachedRequestState], tokens: list[list[int]],
                             hidden: torch.Tensor, row_tokens: np.ndarray) -> dict[int, int]:
        """After verification: for each request whose target token at P + 1 is one of its
        runners-up, the bonus token after it (by sampling index), sampled from the runner-up's row
        as plain decoding would; its KV moves into the request's slot and its state into c1's row
        (for an EAGLE head), with its token in row_tokens ([num_tokens], the step's input ids).
        pair_logits: [len(pairs), vocab]."""
        accepted: list[tuple[int, int]] = []  # (pair index, sampling index)
        verified: dict[int, list[int]] = {}
        for index, pair in enumerate(paired.pairs):
            verified.setdefault(pair.sample_index, []).append(pair.token)
            emitted = tokens[pair.sample_index]
            if len(emitted) == 1 and emitted[0] == pair.token:
                accepted.append((index, pair.sample_index))
        if self.spec is not None:
            for sample_index, runners_up in verified.items():
                self.spec.record_alternatives(runners_up, tokens[sample_index][0])
        if not accepted:
            return {}
        chosen = [paired.pairs[index] for index, _ in accepted]
        sampled_states = [states[i] for _, i in accepted]
        meta = self._sampling_metadata(sampled_states, [s.output_token_ids + [p.token] for s, p in zip(sampled_states, chosen)])
        rows = torch.tensor([index for index, _ in accepted], dtype=torch.int64, device=pair_logits.device)
        bonus = self.sampler(pair_logits.index_select(0, rows), meta).sampled_token_ids.tolist()
        copy_slots(self.kv_caches, [p.leaf_slot for p in chosen], [p.target_slot for p in chosen], self.block_size)
        for pair in chosen:
            hidden[pair.x0_row + 1] = hidden[pair.leaf_row]
            row_tokens[pair.x0_row + 1] = pair.token
        self.num_accepted_alternatives += len(accepted)
        return {i: token for (_, i), token in zip(accepted, bonus)}

    def _sampling_metadata(self, states: list[CachedRequestState], outputs: list[list[int]],
                           bitmask_rows: list[np.ndarray | None] | None = None) -> SamplingMetadata:
        return SamplingMetadata.build(
            params=[s.sampling_params for s in states],
            prompt_token_ids=[s.prompt_token_ids for s in states],
            output_token_ids=outputs,
            eos_token_ids=self.eos_token_ids,
            vocab_size=self.vocab_size,
            device=self.device,
            token_bitmasks=bitmask_rows,
        )

    def _sample(self, logits: torch.Tensor, states: list[CachedRequestState],
                token_bitmasks: Mapping[str, np.ndarray] | None = None):
        """One token per request (no drafts in this step)."""
        rows = [token_bitmasks.get(s.req_id) for s in states] if token_bitmasks else None
        meta = self._sampling_metadata(states, [s.output_token_ids for s in states], rows)
        out = self.sampler(logits, meta)
        tokens = [[t] for t in out.sampled_token_ids.tolist()]
        if out.logprobs is None:
            return tokens, None
        return tokens, [[entry] for entry in out.logprobs.tolists()]

    def _verify(self, logits: torch.Tensor, states: list[CachedRequestState],
                token_bitmasks: Mapping[str, np.ndarray] | None = None):
        """Requests with drafts get 1 + k logits rows; each row is processed as if the drafts
        before it had been generated (penalties, min_tokens)."""
        row_states: list[CachedRequestState] = []
        row_outputs: list[list[int]] = []
        requests: list[VerifyRequest] = []
        for state in states:
            drafts = state.spec_token_ids
            requests.append(VerifyRequest(first_row=len(row_states), draft_token_ids=list(drafts),
                                          greedy=state.sampling_params.greedy))
            for j in range(len(drafts) + 1):
                row_states.append(state)
                row_outputs.append(state.output_token_ids + drafts[:j] if j else state.output_token_ids)
        # Constrained requests: one mask row per verification row ([k + 1, words], row j the
        # grammar's state after the first j drafts), or one row when they have no drafts.
        rows = None
        if token_bitmasks:
            rows = []
            for state in states:
                mask = token_bitmasks.get(state.req_id)
                for j in range(len(state.spec_token_ids) + 1):
                    rows.append(None if mask is None else (mask[j] if mask.ndim == 2 else mask))
        meta = self._sampling_metadata(row_states, row_outputs, rows)
        return self.rejection_sampler(logits, meta, requests)

    def _propose(self, states: list[CachedRequestState], num_running: int) -> dict[str, list[int]]:
        assert self.spec is not None
        requests = []
        for state in states:
            params = state.sampling_params
            # Drafts past max_tokens or the context would be computed and thrown away.
            room = self.spec.max_drafts
            if params.max_tokens is not None:
                room = min(room, params.max_tokens - len(state.output_token_ids) - 1)
            if room <= 0:
                continue
            # Runners-up need exactness of the emitted token alone (no logprobs to report for
            # the bonus's row); a constrained request's are dropped when its step is built.
            max_alternatives = MAX_PAIRS if self._first_scratch_block is not None and params.logprobs is None else 0
            requests.append(ProposalRequest(state.req_id, state.prompt_token_ids, state.output_token_ids,
                                            num_drafts=room, block_ids=state.block_ids,
                                            max_alternatives=max_alternatives))
        proposals = self.spec.propose(requests, batch_size=num_running)
        caps = {r.req_id: r.num_drafts for r in requests}
        for req_id, proposal in proposals.items():
            if proposal.token_ids and caps[req_id] > 0:
                self.requests[req_id].spec_alternatives = list(proposal.alternatives)
        return {req_id: p.token_ids[: caps[req_id]] for req_id, p in proposals.items() if p.token_ids}
