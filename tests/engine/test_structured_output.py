"""Constrained decoding: grammars, per-request matchers, the sampler's bitmask, and the engine.

The engine tests run the embedded SmolLM2-135M through EngineCore with prompts rendered by the
gateway's own code, and check every output with `jsonschema`, an independent validator.
"""

from __future__ import annotations

import json
import time

import jsonschema
import llguidance
import numpy as np
import pytest
import torch

from engine.config import build_engine_config
from engine.model.tokenizer import load_tokenizer
from engine.protocol import AddRequest, StructuredOutputSpec
from engine.sample.sampler import Sampler, apply_token_bitmask_
from engine.sample.sampling_metadata import SamplingMetadata
from engine.sampling_params import SamplingParams
from engine.structured_output.grammars import (
    close_objects,
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
    validate_grammar,
)
from engine.structured_output.matcher import StructuredOutputManager, bitmask_words

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60},
                                           "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
          "required": ["query"]}
EMAIL = {"type": "object", "properties": {"to": {"type": "string", "maxLength": 40},
                                          "subject": {"type": "string", "maxLength": 40}},
         "required": ["to", "subject"]}
TOOLS = {"get_weather": WEATHER, "search_web": SEARCH, "send_email": EMAIL}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def manager(tokenizer) -> StructuredOutputManager:
    return StructuredOutputManager(tokenizer, tokenizer.vocab_size)


def consume(manager: StructuredOutputManager, tokenizer, grammar: str, text: str) -> tuple[bool, bool]:
    """(every token of `text` accepted, grammar complete afterwards)."""
    manager.add_request("probe", grammar)
    try:
        accepted = manager.accept_tokens("probe", tokenizer.encode(text))
        return accepted, manager.has_request("probe") and manager.is_finished("probe")
    finally:
        manager.remove("probe")


# ---- grammars -----------------------------------------------------------------------------------

def test_close_objects_closes_every_object_that_lists_properties() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                                               "c": {"type": "array", "items": {"properties": {}}}},
              "$defs": {"d": {"type": "object", "properties": {}, "additionalProperties": True}}}
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is True  # said otherwise: kept
    assert "additionalProperties" not in schema  # the input is not changed


def test_the_tool_call_grammar_admits_only_calls_valid_for_their_tool(manager, tokenizer) -> None:
    grammar = tool_call_grammar(list(TOOLS.items()), None)
    assert validate_grammar(grammar) is None
    close = "}\n</tool_call>"
    assert consume(manager, tokenizer, grammar, 'search_web", "arguments": {"query": "rust"}' + close) == (True, True)
    assert consume(manager, tokenizer, grammar,
                   'get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}' + close) == (True, True)
    assert consume(manager, tokenizer, grammar, 'delete_all", "arguments": {}' + close)[0] is False
    assert consume(manager, tokenizer, grammar, 'get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}')[0] is False
    # Undeclared parameters and other JSON layouts are refused.
    assert consume(manager, tokenizer, grammar, 'search_web", "arguments": {"query": "a", "x": 1}')[0] is False
    assert consume(manager, tokenizer, grammar, 'search_web", "arguments": {"query":"a"}')[0] is False


def test_a_named_tool_grammar_starts_at_the_arguments(manager, tokenizer) -> None:
    grammar = tool_call_grammar(list(TOOLS.items()), "send_email")
    assert consume(manager, tokenizer, grammar, '{"to": "a@b.c", "subject": "hi"}}\n</tool_call>') == (True, True)
    assert consume(manager, tokenizer, grammar, '{"query": "x"}')[0] is False
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_grammar(list(TOOLS.items()), "nope")


def test_json_schemas_with_defs_and_refs(manager, tokenizer) -> None:
    schema = {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                  "required": ["x", "y"]}},
              "type": "object", "properties": {"path": {"type": "array", "items": {"$ref": "#/$defs/point"}}},
              "required": ["path"]}
    grammar = json_schema_grammar(schema, strict=True)
    assert consume(manager, tokenizer, grammar, '{"path": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]}') == (True, True)
    assert consume(manager, tokenizer, grammar, '{"path": [{"x": 1}]}')[0] is False
    assert consume(manager, tokenizer, json_object_grammar(), '{"any": [1, "two", null]}') == (True, True)
    assert consume(manager, tokenizer, json_object_grammar(), "[1]")[0] is False


def test_a_schema_that_cannot_compile_is_reported() -> None:
    assert "objectx" in validate_grammar(json_schema_grammar({"type": "objectx"}))
    assert validate_grammar(json_schema_grammar({"$ref": "#/$defs/missing"})) is not None


# ---- bitmasks and the sampler -------------------------------------------------------------------

def test_the_bitmask_is_exactly_what_the_matcher_allows(manager, tokenizer) -> None:
    manager.add_request("r", json_schema_grammar({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                  "required": ["ok"]}, strict=True))
    row = manager.bitmasks_for(["r", "unconstrained"])["r"]
    assert row.shape == (bitmask_words(tokenizer.vocab_size),) and row.dtype == np.int32
    allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:tokenizer.vocab_size])
    matcher = llguidance.LLMatcher(manager.ll_tokenizer, json_schema_grammar(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}, strict=True))
    assert all(matcher.validate_tokens([int(token)]) == 1 for token in allowed)
    assert {tokenizer.decode([int(t)]) for t in allowed} <= {"{", '{"', '{"ok', '{"ok"'}
    manager.remove("r")


def test_draft_masks_follow_the_grammar_and_leave_it_where_it_was(manager, tokenizer) -> None:
    from engine.request import Request

    grammar = json_schema_grammar({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                                  strict=True)
    manager.add_request("r", grammar)
    good = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    bad = tokenizer.encode('{"no', add_special_tokens=False)
    assert manager.validate_drafts("r", good) == good
    kept = manager.validate_drafts("r", bad)
    assert len(kept) < len(bad) and kept == bad[: len(kept)]  # cut at the first token the grammar refuses
    assert manager.validate_drafts("unconstrained", bad) == bad
    drafts = good[:3]
    request = Request("r", [1, 2, 3], SamplingParams())
    request.num_computed_tokens = 2  # the last prompt token and 3 drafts are scheduled
    rows = manager.bitmasks_for_step({"r": 4}, {"r": request}, {"r": drafts})["r"]
    assert rows.shape == (4, bitmask_words(tokenizer.vocab_size))
    reference = llguidance.LLMatcher(manager.ll_tokenizer, grammar)
    for j in range(4):
        expected = np.empty(bitmask_words(tokenizer.vocab_size), dtype=np.int32)
        reference.unsafe_compute_mask_ptr(expected.ctypes.data, expected.nbytes)
        assert np.array_equal(rows[j], expected), j
        if j < 3:
            assert reference.consume_token(drafts[j])
    # The grammar is back where it was: its mask is row 0's.
    assert np.array_equal(manager.bitmasks_for(["r"])["r"], rows[0])
    manager.remove("r")


def test_the_sampler_never_picks_a_masked_token() -> None:
    vocab_size = 70
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, vocab_size, generator=generator)
    rows = [np.zeros(bitmask_words(vocab_size), np.int32) for _ in range(2)] + [None]
    rows[0][1] = 1 << 3  # only token 35
    rows[1][0] = (1 << 4) | (1 << 9)  # tokens 4 and 9
    meta = SamplingMetadata.build([SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3),
                                   SamplingParams(temperature=0.0)], [[1]] * 3, [[]] * 3,
                                  frozenset(), vocab_size, "cpu",
                                  token_bitmasks=rows)
    assert meta.token_bitmask is not None and meta.token_bitmask.shape == (3, 3)
    expected_free = int(logits[2].argmax())
    for _ in range(20):
        sampled = Sampler()(logits.clone(), meta).sampled_token_ids.tolist()
        assert sampled[0] == 35 and sampled[1] in (4, 9) and sampled[2] == expected_free
    masked = logits.clone()
    apply_token_bitmask_(masked, meta.token_bitmask)
    assert torch.isinf(masked[0]).sum() == vocab_size - 1 and torch.equal(masked[2], logits[2])


def test_no_bitmask_is_built_when_no_row_is_constrained() -> None:
    meta = SamplingMetadata.build([SamplingParams()], [[1]], [[]], frozenset(), 10, "cpu",
                                  token_bitmasks=[None])
    assert meta.token_bitmask is None


# ---- the engine with the embedded model ---------------------------------------------------------

@pytest.fixture(scope="module")
def core():
    from engine.engine_core import EngineCore

    return EngineCore(build_engine_config(None, kv_cache_memory="128MiB", dtype="float32", num_threads=1))


def run(core, requests: dict[str, tuple[list[int], SamplingParams, str]]) -> dict[str, tuple[str, str]]:
    """Runs the requests together; request id -> (text, finish_reason)."""
    for request_id, (token_ids, params, grammar) in requests.items():
        assert core.add_request(AddRequest(request_id, token_ids, params, time.monotonic(),
                                           structured_output=StructuredOutputSpec(grammar))) is None
    texts = {request_id: "" for request_id in requests}
    finished: dict[str, tuple[str, str]] = {}
    for _ in range(2000):
        if not core.has_unfinished_requests():
            break
        for delta in core.step():
            texts[delta.request_id] += delta.text
            if delta.finish_reason is not None:
                finished[delta.request_id] = (texts[delta.request_id], delta.finish_reason)
    assert core.structured_output.num_requests == 0
    return finished


QUESTIONS = ["What's the weather like in Paris right now?", "Find recent news about the Rust language.",
             "Email Bob that the meeting moved to 3pm.", "Is it going to rain in Tokyo?",
             "Look up the population of Canada.", "hello"]


def forced_call_requests(core, *, greedy_only: bool = False) -> tuple[dict[str, tuple[list[int], SamplingParams, str]], str]:
    """A forced tool call (tool_choice required) per question, rendered as the gateway renders
    it: (requests for run(), the prefill the model's text continues)."""
    from gateway.canonical.chat_request import forced_tool_call_spec
    from gateway.canonical.pipeline import canonicalize
    from gateway.canonical.policy import Policy
    from gateway.chat_prompt import render_chat_prompt
    from gateway.tool_prompt import ToolChoice

    tools = [{"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": schema}}
             for name, schema in TOOLS.items()]
    choice = ToolChoice("required")
    prompts = {}
    prefill = ""
    for index, question in enumerate(QUESTIONS):
        canonical = canonicalize([{"role": "user", "content": question}], tools, Policy.SAFE)
        prompt = render_chat_prompt(core.tokenizer, canonical.messages, canonical.tools, choice)
        spec = forced_tool_call_spec(canonical.tools, choice)
        greedy = greedy_only or index % 2 == 0
        params = SamplingParams(temperature=0.0 if greedy else 0.8, seed=index, max_tokens=120,
                                stop=prompt.extra_stop)
        prompts[f"q{index}"] = (prompt.token_ids, params, spec.grammar)
        prefill = prompt.prefill
    return prompts, prefill


def test_tool_choice_required_always_gives_a_schema_valid_call(core) -> None:
    from gateway.tools import ToolCallParser

    prompts, prefill = forced_call_requests(core)
    results = run(core, prompts)
    assert len(results) == len(QUESTIONS)
    for request_id, (text, finish_reason) in results.items():
        assert finish_reason == "stop", (request_id, text)
        parser = ToolCallParser()
        parser.feed(prefill + text)
        parser.finish()
        [call] = parser.tool_calls
        assert call.name in TOOLS, text
        jsonschema.validate(json.loads(call.arguments), close_objects(TOOLS[call.name]))


def test_constrained_requests_speculate_with_grammar_checked_drafts(core) -> None:
    # Drafts of a constrained request are cut to what its grammar accepts and verified under one
    # mask per position: greedy outputs equal plain constrained decoding (float32), and the
    # repetitive JSON of tool calls gets drafts accepted.
    from engine.engine_core import EngineCore

    spec_core = EngineCore(build_engine_config(None, kv_cache_memory="128MiB", dtype="float32", num_threads=1,
                                               speculative="suffix", adaptive_speculation=False))
    prompts, _ = forced_call_requests(core, greedy_only=True)
    plain = run(core, prompts)
    # Twice: the second time the suffix index holds the first run's calls.
    for _ in range(2):
        assert run(spec_core, prompts) == plain
    stats = spec_core.stats()
    assert stats.spec_num_draft_tokens > 0 and stats.spec_num_accepted_tokens > 0


def test_json_schema_responses_always_validate(core) -> None:
    schema = {"$defs": {"item": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "price": {"type": "number", "minimum": 0}},
        "required": ["name", "price"]}},
        "type": "object", "properties": {
            "shop": {"type": "string", "maxLength": 30},
            "open": {"type": "boolean"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}},
        "required": ["shop", "open", "items"]}
    grammar = json_schema_grammar(schema, strict=True)
    questions = ["Describe a bakery as JSON.", "Invent a fruit stand.", "x"]
    requests = {}
    for index, question in enumerate(questions):
        text = core.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        params = SamplingParams(temperature=0.0 if index < 2 else 1.0, seed=index, max_tokens=160)
        requests[f"j{index}"] = (core.tokenizer.encode(text), params, grammar)
    results = run(core, requests)
    assert len(results) == len(questions)
    for request_id, (text, finish_reason) in results.items():
        assert finish_reason == "stop", (request_id, text)
        jsonschema.validate(json.loads(text), close_objects(schema))


def test_forced_tokens_leave_the_model_no_choice(core) -> None:
    """A grammar with one possible output yields it whatever the model prefers."""
    answer = "The quick brown fox jumps over the lazy dog, 42 times."
    grammar = json_schema_grammar({"const": answer})
    prompt = core.tokenizer.encode(core.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True))
    [(text, finish_reason)] = run(core, {"forced": (prompt, SamplingParams(temperature=1.0, seed=1, max_tokens=60),
                                                    grammar)}).values()
    assert json.loads(text) == answer and finish_reason == "stop"


def test_a_grammar_the_engine_cannot_compile_is_refused(core) -> None:
    delta = core.add_request(AddRequest("bad", [1, 2, 3], SamplingParams(), time.monotonic(),
                                        structured_output=StructuredOutputSpec("this is not a grammar")))
    assert delta is not None and delta.finish_reason == "error" and "response_format" in delta.error
    assert not core.has_unfinished_requests() and core.structured_output.num_requests == 0


def test_tiktoken_tokenizers_are_supported(tmp_path) -> None:
    from engine.model.resolve import resolve_model
    from tests.engine.model.test_tokenizer_tiktoken import _write_folder

    tokenizer = load_tokenizer(resolve_model(str(_write_folder(tmp_path / "llama3"))))
    manager = StructuredOutputManager(tokenizer, 320)  # the model's vocabulary may be larger than the tokenizer's
    manager.add_request("r", llguidance.LLMatcher.grammar_from_lark('start: "hello world"'))
    allowed = np.flatnonzero(np.unpackbits(manager.bitmask("r").view(np.uint8), bitorder="little")[:320])
    assert list(allowed) == [264]  # forced text: only its canonical first token, "hello"
    assert manager.accept_tokens("r", tokenizer.encode("hello world")) and manager.is_finished("r")
    allowed = np.flatnonzero(np.unpackbits(manager.bitmask("r").view(np.uint8), bitorder="little")[:320])
    assert set(allowed) <= set(tokenizer.eos_token_ids)  # complete: only end-of-generation ids
