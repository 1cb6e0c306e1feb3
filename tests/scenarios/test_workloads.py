"""The request builders of the load scenarios (deterministic, shaped like the traffic they model)."""

from __future__ import annotations

import json

import pytest

from scenarios.locust.options import parse_mix, parse_range
from scenarios.locust.workloads import (CHAT_PATH, COMPLETIONS_PATH, SESSION_HEADER, AgentApp, AgentConversations,
                                        ChatConversations, RagQuestions, TypingSession, make_documents)

MODEL = "m"


def _system_body(body: dict) -> str:
    return body["messages"][0]["content"].split("\n\n", 1)[1]


def test_agent_sessions_share_the_system_prompt_and_stamp_it_per_request() -> None:
    app = AgentApp.make(seed=3)
    first = AgentConversations(app, "u1", seed=3).next_request(MODEL)
    second = AgentConversations(app, "u2", seed=3).next_request(MODEL)
    assert first.scenario == "agent" and first.path == CHAT_PATH and first.label == "agent t1"
    assert first.body["stream"] and first.body["stream_options"] == {"include_usage": True}
    # One product, many users: the same prompt body and tools, different stamps and sessions.
    assert _system_body(first.body) == _system_body(second.body) == app.brief
    assert first.body["messages"][0]["content"] != second.body["messages"][0]["content"]
    assert first.headers[SESSION_HEADER] != second.headers[SESSION_HEADER]
    assert {t["function"]["name"] for t in first.body["tools"]} == {t["function"]["name"] for t in app.tools}


def test_agent_turns_grow_the_history_and_sessions_end() -> None:
    app = AgentApp.make(seed=1)
    work = AgentConversations(app, "u1", seed=1, turns_per_session=(2, 2), subagent_share=0.0)
    one = work.next_request(MODEL)
    work.record([("call_a", "read_file", '{"path": "x.py"}')])
    two = work.next_request(MODEL)
    assert (one.turn, two.turn, two.label) == (1, 2, "agent t2")
    assert len(two.body["messages"]) == len(one.body["messages"]) + 2  # the call and its result
    assert two.body["messages"][2]["tool_calls"][0]["id"] == "call_a"
    work.record([])  # no call parsed: a placeholder keeps the loop going
    three = work.next_request(MODEL)
    assert three.turn == 1 and three.headers[SESSION_HEADER] != one.headers[SESSION_HEADER]


def test_a_subagent_runs_its_own_session_and_reports_back_as_the_tool_result() -> None:
    app = AgentApp.make(seed=2)
    work = AgentConversations(app, "u1", seed=2, subagent_share=1.0)
    parent = work.next_request(MODEL)
    work.record([("call_p", "delegate_task", '{"task": "find it"}')])
    sub = work.next_request(MODEL)
    assert sub.scenario == "subagent" and sub.headers[SESSION_HEADER].startswith(parent.headers[SESSION_HEADER])
    assert _system_body(sub.body) == app.subagent_brief
    for _ in range(work.subagent_turns):
        work.record([("call_s", "search_code", '{"pattern": "x"}')])
    back = work.next_request(MODEL)
    assert back.scenario == "agent" and back.turn == 2
    result = json.loads(back.body["messages"][3]["content"])
    assert result["subagent"] == sub.headers[SESSION_HEADER] and result["findings"]


def test_same_seed_same_requests() -> None:
    def sequence() -> list[str]:
        work = AgentConversations(AgentApp.make(seed=5), "u1", seed=5)
        bodies = []
        for _ in range(4):
            bodies.append(json.dumps(work.next_request(MODEL).body))
            work.record([("c", "read_file", "{}")])
        return bodies

    assert sequence() == sequence()


def test_typing_grows_the_prefix_and_spreads_cancellations_evenly() -> None:
    work = TypingSession("u1", seed=4, cancel_share=0.25)
    requests = [work.next_request(MODEL) for _ in range(8)]
    prompts = [request.body["prompt"] for request in requests]
    assert all(r.path == COMPLETIONS_PATH and "suffix" not in r.body and r.body["stop"] == ["\n\n"] for r in requests)
    # Each prompt extends the previous one (the developer types on): a prefix-cache friendly stream.
    assert all(later.startswith(earlier) and len(later) > len(earlier) for earlier, later in zip(prompts, prompts[1:]))
    assert [r.cancel_after_chunks is not None for r in requests] == [True, False, False, False] * 2
    assert all(1 <= r.cancel_after_chunks <= 3 for r in requests if r.cancel_after_chunks)


def test_fim_requests_carry_the_code_after_the_cursor() -> None:
    work = TypingSession("u1", seed=4, use_suffix=True, cancel_share=0.0)
    request = work.next_request(MODEL)
    assert "stop" not in request.body and request.cancel_after_chunks is None
    assert (request.body["prompt"] + request.body["suffix"]) in work.code
    with pytest.raises(ValueError, match="cancel_share"):
        TypingSession("u1", seed=4, cancel_share=1.5)


def test_rag_questions_share_long_documents_at_the_front() -> None:
    documents = make_documents(seed=1)
    assert len(documents) == 3 and all(len(d.text) > 2500 for d in documents)
    users = [RagQuestions(documents, f"u{i}", seed=1) for i in range(4)]
    requests = [user.next_request(MODEL) for user in users for _ in range(3)]
    contents = [r.body["messages"][1]["content"] for r in requests]
    assert all(any(c.startswith(f"Document:\n{d.text}\n\nQuestion: ") for d in documents) for c in contents)
    # A question names a fact its document states.
    for content in contents:
        document_text, question = content.split("\n\nQuestion: ")
        metric, city = question[len("What was the "):].split(",")[0].rsplit(" in ", 1)
        assert f"In {city} the {metric} was set to" in document_text
    assert len(set(contents)) > 1


def test_chat_conversations_follow_up_on_the_answer() -> None:
    chat = ChatConversations("u1", seed=0)
    chat.turns = 3
    first = chat.next_request(MODEL)
    chat.record("An answer.")
    second = chat.next_request(MODEL)
    assert (first.turn, second.turn) == (1, 2)
    assert second.body["messages"][1] == {"role": "assistant", "content": "An answer."}
    chat.record("More.")
    chat.next_request(MODEL)
    chat.record("Done.")  # the third turn ends the conversation
    assert chat.next_request(MODEL).turn == 1


def test_prompt_scale_shrinks_every_long_text() -> None:
    assert len(AgentApp.make(0, prompt_scale=0.25).brief) < len(AgentApp.make(0).brief) / 2
    assert len(make_documents(0, prompt_scale=0.25)[0].text) < len(make_documents(0)[0].text) / 2


def test_option_parsing_names_the_option() -> None:
    assert parse_mix("agent=1, ide=2") == {"agent": 1, "ide": 2, "rag": 0, "chat": 0}
    assert parse_range("0.5,1.5", "--tool-seconds") == (0.5, 1.5)
    for bad, message in (("robot=1", "unknown scenario"), ("agent=x", "integer"), ("agent=0", "positive"),
                         ("agent=-1", ">= 0")):
        with pytest.raises(ValueError, match=message):
            parse_mix(bad)
    with pytest.raises(ValueError, match="--tool-seconds"):
        parse_range("2,1", "--tool-seconds")
