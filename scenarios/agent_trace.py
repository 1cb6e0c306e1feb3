"""Synthetic agent tool-loop sessions, shaped the way real agent frameworks send them.

Every session has its own long system prompt (a project brief), its own tools and task. Each
request of a session is built fresh, as frameworks do it, and breaks the byte-level prefix in
the usual ways:

- the system prompt is stamped per request: a Claude-Code-style billing header with a nonce,
  the current time (ISO 8601), a request id (UUID);
- the tool list comes in a different order, and every JSON schema with its keys shuffled
  (frameworks build them from dicts whose order depends on registration);
- earlier tool calls are sent back with their arguments re-serialized (keys shuffled, compact
  separators), as a framework does after parsing them into its own objects;
- the history grows by one assistant tool call and one tool result per turn.

Pure standard library and deterministic for a seed: the same seed gives the same sessions,
whatever replays them. Nothing here imports the product.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

_WORDS = (
    "service cache request latency queue schema index shard replica token batch stream prefix tenant quota "
    "deploy rollback metric alert budget window retry backoff timeout parser config module library router "
    "gateway engine kernel tensor buffer socket thread worker pool limit policy review ticket branch commit "
    "release audit report cluster region storage bucket object record column table migration contract client"
).split()
_CITIES = ["Oslo", "Lima", "Kyoto", "Cairo", "Quito", "Perth", "Turin", "Hanoi"]

_TOOL_SPECS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("read_file", "Read a file of the repository and return its text.",
     {"path": {"type": "string", "description": "Path relative to the repository root."},
      "max_lines": {"type": "integer", "description": "Most lines to return.", "minimum": 1, "maximum": 400}}),
    ("search_code", "Search the repository for a pattern and list matching lines.",
     {"pattern": {"type": "string", "description": "A regular expression."},
      "glob": {"type": "string", "description": "Only files matching this glob."}}),
    ("run_tests", "Run the test suite, or the tests matching a selector.",
     {"selector": {"type": "string", "description": "A test file or a -k expression."},
      "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 900}}),
    ("get_weather", "Current weather for a city.",
     {"city": {"type": "string", "description": "City name."},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
    ("query_metrics", "Query a time series of the monitoring system.",
     {"metric": {"type": "string", "description": "Metric name."},
      "window_minutes": {"type": "integer", "minimum": 1, "maximum": 1440},
      "labels": {"type": "object", "description": "Label filters.", "properties": {
          "service": {"type": "string"}, "region": {"type": "string"}}}}),
    ("create_ticket", "Open a ticket in the issue tracker.",
     {"title": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "medium", "high"]},
      "body": {"type": "string", "description": "Markdown body."}}),
)


def _sentence(rng: random.Random, num_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(num_words)]
    return " ".join(words).capitalize() + "."


def _shuffled(value: Any, rng: random.Random) -> Any:
    """A copy of a JSON value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@dataclass
class AgentSession:
    """One agent conversation: its fixed parts, and the per-request noise of its framework."""

    session_id: str
    project_brief: str  # the stable body of the system prompt
    tools: list[dict[str, Any]]
    task: str
    rng: random.Random
    clock: float = 1_790_000_000.0  # the framework's wall clock, advanced per request
    history: list[dict[str, Any]] = field(default_factory=list)  # assistant calls and tool results

    def system_prompt(self) -> str:
        """The system prompt as the framework stamps it for one request."""
        self.clock += self.rng.uniform(2.0, 9.0)
        seconds = int(self.clock)
        stamp = _iso(seconds) + f".{self.rng.randrange(1000):03d}Z"
        nonce = f"{self.rng.getrandbits(40):010x}"
        return (f"x-anthropic-billing-header: cc_version=1.0.{self.rng.randrange(90)}; cc_entrypoint=cli; "
                f"cch={nonce};\n"
                f"You are an autonomous engineering agent. Current time: {stamp}. "
                f"Request ID: {uuid.UUID(int=self.rng.getrandbits(128))}.\n\n"
                f"{self.project_brief}")

    def request_body(self, model: str, max_tokens: int) -> dict[str, Any]:
        """The next request: fresh stamps, reshuffled tools and keys, the history so far."""
        tools = [_shuffled(tool, self.rng) for tool in self.tools]
        self.rng.shuffle(tools)
        messages = [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": self.task}]
        for message in self.history:
            if message["role"] == "assistant":
                calls = [{"id": call["id"], "type": "function",
                          "function": {"name": call["name"],
                                       "arguments": json.dumps(_shuffled(call["arguments"], self.rng),
                                                               separators=(",", ":"))}}
                         for call in message["calls"]]
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            else:
                messages.append(message)
        return {"model": model, "messages": messages, "tools": tools, "tool_choice": "required",
                "max_tokens": max_tokens, "temperature": 0}

    def record_turn(self, calls: list[tuple[str, str, str]]) -> None:
        """Adds the model's calls (id, name, arguments text) and a tool result for each."""
        parsed = []
        for call_id, name, arguments in calls:
            try:
                value = json.loads(arguments)
            except ValueError:
                value = {}
            parsed.append({"id": call_id, "name": name, "arguments": value if isinstance(value, dict) else {}})
        self.history.append({"role": "assistant", "calls": parsed})
        for call in parsed:
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": self.tool_result(call["name"])})

    def tool_result(self, name: str) -> str:
        rows = [{"line": self.rng.randrange(1, 900), "text": _sentence(self.rng, 6)} for _ in range(3)]
        return json.dumps({"tool": name, "ok": True, "results": rows})


def _iso(seconds: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def make_sessions(num_sessions: int, seed: int = 0, brief_sentences: int = 110) -> list[AgentSession]:
    """`num_sessions` distinct sessions (own brief, own tools and task), deterministic per seed."""
    sessions = []
    for index in range(num_sessions):
        rng = random.Random(f"{seed}-{index}")
        paragraphs = []
        for section in ("Project", "Conventions", "Architecture", "Operations"):
            sentences = " ".join(_sentence(rng, rng.randrange(8, 14)) for _ in range(brief_sentences // 4))
            paragraphs.append(f"## {section}\n{sentences}")
        brief = "\n\n".join(paragraphs)
        specs = rng.sample(_TOOL_SPECS, 4)
        tools = [{"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": [next(iter(properties))]}}}
            for name, description, properties in specs]
        task = (f"Investigate why the {rng.choice(_WORDS)} {rng.choice(_WORDS)} is slow in "
                f"{rng.choice(_CITIES)} and fix it. Use the tools.")
        sessions.append(AgentSession(f"agent-{seed}-{index}", brief, tools, task, rng))
    return sessions
