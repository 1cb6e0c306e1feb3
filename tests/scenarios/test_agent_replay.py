"""The agent trace generator and the replay driver (scenarios/), the latter against a real server."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from scenarios.agent_trace import make_sessions
from scenarios.replay_agents import DOCS_BEGIN, DOCS_END, PolicyReport, TurnResult, markdown, replay, write_docs
from tests.gateway.conftest import MODEL, Server, server  # noqa: F401 - the shared server fixture


def test_sessions_are_deterministic_and_distinct() -> None:
    first, second = make_sessions(2, seed=3)
    again = make_sessions(2, seed=3)[0]
    assert first.project_brief == again.project_brief and first.tools == again.tools
    assert first.project_brief != second.project_brief


def test_every_request_breaks_the_byte_prefix_like_a_framework() -> None:
    [session] = make_sessions(1, seed=1)
    one = session.request_body(MODEL, 16)
    two = session.request_body(MODEL, 16)
    system_one, system_two = one["messages"][0]["content"], two["messages"][0]["content"]
    assert system_one.startswith("x-anthropic-billing-header:") and system_one != system_two
    assert system_one.split("\n\n", 1)[1] == system_two.split("\n\n", 1)[1]  # the brief itself is stable
    # Same tools, other order or other key order.
    assert sorted(json.dumps(t, sort_keys=True) for t in one["tools"]) == sorted(
        json.dumps(t, sort_keys=True) for t in two["tools"])
    assert json.dumps(one["tools"]) != json.dumps(two["tools"])


def test_the_history_grows_with_reserialized_calls_and_tool_results() -> None:
    [session] = make_sessions(1, seed=2)
    session.request_body(MODEL, 16)
    session.record_turn([("call_1", "read_file", '{"path": "a.py", "max_lines": 10}')])
    body = session.request_body(MODEL, 16)
    assistant, tool = body["messages"][2], body["messages"][3]
    assert assistant["tool_calls"][0]["function"]["name"] == "read_file"
    arguments = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"path": "a.py", "max_lines": 10} and ", " not in arguments  # compact
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_1" and json.loads(tool["content"])["ok"]


def test_the_report_counts_turns_two_and_later() -> None:
    turns = [TurnResult("s", 1, 1000, 0, 2.0, "new-session"), TurnResult("s", 2, 1100, 990, 0.2, "volatile-note"),
             TurnResult("s", 3, 1200, 1100, 0.3, "volatile-note"), TurnResult("t", 1, 900, 0, 1.8, "new-session"),
             TurnResult("t", 2, 1000, 100, 1.5, "system")]
    report = PolicyReport("safe", turns)
    assert report.hit_rate == (990 + 1100 + 100) / (1100 + 1200 + 1000)
    assert report.first_ttft == 1.9 and report.later_ttft == 0.3
    assert report.diverged_counts() == {"volatile-note": 2, "system": 1}
    args = SimpleNamespace(seed=0, sessions=2, turns=3, max_tokens=48, tool_seconds=1.0, server_arg=["--x"])
    text = markdown([report, PolicyReport("off", turns)], args, "python -m scenarios.replay_agents")
    assert "| safe | **66.4%** |" in text and "Command: `python -m scenarios.replay_agents`" in text


def test_write_docs_replaces_only_its_own_section(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(f"# Benchmarks\n\nkeep me\n\n{DOCS_BEGIN}\nold\n{DOCS_END}\n\ntail\n")
    write_docs("new table", path)
    assert path.read_text() == f"# Benchmarks\n\nkeep me\n\n{DOCS_BEGIN}\nnew table\n{DOCS_END}\n\ntail\n"


def test_a_short_replay_through_the_server_reuses_the_prefix(server: Server) -> None:  # noqa: F811
    sessions = make_sessions(1, seed=9, brief_sentences=24)
    results = replay(server.base_url, sessions, num_turns=2, tool_seconds=0.1, model=MODEL, max_tokens=40,
                     api_key=server.api_key)
    first, second = results
    assert (first.turn, second.turn) == (1, 2) and first.diverged == "new-session"
    # The previous note is pinned where it stood: the second turn extends the first exactly.
    assert second.diverged == "none"
    assert second.cached_tokens >= first.prompt_tokens // 16 * 16 and first.calls
