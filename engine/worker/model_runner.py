"""The model runner: the only place that owns a device and tensors.

`execute_model(SchedulerOutput)` runs one flattened varlen forward over every scheduled token of
every request (prefill chunks, decodes and later speculative verification alike), samples for
the requests whose context is complete, and returns torch-free results.
"""

from __future__ import annotations

import logging

import torch

from engine.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig
from engine.core.model_runner_output import ModelRunnerOutput
from engine.core.scheduler_output import SchedulerOutput
from engine.model.attention_metadata import AttentionMetadata
from engine.model.loader import load_model
from engine.model.resolve import ResolvedModel
from engine.sample.sampler import Sampler
from engine.sample.sampling_metadata import SamplingMetadata
from engine.worker.input_batch import CachedRequestState, build_step_inputs
from engine.worker.kv_cache import (
    KVCacheSpec,
    allocate_kv_caches,
    cuda_budget_bytes,
    default_cpu_budget_bytes,
    num_blocks_for_budget,
)

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device_config: DeviceConfig) -> torch.device:
    if device_config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device_config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device_config.device!r} was asked for but CUDA is not available")
    return device


def resolve_dtype(model_config: ModelConfig, device: torch.device) -> torch.dtype:
    if model_config.dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        # With AMX tiles (Sapphire Rapids and later), oneDNN's bf16 matmuls run 3-6x faster than
        # fp32 at batch sizes 8-512; without native bf16, fp32 is the faster choice.
        return torch.bfloat16 if cpu_has_amx_bf16() else torch.float32
    return _DTYPES[model_config.dtype]


def cpu_has_amx_bf16() -> bool:
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


class ModelRunner:
    def __init__(
        self,
        resolved: ResolvedModel,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        device_config: DeviceConfig,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.device = resolve_device(device_config)
        self.dtype = resolve_dtype(model_config, self.device)
        if device_config.num_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(device_config.num_threads)
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.block_size = cache_config.block_size
        self.eos_token_ids = eos_token_ids
        self.seed = model_config.seed

        self.model, self.arch = load_model(resolved, dtype=self.dtype, device=self.device)
        self.model.eval()
        self.vocab_size = self.arch.vocab_size
        self.kv_spec = KVCacheSpec(
            num_layers=self.arch.num_hidden_layers,
            num_kv_heads=self.arch.num_key_value_heads,
            head_dim=self.arch.head_dim,
            block_size=self.block_size,
            dtype=self.dtype,
        )
        self.sampler = Sampler()
        self.kv_caches: list[torch.Tensor] = []
        self.requests: dict[str, CachedRequestState] = {}
        # Unseeded requests sample from torch's default generator; seeding it from the engine
        # seed makes a whole run repeatable.
        torch.manual_seed(model_config.seed)

    # ---- KV cache ----------------------------------------------------------------------------
    def determine_num_blocks(self) -> int:
        if self.cache_config.num_blocks_override is not None:
            return self.cache_config.num_blocks_override
        if self.cache_config.kv_cache_memory_bytes is not None:
            return num_blocks_for_budget(self.kv_spec, self.cache_config.kv_cache_memory_bytes)
        if self.device.type == "cuda":
            peak = self._profile_activation_peak()
            budget = cuda_budget_bytes(self.device, self.cache_config.gpu_memory_utilization, peak)
            return num_blocks_for_budget(self.kv_spec, budget)
        return num_blocks_for_budget(self.kv_spec, default_cpu_budget_bytes())

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
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, self.device)
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB)", num_blocks, self.block_size,
                    num_blocks * self.kv_spec.bytes_per_block / 2**20)

    # ---- one step ----------------------------------------------------------------------------
    def _update_states(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                generator=generator,
            )
        for cached in out.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
        for req_id, drafts in out.scheduled_spec_decode_tokens.items():
            self.requests[req_id].spec_token_ids = list(drafts)

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(out)
        req_ids = [r.req_id for r in out.scheduled_new_reqs] + [r.req_id for r in out.scheduled_cached_reqs]
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[], logprobs=None)
        step = build_step_inputs(self.requests, req_ids, out.num_scheduled_tokens, self.block_size)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(step.slot_mapping).to(device, non_blocking=True),
            block_table=torch.from_numpy(step.block_table).to(device, non_blocking=True),
            query_start_loc=torch.tensor(step.query_start_loc, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(step.seq_lens, dtype=torch.int32, device=device),
            query_start_loc_cpu=step.query_start_loc,
            seq_lens_cpu=step.seq_lens,
            max_query_len=max(b - a for a, b in zip(step.query_start_loc, step.query_start_loc[1:])),
            max_seq_len=max(step.seq_lens),
        )
        input_ids = torch.from_numpy(step.input_ids).to(device, non_blocking=True)
        positions = torch.from_numpy(step.positions).to(device, non_blocking=True)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [num_tokens, hidden]

        sampled_token_ids: list[list[int]] = [[] for _ in req_ids]
        logprobs: list | None = None
        if step.sample_rows:
            indices = torch.from_numpy(step.logits_indices).to(device)
            logits = self.model.compute_logits(hidden.index_select(0, indices))  # [num_sample_rows, vocab]
            sample_states = [self.requests[req_ids[row]] for row in step.sample_rows]
            sampling_meta = SamplingMetadata.build(
                params=[s.sampling_params for s in sample_states],
                prompt_token_ids=[s.prompt_token_ids for s in sample_states],
                output_token_ids=[s.output_token_ids for s in sample_states],
                generators={i: s.generator for i, s in enumerate(sample_states) if s.generator is not None},
                eos_token_ids=self.eos_token_ids,
                vocab_size=self.vocab_size,
                device=device,
            )
            sampler_out = self.sampler(logits, sampling_meta)
            tokens = sampler_out.sampled_token_ids.tolist()
            row_logprobs = sampler_out.logprobs.tolists() if sampler_out.logprobs is not None else None
            if row_logprobs is not None:
                logprobs = [None] * len(req_ids)
            for i, (row, state) in enumerate(zip(step.sample_rows, sample_states)):
                state.output_token_ids.append(tokens[i])
                state.spec_token_ids = []
                sampled_token_ids[row] = [tokens[i]]
                if row_logprobs is not None and row_logprobs[i] is not None:
                    logprobs[row] = [row_logprobs[i]]
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids, logprobs=logprobs)
