"""Offline API, vLLM-style: `LLM(model).generate(prompts, SamplingParams(...))`.

Runs the engine core in this process and steps it until every request is done.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from engine.config import build_engine_config
from engine.engine_core import EngineCore
from engine.protocol import AddRequest, EngineStats, RequestDelta, TokenLogprobs
from engine.sampling_params import SamplingParams

Prompt = str | Sequence[int]


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0

    # The first (usually only) completion, for the common n == 1 case.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


class LLM:
    """An engine for offline batched generation.

    model: None for the embedded SmolLM2-135M-Instruct, else a GGUF file or a Hugging Face
    checkpoint folder. Other keywords: see engine.config.build_engine_config.
    """

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.config = build_engine_config(model, **options)
        self.engine = EngineCore(self.config)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self._ids = itertools.count()

    # ---- generation --------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt (a string or a list of token ids); outputs in prompt order.

        Every prompt is checked before any runs: one that can never fit raises ValueError.
        """
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params_list = (
            [sampling_params] * len(prompt_list)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params_list) != len(prompt_list):
            raise ValueError(f"sampling_params has {len(params_list)} entries for {len(prompt_list)} prompts")
        priorities = list(priority) if priority is not None else [0] * len(prompt_list)
        if len(priorities) != len(prompt_list):
            raise ValueError(f"priority has {len(priorities)} entries for {len(prompt_list)} prompts")

        outputs: list[RequestOutput] = []
        for prompt in prompt_list:
            token_ids = self._tokenize(prompt)
            self._check_fits(token_ids)
            outputs.append(RequestOutput(
                request_id=str(next(self._ids)),
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=token_ids,
                outputs=[],
            ))
        for params in params_list:
            params.validate_vocab(self.engine.vocab_size)

        # n > 1: one engine request per completion; they share the prompt's cached blocks.
        children: dict[str, tuple[RequestOutput, CompletionOutput]] = {}
        arrival = time.monotonic()
        for output, params, prio in zip(outputs, params_list, priorities):
            for index in range(params.n):
                child_params = params
                if params.n > 1:
                    seed = None if params.seed is None else params.seed + index
                    child_params = params.clone(n=1, seed=seed)
                completion = CompletionOutput(index=index)
                output.outputs.append(completion)
                child_id = f"{output.request_id}-{index}"
                children[child_id] = (output, completion)
                error = self.engine.add_request(AddRequest(
                    request_id=child_id, prompt_token_ids=output.prompt_token_ids,
                    sampling_params=child_params, arrival_time=arrival, priority=prio,
                ))
                if error is not None:
                    self.engine.abort_requests(list(children))
                    raise ValueError(error.error)
        self._run(children, total=len(outputs), use_tqdm=use_tqdm and len(outputs) > 1)
        return outputs

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        use_tqdm: bool = True,
        **template_kwargs: Any,
    ) -> list[RequestOutput]:
        """Renders each conversation with the model's chat template, then generates."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.encode(
                self.tokenizer.apply_chat_template(c, tools=tools, add_generation_prompt=True, **template_kwargs),
                add_special_tokens=False,
            )
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    def reset_speculation(self) -> None:
        """Speculation forgets what earlier requests taught it (the suffix index of their outputs,
        pooled acceptance, measured costs), as in a fresh engine: for side-by-side benchmarks."""
        self.engine.reset_speculation()

    def set_speculative_method(self, method: str) -> None:
        """Switches to another speculative method between requests ("none", "draft", "suffix",
        "hybrid"; "draft" and "hybrid" need the engine built with a draft model, i.e. with
        speculative="draft" or "hybrid"), as in a fresh engine built with it: speculation starts
        over and the prefix cache is emptied. Lets one engine run every method in turn."""
        self.engine.set_speculative_method(method)

    # ---- internals ---------------------------------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            token_ids = [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("prompt must contain at least one token")
        return token_ids

    def _check_fits(self, token_ids: list[int]) -> None:
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but the model's context (max_model_len) is "
                f"{self.max_model_len}; at least one token must be left for the output"
            )

    def _run(self, children: dict[str, tuple[RequestOutput, CompletionOutput]], total: int, use_tqdm: bool) -> None:
        pending = set(children)
        remaining_children: dict[int, int] = {}
        for output, _ in children.values():
            remaining_children[id(output)] = remaining_children.get(id(output), 0) + 1
        bar = tqdm(total=total, desc="generate", unit="req", disable=not use_tqdm)
        try:
            while pending:
                for delta in self.engine.step():
                    if delta.request_id not in children:
                        continue
                    output, completion = children[delta.request_id]
                    _apply_delta(output, completion, delta)
                    if delta.finish_reason is not None:
                        pending.discard(delta.request_id)
                        remaining_children[id(output)] -= 1
                        if remaining_children[id(output)] == 0:
                            bar.update(1)
                if pending and not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"engine stopped with {len(pending)} requests unfinished")
        except BaseException:
            self.engine.abort_requests(list(pending))
            raise
        finally:
            bar.close()


def _apply_delta(output: RequestOutput, completion: CompletionOutput, delta: RequestDelta) -> None:
    if delta.error is not None:
        raise ValueError(delta.error)
    completion.token_ids.extend(delta.new_token_ids)
    completion.text += delta.text
    if delta.logprobs is not None:
        completion.logprobs = (completion.logprobs or []) + delta.logprobs
    if delta.finish_reason is not None:
        completion.finish_reason = delta.finish_reason
        completion.stop_reason = delta.stop_reason
    output.num_cached_tokens = max(output.num_cached_tokens, delta.num_cached_tokens)


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]  # one prompt given as token ids
    if not prompts:
        raise ValueError("prompts must not be empty")
    return prompts
