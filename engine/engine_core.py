"""The engine core: schedule -> run -> update, one step at a time.

Owns the scheduler (torch-free), the model runner (device and tensors) and one incremental
detokenizer per request, which applies stop strings as tokens arrive so that a request stops at
the step its stop string appears. Used directly by the offline LLM and, inside the engine
process, by engine/engine_process.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from engine.config import EngineConfig, SpeculativeConfig
from engine.core.block_hash import make_block_hasher
from engine.core.scheduler import RequestRejectedError, Scheduler
from engine.core.session_retention import SessionTurns
from engine.detokenizer import IncrementalDetokenizer
from engine.model.resolve import resolve_model
from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.protocol import AddRequest, EngineReady, EngineStats, RequestDelta, TokenLogprobs
from engine.request import Request, RequestStatus
from engine.spec_decode.corpus import resolve_suffix_corpus_path
from engine.spec_decode.draft_model import resolve_draft_path
from engine.structured_output.matcher import StructuredOutputManager
from engine.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        resolved = resolve_model(config.model.model)
        self.model_name = resolved.name
        self.tokenizer: Tokenizer = load_tokenizer(resolved)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        draft_path = resolve_draft_path(config.speculative, resolved) if config.speculative.uses_draft_model else None
        self.runner = ModelRunner(resolved, config.model, config.cache, config.scheduler, config.device,
                                  self.eos_token_ids, config.speculative, draft_path,
                                  resolve_suffix_corpus_path(config.speculative, resolved))
        self.vocab_size = self.runner.vocab_size
        num_blocks = self.runner.determine_num_blocks()
        block_size = config.cache.block_size
        model_len = config.model.max_model_len or self.runner.arch.max_position_embeddings
        # A request must always fit the whole pool by itself, or preemption could never make room.
        pool_tokens = num_blocks * block_size
        if model_len > pool_tokens:
            logger.warning("max_model_len %d exceeds the KV pool (%d tokens); capping it", model_len, pool_tokens)
        self.max_model_len = min(model_len, pool_tokens)
        self.runner.initialize_kv_cache(num_blocks)
        self.num_blocks = num_blocks
        # Cache keys are seeded per model, so two models never share prefix-cache entries.
        self.block_hash_seed = f"{resolved.path}|{self.runner.dtype}"
        self._block_hasher = make_block_hasher(block_size, seed=self.block_hash_seed)
        self.scheduler = Scheduler(
            config.scheduler, config.cache, num_blocks=num_blocks, max_model_len=self.max_model_len,
            num_lookahead_tokens=_lookahead_tokens(config.speculative),
        )
        # Agent turns to retain when they end in a tool call, and grammar-constrained requests.
        self.session_turns = SessionTurns(self.scheduler.kv_cache_manager.retention, block_size)
        self.structured_output = StructuredOutputManager(self.tokenizer, self.vocab_size)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._started: set[str] = set()  # requests that have produced their first token
        self._num_steps = 0
        self._step_seconds_total = 0.0
        self._last_step_seconds = 0.0
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0

    # ---- description -------------------------------------------------------------------------
    def ready_message(self) -> EngineReady:
        return EngineReady(
            model_name=self.model_name,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            block_size=self.config.cache.block_size,
            num_blocks=self.num_blocks,
            device=str(self.runner.device),
            dtype=str(self.runner.dtype).removeprefix("torch."),
            block_hash_seed=self.block_hash_seed,
        )

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, add: AddRequest) -> RequestDelta | None:
        """Queues a request; returns an error delta instead when it can never run."""
        try:
            add.sampling_params.validate_vocab(self.vocab_size)
            request = Request(
                add.request_id,
                add.prompt_token_ids,
                add.sampling_params,
                eos_token_ids=self.eos_token_ids,
                arrival_time=add.arrival_time,
                priority=add.priority,
                cache_salt=add.cache_salt,
                block_hasher=self._block_hasher,
            )
            for token_id in add.prompt_token_ids:
                if not 0 <= token_id < self.vocab_size:
                    raise ValueError(f"prompt token id {token_id} is outside the vocabulary ({self.vocab_size})")
            if add.structured_output is not None:
                self.structured_output.add_request(add.request_id, add.structured_output.grammar)
            self.scheduler.add_request(request, session_id=add.session_id)
        except (RequestRejectedError, ValueError) as error:
            self.structured_output.remove(add.request_id)
            return RequestDelta(add.request_id, finish_reason="error", error=str(error),
                                num_prompt_tokens=len(add.prompt_token_ids))
        if add.retention is not None and add.session_id is not None:
            spec = add.retention
            self.session_turns.add(request, add.session_id, spec.ttl_seconds, spec.max_retained_fraction,
                                   spec.require_text)
        params = add.sampling_params
        self._detokenizers[add.request_id] = IncrementalDetokenizer(
            self.tokenizer,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        return None

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        for request_id in request_ids:
            self._detokenizers.pop(request_id, None)
            self._started.discard(request_id)
            self.session_turns.drop(request_id)
            self.structured_output.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        if not self.scheduler.has_unfinished_requests():
            return []
        started = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        # Even a step that schedules nothing goes to the runner: it carries the finished and
        # preempted ids whose state the runner must drop.
        bitmasks = (self.structured_output.bitmasks_for_step(scheduler_output.num_scheduled_tokens,
                                                             self.scheduler.requests,
                                                             scheduler_output.scheduled_spec_decode_tokens)
                    if self.structured_output.num_requests else None)
        runner_output = self.runner.execute_model(scheduler_output, token_bitmasks=bitmasks or None)
        results = self.scheduler.update_from_output(scheduler_output, runner_output)
        # The deltas advance each grammar over this step's tokens; drafts for the next step are
        # checked against the state that follows them.
        deltas = [self._make_delta(result) for result in results]
        spec_token_ids = runner_output.spec_token_ids
        if spec_token_ids and self.structured_output.num_requests:
            # A constrained request keeps the drafts its grammar accepts; verification masks
            # each of their rows with the grammar's state at that position (bitmasks_for_step).
            for request_id in [r for r in spec_token_ids if self.structured_output.has_request(r)]:
                valid = self.structured_output.validate_drafts(request_id, spec_token_ids[request_id])
                if valid:
                    spec_token_ids[request_id] = valid
                else:
                    del spec_token_ids[request_id]
        if spec_token_ids:
            self.scheduler.set_spec_token_ids(spec_token_ids)
        elapsed = time.perf_counter() - started
        self._num_steps += 1
        self._step_seconds_total += elapsed
        self._last_step_seconds = elapsed
        return deltas

    def _make_delta(self, result) -> RequestDelta:
        detokenizer = self._detokenizers[result.request_id]
        if result.request_id not in self._started:
            # Counted once per request, like vLLM's prompt_tokens_total (cached ones included).
            self._started.add(result.request_id)
            self._num_prompt_tokens += result.num_prompt_tokens
        self._num_generation_tokens += len(result.new_token_ids)
        text = detokenizer.update(result.new_token_ids)
        self.structured_output.accept_tokens(result.request_id, result.new_token_ids)
        finish_reason, stop_reason = result.finish_reason, result.stop_reason
        if detokenizer.stop_string is not None:
            if finish_reason is None:
                self.scheduler.finish_requests([result.request_id], RequestStatus.FINISHED_STOPPED,
                                               stop_reason=detokenizer.stop_string)
            finish_reason, stop_reason = "stop", detokenizer.stop_string
        if finish_reason is not None:
            text += detokenizer.flush()
            del self._detokenizers[result.request_id]
            self.session_turns.on_text(result.request_id, text)
            self.session_turns.on_finish(result.request_id, finish_reason)
            self.structured_output.remove(result.request_id)
        else:
            self.session_turns.on_text(result.request_id, text)
            self._started.discard(result.request_id)
        logprobs = None
        if result.new_logprobs:
            logprobs = [TokenLogprobs(token_id, logprob, top) for token_id, logprob, top in result.new_logprobs]
        return RequestDelta(
            request_id=result.request_id,
            new_token_ids=result.new_token_ids,
            text=text,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=result.num_prompt_tokens,
            num_cached_tokens=max(result.num_cached_tokens, 0),
            logprobs=logprobs,
        )

    # ---- stats and maintenance ---------------------------------------------------------------
    def stats(self) -> EngineStats:
        retention = self.scheduler.kv_cache_manager.retention
        retention.expire()  # an idle engine steps no more: its TTLs pass here, when stats are read
        s = self.scheduler.make_stats()
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_cache_usage=s.kv_cache_usage,
            num_blocks=self.num_blocks,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            num_steps=self._num_steps,
            num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            last_step_seconds=self._last_step_seconds,
            mean_step_seconds=self._step_seconds_total / max(self._num_steps, 1),
            spec_num_drafts=s.spec_num_drafts,
            spec_num_draft_tokens=s.spec_num_draft_tokens,
            spec_num_accepted_tokens=s.spec_num_accepted_tokens,
            spec_accepted_per_pos=s.spec_accepted_per_pos,
            spec_drafted_per_pos=s.spec_drafted_per_pos,
            spec_proposer_seconds=self.runner.spec.proposer_seconds if self.runner.spec is not None else 0.0,
            spec_num_accepted_alternatives=self.runner.num_accepted_alternatives,
            runner_seconds=self.runner.step_seconds,
            num_retained_sessions=retention.num_sessions,
            num_retained_blocks=retention.num_pinned_blocks,
        )

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def reset_speculation(self) -> None:
        """Speculation forgets earlier requests (engine/spec_decode/controller.py: reset)."""
        if self.scheduler.has_unfinished_requests():
            raise RuntimeError("reset_speculation needs an idle engine: requests are running")
        if self.runner.spec is None:
            return
        # Finished requests reach the runner with the next step: hand them over now (an empty
        # step), or their outputs would join the suffix index after it was cleared.
        self.runner.execute_model(self.scheduler.schedule())
        self.runner.spec.reset()

    def set_speculative_method(self, method: str) -> None:
        """Switches an idle engine to another speculative method ("none", "draft", "suffix",
        "hybrid"; one with a draft model needs the engine built with one), starting speculation
        afresh: new proposers, nothing learnt. The prefix cache is emptied too, since steps
        without the draft model leave its KV behind the target's for the same blocks."""
        if self.scheduler.has_unfinished_requests():
            raise RuntimeError("set_speculative_method needs an idle engine: requests are running")
        # Finished requests reach the runner with the next step: hand them over first.
        self.runner.execute_model(self.scheduler.schedule())
        self.runner.set_speculative_method(method)
        speculative = self.runner.speculative_config
        self.config = replace(self.config, speculative=speculative)
        self.scheduler.num_lookahead_tokens = _lookahead_tokens(speculative)
        if not self.scheduler.reset_prefix_cache():  # (idle: no block is in use)
            raise RuntimeError("set_speculative_method could not empty the prefix cache")


def _lookahead_tokens(speculative: SpeculativeConfig) -> int:
    """KV slots to reserve past each scheduled range: a draft model writes its own proposals'
    KV past the drafted range."""
    return speculative.num_speculative_tokens if speculative.uses_draft_model else 0
