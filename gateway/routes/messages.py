"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API).

Anthropic conversations are normalised to the same message dicts as OpenAI chat (tool_use blocks
become tool calls, tool_result blocks become tool messages), rendered by the same chat-prompt
code, and parsed by the same tool-call parser; only the wire format differs. Errors use the
Anthropic error body (the app's exception handler picks it by path).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.response import Stream

from gateway.canonical.chat_request import canonical_conversation, forced_tool_call_spec
from gateway.canonical.pipeline import CanonicalConversation
from gateway.chat_prompt import ChatPrompt, render_chat_prompt_async, resolve_tool_choice
from gateway.errors import APIError, bad_request, unprocessable
from gateway.generation import ClientDisconnected, Generation, start_generation, until_disconnect
from gateway.routes.common import decode_body, gateway_state, json_response, new_id
from gateway.sampling import SamplingRequest, build_sampling_params
from gateway.schemas import anthropic as an
from gateway.schemas.errors import anthropic_error_body
from gateway.state import GatewayState
from gateway.sessions import SessionTurn, open_turn, session_extras
from gateway.streaming import event_frame, raw_event_frame, sse_response
from gateway.tool_prompt import ToolChoice
from gateway.tools import ToolCallParser


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


class MessagesController(Controller):
    path = "/v1/messages"

    @post("", status_code=200)
    async def create(self, request: Request) -> Response | Stream:
        arrival = time.monotonic()
        state = gateway_state(request)
        engine = state.serving_engine()
        body = await decode_body(request, an.request_decoder)
        model = state.check_model(body.model)
        canonical, tool_choice = _canonical(state, request, body)

        async def render(conversation: CanonicalConversation) -> ChatPrompt:
            return await render_chat_prompt_async(engine.tokenizer, conversation.messages, conversation.tools,
                                                  tool_choice)

        turn, canonical, prompt = await open_turn(state, request.headers, await request.body(), canonical, render)
        structured = forced_tool_call_spec(canonical.tools, tool_choice) if prompt.parse_tools else None
        params = build_sampling_params(SamplingRequest(
            num_prompt_tokens=len(prompt.token_ids), max_tokens=body.max_tokens, prompt_param="messages",
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, stop=body.stop_sequences,
            extra_stop=prompt.extra_stop,
        ), max_model_len=engine.max_model_len, vocab_size=engine.vocab_size, max_n=1)
        generation = start_generation(state, engine, [prompt.token_ids], params, request_id=new_id("msg_"),
                                      arrival=arrival, extras=session_extras(turn, prompt, structured))
        response = _MessageResponse(generation, prompt, model, set(body.stop_sequences or ()), turn)
        if body.stream:
            stream = sse_response(response.events(), on_close=generation.close)
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

    @post("/count_tokens", status_code=200)
    async def count_tokens(self, request: Request) -> Response:
        state = gateway_state(request)
        state.serving_engine()
        body = await decode_body(request, an.count_tokens_decoder)
        state.check_model(body.model)
        canonical, tool_choice = _canonical(state, request, body)
        prompt = await render_chat_prompt_async(state.serving_engine().tokenizer, canonical.messages, canonical.tools,
                                                tool_choice)
        return json_response(an.CountTokensResponse(len(prompt.token_ids)))


def _canonical(state: GatewayState, request: Request, body: an.MessagesRequest | an.CountTokensRequest,
               ) -> tuple[CanonicalConversation, ToolChoice]:
    messages = normalize_messages(body.messages, body.system)
    tools = [
        {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                          "parameters": tool.input_schema or {"type": "object", "properties": {}}}}
        for tool in body.tools or []
    ]
    mode, name = _tool_choice(body.tool_choice)
    tool_choice = resolve_tool_choice(mode, name, [tool.name for tool in body.tools or []], "tool_choice")
    canonical = canonical_conversation(state.config.canonicalization, request.headers, messages, tools or None)
    return canonical, tool_choice


def _tool_choice(choice: an.ToolChoice | None) -> tuple[str | None, str | None]:
    match choice:
        case an.ToolChoiceAny():
            return "required", None
        case an.ToolChoiceTool(name=name):
            return "function", name
        case an.ToolChoiceNone():
            return "none", None
        case an.ToolChoiceAuto():
            return "auto", None
    return None, None


def _block_text(blocks: str | list[Any] | None, param: str) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for index, block in enumerate(blocks):
        if isinstance(block, an.TextBlock):
            texts.append(block.text)
        else:
            raise unprocessable(f"{param}[{index}]: this model accepts text only "
                                f"(got a {block.__struct_config__.tag!r} block)", param=f"{param}[{index}]")
    return "\n".join(texts)


def normalize_messages(messages: list[an.Message], system: str | list[an.TextBlock] | None) -> list[dict[str, Any]]:
    """Anthropic messages -> the template's message dicts."""
    if not messages:
        raise bad_request("messages must contain at least one message", param="messages")
    result: list[dict[str, Any]] = []
    if system:
        result.append({"role": "system", "content": _block_text(system, "system")})
    for index, message in enumerate(messages):
        param = f"messages[{index}].content"
        if isinstance(message.content, str):
            result.append({"role": message.role, "content": message.content})
            continue
        texts: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        for position, block in enumerate(message.content):
            match block:
                case an.TextBlock(text=text):
                    texts.append(text)
                case an.ToolUseBlock(id=call_id, name=name, input=arguments) if message.role == "assistant":
                    arguments_text = json.dumps(arguments, ensure_ascii=False)
                    tool_calls.append({"id": call_id, "type": "function",
                                       "function": {"name": name, "arguments": arguments_text}})
                case an.ToolResultBlock(tool_use_id=call_id, content=content, is_error=is_error) if (
                    message.role == "user"
                ):
                    output = _block_text(content, f"{param}[{position}].content")
                    result.append({"role": "tool", "tool_call_id": call_id,
                                   "content": f"Error: {output}" if is_error else output})
                case an.ThinkingBlock() | an.RedactedThinkingBlock():
                    pass  # earlier reasoning is not replayed to the model
                case an.ToolUseBlock() | an.ToolResultBlock():
                    raise bad_request(f"{param}[{position}]: {block.__struct_config__.tag} blocks belong in "
                                      f"{'assistant' if isinstance(block, an.ToolUseBlock) else 'user'} messages",
                                      param=f"{param}[{position}]")
                case _:
                    raise unprocessable(f"{param}[{position}]: this model accepts text only "
                                        f"(got a {block.__struct_config__.tag!r} block)", param=f"{param}[{position}]")
        if message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            if tool_calls:
                entry["tool_calls"] = tool_calls
            result.append(entry)
        elif texts:
            result.append({"role": "user", "content": "\n".join(texts)})
    return result


class MessageResponseWithReport(an.MessageResponse, kw_only=True):
    """The Anthropic message plus the `draftgate` extension: session, canonicalization, prefix report."""

    draftgate: dict[str, Any] | None = None


class _MessageResponse:
    def __init__(self, generation: Generation, prompt: ChatPrompt, model: str, stop_sequences: set[str],
                 turn: SessionTurn) -> None:
        self.turn = turn
        self.generation = generation
        self.prompt = prompt
        self.model = model
        self.stop_sequences = stop_sequences
        self.message_id = generation.request_id

    def _stop(self, finish_reason: str | None, stop_reason: int | str | None,
              has_calls: bool) -> tuple[str, str | None]:
        if finish_reason == "length":
            return "max_tokens", None
        if has_calls:
            return "tool_use", None
        if isinstance(stop_reason, str) and stop_reason in self.stop_sequences:
            return "stop_sequence", stop_reason
        return "end_turn", None

    def _usage(self, output_tokens: int) -> an.Usage:
        cached = self.generation.num_cached_tokens
        return an.Usage(self.generation.num_prompt_tokens - cached, output_tokens, cache_read_input_tokens=cached)

    def _parser(self) -> ToolCallParser | None:
        return ToolCallParser(new_tool_use_id) if self.prompt.parse_tools else None

    async def complete(self) -> an.MessageResponse:
        [result] = await self.generation.collect()
        parser = self._parser()
        content: list[an.TextContent | an.ToolUseContent] = []
        text = result.text
        if parser is not None:
            text = parser.feed(self.prompt.prefill + result.text).content + parser.finish().content
        if text:
            content.append(an.TextContent(text))
        calls = parser.tool_calls if parser is not None else []
        for call in calls:
            content.append(an.ToolUseContent(call.id, call.name, _input_object(call.arguments)))
        stop_reason, stop_sequence = self._stop(result.finish_reason, result.stop_reason, bool(calls))
        self.turn.finish(text or None, [(call.name, call.arguments) for call in calls],
                         self.generation.first_choice_token_ids)
        extension = self.turn.extension()
        if extension is None:
            return an.MessageResponse(self.message_id, self.model, content, stop_reason, stop_sequence,
                                      self._usage(result.num_tokens))
        return MessageResponseWithReport(self.message_id, self.model, content, stop_reason, stop_sequence,
                                         self._usage(result.num_tokens), draftgate=extension)

    async def events(self) -> AsyncIterator[bytes]:
        """message_start, blocks (start / deltas / stop), message_delta, message_stop."""
        generation = self.generation
        parser = self._parser()
        block_index = -1
        block_kind: str | None = None  # "text" or "tool_use" while a block is open
        try:
            start = an.MessageResponse(self.message_id, self.model, [], None, None, self._usage(0))
            yield event_frame("message_start", an.MessageStart(start))
            yield event_frame("ping", an.Ping())
            pending_text = ""
            streamed_text = ""
            tool_deltas = []
            if parser is not None and self.prompt.prefill:
                tool_deltas = parser.feed(self.prompt.prefill).tool_calls
            finish_reason: str | None = None
            stop_reason: int | str | None = None
            async with contextlib.aclosing(generation.deltas()) as deltas:
                async for _, delta in deltas:
                    if parser is None:
                        pending_text = delta.text
                    else:
                        parsed = parser.feed(delta.text)
                        if delta.finish_reason is not None:
                            tail = parser.finish()
                            parsed.content += tail.content
                            parsed.tool_calls += tail.tool_calls
                        pending_text = parsed.content
                        tool_deltas += parsed.tool_calls
                    streamed_text += pending_text
                    if pending_text:
                        if block_kind != "text":
                            if block_kind is not None:
                                yield event_frame("content_block_stop", an.ContentBlockStop(block_index))
                            block_index, block_kind = block_index + 1, "text"
                            yield event_frame("content_block_start",
                                              an.ContentBlockStart(block_index, an.TextContent("")))
                        yield event_frame("content_block_delta",
                                          an.ContentBlockDelta(block_index, an.TextDelta(pending_text)))
                    for call in tool_deltas:
                        if call.id is not None:
                            if block_kind is not None:
                                yield event_frame("content_block_stop", an.ContentBlockStop(block_index))
                            block_index, block_kind = block_index + 1, "tool_use"
                            yield event_frame("content_block_start", an.ContentBlockStart(
                                block_index, an.ToolUseContent(call.id, call.name or "", {})))
                        if call.arguments:
                            yield event_frame("content_block_delta", an.ContentBlockDelta(
                                block_index, an.InputJsonDelta(call.arguments)))
                    tool_deltas = []
                    if delta.finish_reason is not None:
                        finish_reason, stop_reason = delta.finish_reason, delta.stop_reason
            if block_kind is not None:
                yield event_frame("content_block_stop", an.ContentBlockStop(block_index))
            calls = parser.tool_calls if parser is not None else []
            self.turn.finish(streamed_text or None, [(call.name, call.arguments) for call in calls],
                             generation.first_choice_token_ids)
            has_calls = parser is not None and parser.has_tool_calls
            reason, sequence = self._stop(finish_reason, stop_reason, has_calls)
            yield event_frame("message_delta", an.MessageDelta(an.MessageDeltaBody(reason, sequence),
                                                               an.MessageDeltaUsage(generation.num_generated_tokens)))
            yield event_frame("message_stop", an.MessageStop())
        except APIError as error:
            yield raw_event_frame("error", anthropic_error_body(error))
        finally:
            generation.close()


def _input_object(arguments: str) -> dict[str, Any]:
    """A tool call's input as Anthropic wants it: an object (arguments that are not one are wrapped)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}
