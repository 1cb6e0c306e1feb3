"""POST /v1/completions (OpenAI legacy completions): raw prompts, batches, echo, FIM, streaming."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Controller, Request, Response, post
from litestar.response import Stream

from engine.model.tokenizer import Tokenizer
from gateway.errors import APIError, bad_request
from gateway.fim import build_fim_prompt, find_fim_tokens
from gateway.generation import ClientDisconnected, Generation, start_generation, until_disconnect
from gateway.logprobs import TokenTexts, completion_logprobs
from gateway.routes.common import decode_body, gateway_state, json_response, new_id, unix_time
from gateway.sampling import SamplingRequest, build_sampling_params, check_token_ids
from gateway.schemas import openai_completions as ocp
from gateway.schemas.errors import openai_error_body
from gateway.schemas.openai_common import make_usage
from gateway.streaming import DONE_FRAME, data_frame, raw_data_frame, sse_response

MAX_PROMPTS = 64
MAX_COMPLETION_LOGPROBS = 5  # the OpenAI limit for this endpoint
# Prompts longer than this (in characters) are tokenized off the event loop.
_OFFLOAD_CHARS = 16_384


class CompletionsController(Controller):
    path = "/v1/completions"

    @post("", status_code=200)
    async def create(self, request: Request) -> Response | Stream:
        arrival = time.monotonic()
        state = gateway_state(request)
        engine = state.serving_engine()
        body = await decode_body(request, ocp.request_decoder)
        model = state.check_model(body.model)
        if body.best_of is not None and body.best_of != body.n:
            raise bad_request("best_of is not supported (only best_of == n)", param="best_of")
        if body.logprobs is not None and not 0 <= body.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise bad_request(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {body.logprobs}",
                              param="logprobs")
        if body.echo and body.logprobs is not None:
            raise bad_request("echo with logprobs is not supported (prompt logprobs are not computed)", param="echo")
        texts, prompts = await _tokenize_prompts(engine.tokenizer, body, engine.vocab_size)
        # Context checks (and "up to the context" when max_tokens is null) hold for the longest prompt.
        num_prompt_tokens = max(len(prompt) for prompt in prompts)
        params = build_sampling_params(SamplingRequest(
            num_prompt_tokens=num_prompt_tokens, max_tokens=body.max_tokens, prompt_param="prompt", n=body.n,
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty, seed=body.seed, stop=body.stop,
            stop_token_ids=body.stop_token_ids, min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
            logprobs=body.logprobs, logit_bias=body.logit_bias,
            include_stop_str_in_output=body.include_stop_str_in_output, skip_special_tokens=body.skip_special_tokens,
            priority=body.priority,
        ), max_model_len=engine.max_model_len, vocab_size=engine.vocab_size, max_n=state.config.max_n)
        request_id = new_id("cmpl-")
        generation = start_generation(state, engine, prompts, params, request_id=request_id, arrival=arrival,
                                      priority=body.priority, cache_salt=body.cache_salt)
        echoes = texts if body.echo else [""] * len(prompts)
        response = _CompletionResponse(generation, model, request_id, echoes, TokenTexts(engine.tokenizer),
                                       body.logprobs)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return sse_response(response.frames(include_usage), on_close=generation.close)
        try:
            return json_response(await until_disconnect(request, response.complete))
        except ClientDisconnected:
            return Response(b"", status_code=499)
        finally:
            generation.close()


async def _tokenize_prompts(tokenizer: Tokenizer, body: ocp.CompletionRequest,
                            vocab_size: int) -> tuple[list[str], list[list[int]]]:
    """(prompt texts for echo, prompt token ids) for a string, strings, token ids or token-id lists."""
    prompt = body.prompt
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif not prompt:
        raise bad_request("prompt must not be empty", param="prompt")
    elif all(isinstance(item, int) for item in prompt):
        items = [list(prompt)]
    elif all(isinstance(item, str) for item in prompt) or all(isinstance(item, list) for item in prompt):
        items = list(prompt)
    else:
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of token-id "
                          "lists (not a mix)", param="prompt")
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"prompt holds {len(items)} prompts; at most {MAX_PROMPTS} per request", param="prompt")
    suffix = body.suffix or None
    fim = None
    if suffix is not None:
        fim = find_fim_tokens(tokenizer)
        if fim is None:
            raise bad_request("suffix (fill-in-the-middle) is not supported by this model: its tokenizer has no FIM "
                              "tokens such as <fim_prefix>/<fim_suffix>/<fim_middle>", param="suffix")
        if not isinstance(items[0], str):
            raise bad_request("suffix needs a text prompt, not token ids", param="suffix")

    def tokenize() -> tuple[list[str], list[list[int]]]:
        texts, token_lists = [], []
        for item in items:
            if isinstance(item, str):
                token_ids = (build_fim_prompt(tokenizer, fim, item, suffix) if fim is not None and suffix is not None
                             else tokenizer.encode(item, add_special_tokens=True))
                texts.append(item)
            else:
                check_token_ids(item, vocab_size, "prompt")
                token_ids = list(item)
                texts.append(tokenizer.decode(token_ids, skip_special_tokens=False))
            if not token_ids:
                raise bad_request("prompt must contain at least one token", param="prompt")
            token_lists.append(token_ids)
        return texts, token_lists

    if sum(len(item) for item in items) < _OFFLOAD_CHARS:
        return tokenize()
    return await anyio.to_thread.run_sync(tokenize)


class _CompletionResponse:
    def __init__(self, generation: Generation, model: str, request_id: str, echoes: list[str], texts: TokenTexts,
                 num_logprobs: int | None) -> None:
        self.generation = generation
        self.model = model
        self.request_id = request_id
        self.created = unix_time()
        self.echoes = echoes
        self.texts = texts
        self.num_logprobs = num_logprobs

    def _echo(self, choice: int) -> str:
        return self.echoes[choice // self.generation.params.n]

    async def complete(self) -> ocp.Completion:
        results = await self.generation.collect()
        choices = []
        for index, result in enumerate(results):
            echo = self._echo(index)
            logprobs = None
            if self.num_logprobs is not None:
                logprobs = completion_logprobs(result.logprobs, self.texts, self.num_logprobs, len(echo))
            choices.append(ocp.CompletionChoice(index, echo + result.text, result.finish_reason, logprobs))
        usage = make_usage(self.generation.num_prompt_tokens, sum(r.num_tokens for r in results),
                           self.generation.num_cached_tokens)
        return ocp.Completion(self.request_id, self.created, self.model, choices, usage)

    async def frames(self, include_usage: bool) -> AsyncIterator[bytes]:
        chunk_type = ocp.CompletionChunkWithUsage if include_usage else ocp.CompletionChunk
        extra: tuple[Any, ...] = (None,) if include_usage else ()

        def frame(choice: ocp.CompletionChoice) -> bytes:
            return data_frame(chunk_type(self.request_id, self.created, self.model, [choice], *extra))

        generation = self.generation
        offsets = [len(self._echo(index)) for index in range(generation.num_choices)]
        try:
            for index in range(generation.num_choices):
                if self._echo(index):
                    yield frame(ocp.CompletionChoice(index, self._echo(index), None))
            async with contextlib.aclosing(generation.deltas()) as deltas:
                async for index, delta in deltas:
                    logprobs = None
                    if self.num_logprobs is not None and delta.logprobs:
                        logprobs = completion_logprobs(delta.logprobs, self.texts, self.num_logprobs, offsets[index])
                        offsets[index] += sum(len(token) for token in logprobs.tokens)
                    if delta.text or logprobs is not None:
                        yield frame(ocp.CompletionChoice(index, delta.text, None, logprobs))
                    if delta.finish_reason is not None:
                        yield frame(ocp.CompletionChoice(index, "", delta.finish_reason))
            if include_usage:
                usage = make_usage(generation.num_prompt_tokens, generation.num_generated_tokens,
                                   generation.num_cached_tokens)
                yield data_frame(ocp.CompletionChunkWithUsage(self.request_id, self.created, self.model, [], usage))
            yield DONE_FRAME
        except APIError as error:
            yield raw_data_frame(openai_error_body(error))
            yield DONE_FRAME
        finally:
            generation.close()
