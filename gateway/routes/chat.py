"""POST /v1/chat/completions (OpenAI Chat Completions), streamed or not."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.response import Stream

from gateway.chat_prompt import ChatPrompt, render_chat_prompt_async, resolve_tool_choice
from gateway.errors import APIError, bad_request, unprocessable
from gateway.canonical.chat_request import canonical_conversation, forced_tool_call_spec, response_format_spec
from gateway.canonical.pipeline import CanonicalConversation
from gateway.generation import ChoiceResult, ClientDisconnected, Generation, start_generation, until_disconnect
from gateway.logprobs import TokenTexts, chat_logprobs
from gateway.routes.common import decode_body, gateway_state, json_response, new_id, unix_time
from gateway.sampling import SamplingRequest, build_sampling_params
from gateway.schemas import openai_chat as oc
from gateway.schemas.errors import openai_error_body
from gateway.schemas.openai_common import make_usage
from gateway.sessions import SessionTurn, open_turn, session_extras
from gateway.streaming import DONE_FRAME, data_frame, raw_data_frame, sse_response
from gateway.tools import ParsedDelta, ToolCallParser

_TEXT_ONLY = "this model accepts text only"
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ChatCompletionWithReport(oc.ChatCompletion, kw_only=True):
    """chat.completion plus the `draftgate` extension: session, canonicalization, prefix report."""

    draftgate: dict[str, Any] | None = None


class ChatController(Controller):
    path = "/v1/chat/completions"

    @post("", status_code=200)
    async def create(self, request: Request) -> Response | Stream:
        arrival = time.monotonic()
        state = gateway_state(request)
        engine = state.serving_engine()
        body = await decode_body(request, oc.request_decoder)
        model = state.check_model(body.model)
        messages = normalize_messages(body.messages)
        tools = [{"type": "function", "function": _function_dict(tool.function)} for tool in body.tools or []]
        tool_names = [tool.function.name for tool in body.tools or []]
        choice_mode, choice_name = _tool_choice(body.tool_choice)
        tool_choice = resolve_tool_choice(choice_mode, choice_name, tool_names, "tool_choice")
        structured = None
        if body.response_format is not None:
            structured = response_format_spec(body.response_format.type, body.response_format.json_schema)
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        canonical = canonical_conversation(state.config.canonicalization, request.headers, messages, tools or None)

        async def render(conversation: CanonicalConversation) -> ChatPrompt:
            return await render_chat_prompt_async(engine.tokenizer, conversation.messages, conversation.tools,
                                                  tool_choice, body.chat_template_kwargs)

        turn, canonical, prompt = await open_turn(state, request.headers, await request.body(), canonical, render,
                                                  body.cache_salt)
        if prompt.parse_tools:
            structured = forced_tool_call_spec(canonical.tools, tool_choice) or structured
        max_tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        params = build_sampling_params(SamplingRequest(
            num_prompt_tokens=len(prompt.token_ids),
            max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
            max_tokens_param=max_tokens_param, prompt_param="messages", n=body.n, temperature=body.temperature,
            top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty, seed=body.seed,
            stop=body.stop, extra_stop=prompt.extra_stop, stop_token_ids=body.stop_token_ids,
            min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
            logprobs=(body.top_logprobs or 0) if body.logprobs else None, logprobs_param="top_logprobs",
            logit_bias=body.logit_bias, include_stop_str_in_output=body.include_stop_str_in_output,
            skip_special_tokens=body.skip_special_tokens, priority=body.priority,
        ), max_model_len=engine.max_model_len, vocab_size=engine.vocab_size, max_n=state.config.max_n)
        request_id = new_id("chatcmpl-")
        generation = start_generation(state, engine, [prompt.token_ids], params, request_id=request_id, arrival=arrival,
                                      priority=body.priority, cache_salt=body.cache_salt,
                                      extras=session_extras(turn, prompt, structured))
        response = _ChatResponse(generation, prompt, model, request_id, TokenTexts(engine.tokenizer),
                                 (body.top_logprobs or 0) if body.logprobs else None, turn)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            stream = sse_response(response.frames(include_usage), on_close=generation.close)
            stream.headers.update(turn.report.headers())
            return stream
        try:
            reply = json_response(await until_disconnect(request, response.complete))
            reply.headers.update(turn.report.headers())
            return reply
        except ClientDisconnected:
            return Response(b"", status_code=499)
        finally:
            generation.close()


class _ChatResponse:
    """Turns one generation into a chat.completion or a stream of chat.completion.chunk."""

    def __init__(self, generation: Generation, prompt: ChatPrompt, model: str, request_id: str, texts: TokenTexts,
                 num_top_logprobs: int | None, turn: SessionTurn) -> None:
        self.turn = turn
        self.generation = generation
        self.prompt = prompt
        self.model = model
        self.request_id = request_id
        self.created = unix_time()
        self.texts = texts
        self.num_top_logprobs = num_top_logprobs

    def _parser(self) -> ToolCallParser | None:
        return ToolCallParser() if self.prompt.parse_tools else None

    def _finish_reason(self, engine_reason: str | None, parser: ToolCallParser | None) -> str | None:
        if parser is not None and parser.has_tool_calls and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    async def complete(self) -> oc.ChatCompletion:
        results = await self.generation.collect()
        choices = [self._choice(index, result) for index, result in enumerate(results)]
        usage = make_usage(self.generation.num_prompt_tokens, sum(r.num_tokens for r in results),
                           self.generation.num_cached_tokens)
        first = choices[0].message
        calls = [(call.function.name, call.function.arguments) for call in first.tool_calls or ()]
        self.turn.finish(first.content, calls, self.generation.first_choice_token_ids)
        extension = self.turn.extension()
        if extension is None:
            return oc.ChatCompletion(self.request_id, self.created, self.model, choices, usage)
        return ChatCompletionWithReport(self.request_id, self.created, self.model, choices, usage, draftgate=extension)

    def _choice(self, index: int, result: ChoiceResult) -> oc.Choice:
        parser = self._parser()
        tool_calls = None
        content: str | None = result.text
        if parser is not None:
            parsed = ParsedDelta()
            for piece in (parser.feed(self.prompt.prefill + result.text), parser.finish()):
                parsed.content += piece.content
            content = parsed.content
            if parser.has_tool_calls:
                tool_calls = [oc.ToolCall(call.id, oc.FunctionCall(call.name, call.arguments))
                              for call in parser.tool_calls]
                content = content or None
        logprobs = None
        if self.num_top_logprobs is not None:
            logprobs = oc.ChoiceLogprobs(chat_logprobs(result.logprobs, self.texts, self.num_top_logprobs))
        message = oc.ResponseMessage(content, tool_calls=tool_calls)
        return oc.Choice(index, message, self._finish_reason(result.finish_reason, parser), logprobs)

    async def frames(self, include_usage: bool) -> AsyncIterator[bytes]:
        chunk_type = oc.ChatCompletionChunkWithUsage if include_usage else oc.ChatCompletionChunk
        extra: tuple[Any, ...] = (None,) if include_usage else ()

        def frame(choices: list[oc.ChunkChoice]) -> bytes:
            return data_frame(chunk_type(self.request_id, self.created, self.model, choices, *extra))

        generation = self.generation
        try:
            num_choices = generation.num_choices
            parsers = [self._parser() for _ in range(num_choices)]
            for index in range(num_choices):
                first = oc.ChoiceDelta(role="assistant", content="")
                parser = parsers[index]
                if parser is not None and self.prompt.prefill:
                    first.tool_calls = _tool_call_deltas(parser.feed(self.prompt.prefill)) or None
                yield frame([oc.ChunkChoice(index, first)])
            first_content = ""
            async with contextlib.aclosing(generation.deltas()) as deltas:
                async for index, delta in deltas:
                    parser = parsers[index]
                    if parser is None:
                        parsed = ParsedDelta(delta.text)
                    else:
                        parsed = parser.feed(delta.text)
                        if delta.finish_reason is not None:
                            tail = parser.finish()
                            parsed.content += tail.content
                            parsed.tool_calls += tail.tool_calls
                    if index == 0:
                        first_content += parsed.content
                    logprobs = None
                    if self.num_top_logprobs is not None and delta.logprobs:
                        logprobs = oc.ChoiceLogprobs(chat_logprobs(delta.logprobs, self.texts, self.num_top_logprobs))
                    if parsed or logprobs is not None:
                        chunk_delta = oc.ChoiceDelta(content=parsed.content or None,
                                                     tool_calls=_tool_call_deltas(parsed) or None)
                        yield frame([oc.ChunkChoice(index, chunk_delta, logprobs=logprobs)])
                    if delta.finish_reason is not None:
                        reason = self._finish_reason(delta.finish_reason, parser)
                        yield frame([oc.ChunkChoice(index, oc.ChoiceDelta(), finish_reason=reason)])
            first_parser = parsers[0] if parsers else None
            calls = [(call.name, call.arguments) for call in first_parser.tool_calls] if first_parser else []
            self.turn.finish(first_content or None, calls, generation.first_choice_token_ids)
            if include_usage:
                usage = make_usage(generation.num_prompt_tokens, generation.num_generated_tokens,
                                   generation.num_cached_tokens)
                yield data_frame(oc.ChatCompletionChunkWithUsage(self.request_id, self.created, self.model, [], usage))
            yield DONE_FRAME
        except APIError as error:
            # Headers are gone already: the error travels as a data frame, as OpenAI does.
            yield raw_data_frame(openai_error_body(error))
            yield DONE_FRAME
        finally:
            generation.close()


def _tool_call_deltas(parsed: ParsedDelta) -> list[oc.ToolCallDelta]:
    return [
        oc.ToolCallDelta(call.index, oc.FunctionCallDelta(call.name, call.arguments), call.id,
                         "function" if call.id is not None else None)
        for call in parsed.tool_calls
    ]


def _function_dict(function: oc.FunctionDefinition) -> dict[str, Any]:
    result: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        result["description"] = function.description
    result["parameters"] = function.parameters if function.parameters is not None else EMPTY_PARAMETERS
    return result


def _tool_choice(choice: str | oc.NamedToolChoice | None) -> tuple[str | None, str | None]:
    if isinstance(choice, oc.NamedToolChoice):
        return "function", choice.function.name
    return choice, None


def _text_of(content: str | list[oc.ContentPart] | None, param: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        if isinstance(part, oc.TextPart):
            texts.append(part.text)
        elif isinstance(part, oc.RefusalPart):
            texts.append(part.refusal)
        else:
            raise unprocessable(f"{param}[{index}]: {_TEXT_ONLY} (got a {part.__struct_config__.tag!r} part)",
                                param=f"{param}[{index}]")
    return "\n".join(texts)


def normalize_messages(messages: list[oc.ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages -> the template's message dicts (string content, plain tool calls)."""
    if not messages:
        raise bad_request("messages must contain at least one message", param="messages")
    result: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        param = f"messages[{index}].content"
        content = _text_of(message.content, param)
        role = {"developer": "system", "function": "tool"}.get(message.role, message.role)
        entry: dict[str, Any] = {"role": role}
        if role == "assistant":
            entry["content"] = content or ""
            if message.tool_calls:
                entry["tool_calls"] = [
                    {"id": call.id or f"call_{index}_{position}", "type": "function",
                     "function": {"name": call.function.name, "arguments": call.function.arguments}}
                    for position, call in enumerate(message.tool_calls)
                ]
        else:
            if content is None:
                raise bad_request(f"{param} is required for role {message.role!r}", param=param)
            entry["content"] = content
        if role == "tool":
            entry["tool_call_id"] = message.tool_call_id or ""
        if message.name is not None:
            entry["name"] = message.name
        result.append(entry)
    return result
