"""The four traffic shapes of the load scenarios, as plain request builders.

Each workload is a small state machine owned by one simulated user: `next_request()` gives the
request to send, `record()` takes what came back, `pause_seconds()` says how long the user waits
before the next one (tool time, typing, reading). Deterministic for a seed, pure standard
library, free of Locust and of the product, so tests drive them directly and the same
sequences reach every system a benchmark compares.

- agent: tool-loop sessions of an agent framework (scenarios/agent_trace.py's AgentSession: a
  system prompt stamped per request with a nonce, a timestamp and a request id; tools and JSON
  keys reshuffled; the history growing by a call and a result per turn). Every session of one
  run shares the *same* agent system prompt and tools, like the users of one agent product; a
  share of turns hand a sub-task to a subagent, a session of its own with another shared
  prompt, whose findings come back as the tool result.
- ide: code completion while typing: the prefix is the file up to the cursor, which moves a few
  characters per request; `suffix` (fill-in-the-middle) only when the server supports it; a
  share of the requests is cancelled after the first tokens, as new keystrokes arrive.
- rag: questions over a few shared long documents, the document first and the question last.
- chat: short conversations of one to three turns.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

from scenarios.agent_trace import AgentSession, make_sessions

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
SESSION_HEADER = "x-session-id"  # draftgate keys its agent sessions on it; other servers ignore it

_WORDS = ("cache queue shard replica token batch stream prefix tenant quota deploy metric budget window "
          "retry timeout parser config module router gateway engine kernel buffer socket worker pool "
          "limit policy ticket branch release cluster region storage bucket record column table").split()
_CITIES = ("Oslo", "Lima", "Kyoto", "Cairo", "Quito", "Perth", "Turin", "Hanoi", "Accra", "Bergen")


@dataclass(frozen=True)
class WorkRequest:
    """One HTTP request of a scenario, with what the measurement needs to file it."""

    scenario: str  # "agent", "subagent", "ide", "rag" or "chat"
    label: str  # the row it is reported under, e.g. "agent t2"
    path: str  # CHAT_PATH or COMPLETIONS_PATH
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    turn: int = 1  # 1-based turn in its conversation
    cancel_after_chunks: int | None = None  # close the stream after this many output frames


def _streamed(body: dict[str, Any]) -> dict[str, Any]:
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def _scaled(count: int, scale: float) -> int:
    return max(1, round(count * scale))


# ---- agent tool loops -------------------------------------------------------------------------

_SUBAGENT_BRIEF_SENTENCES = 16
_DELEGATE_TOOL = {"type": "function", "function": {
    "name": "delegate_task", "description": "Hand a focused sub-task to a subagent and get its findings.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string", "description": "What to find."}},
                   "required": ["task"]}}}


@dataclass(frozen=True)
class AgentApp:
    """What every session of one agent product shares: its system prompt body and tools."""

    brief: str
    tools: tuple[dict[str, Any], ...]
    subagent_brief: str
    subagent_tools: tuple[dict[str, Any], ...]

    @classmethod
    def make(cls, seed: int, prompt_scale: float = 1.0) -> AgentApp:
        # make_sessions writes brief_sentences // 4 sentences in each of 4 sections.
        main = make_sessions(1, seed=seed, brief_sentences=max(4, _scaled(48, prompt_scale)))[0]
        helper = make_sessions(1, seed=seed + 7919,
                               brief_sentences=max(4, _scaled(_SUBAGENT_BRIEF_SENTENCES, prompt_scale)))[0]
        return cls(main.project_brief, (*main.tools, _DELEGATE_TOOL), "You are a code-search subagent.\n\n"
                   + helper.project_brief, tuple(helper.tools[:2]))


class AgentConversations:
    """One user's agent sessions, one after another: turns, tool pauses, subagents."""

    def __init__(self, app: AgentApp, user_key: str, seed: int, turns_per_session: tuple[int, int] = (3, 6),
                 subagent_share: float = 0.2, tool_seconds: tuple[float, float] = (0.5, 1.5),
                 max_tokens: int = 48) -> None:
        self.app = app
        self.user_key = user_key
        self.rng = random.Random(f"agent-{seed}-{user_key}")
        self.turns_per_session = turns_per_session
        self.subagent_share = subagent_share
        self.tool_seconds = tool_seconds
        self.max_tokens = max_tokens
        self.num_sessions = 0
        self._start_session()

    def _session(self, session_id: str, brief: str, tools: tuple[dict[str, Any], ...], task: str) -> AgentSession:
        return AgentSession(session_id, brief, list(tools), task, random.Random(self.rng.getrandbits(64)))

    def _start_session(self) -> None:
        self.num_sessions += 1
        task = (f"Investigate why the {self.rng.choice(_WORDS)} {self.rng.choice(_WORDS)} is slow in "
                f"{self.rng.choice(_CITIES)} and fix it. Use the tools.")
        self.session = self._session(f"{self.user_key}-s{self.num_sessions}", self.app.brief, self.app.tools, task)
        self.turn = 1
        self.session_turns = self.rng.randint(*self.turns_per_session)
        self.subagent: AgentSession | None = None
        self.subagent_turn = 0
        self.subagent_turns = 0

    def next_request(self, model: str) -> WorkRequest:
        if self.subagent is not None:
            body = self.subagent.request_body(model, self.max_tokens)
            return WorkRequest("subagent", "subagent", CHAT_PATH, _streamed(body),
                               {SESSION_HEADER: self.subagent.session_id}, self.subagent_turn)
        body = self.session.request_body(model, self.max_tokens)
        label = f"agent t{self.turn}" if self.turn < 5 else "agent t5+"
        return WorkRequest("agent", label, CHAT_PATH, _streamed(body), {SESSION_HEADER: self.session.session_id},
                           self.turn)

    def record(self, calls: list[tuple[str, str, str]]) -> None:
        """The tool calls of the last answer (id, name, arguments); a placeholder call when none."""
        if self.subagent is not None:
            self.subagent.record_turn(calls or [(f"call_s{self.subagent_turn}", "search_code", "{}")])
            self.subagent_turn += 1
            if self.subagent_turn > self.subagent_turns:
                # The subagent's findings become the result of the parent's delegating call.
                findings = [message["content"] for message in self.subagent.history if message["role"] == "tool"]
                self.session.history[-1]["content"] = json.dumps({"subagent": self.subagent.session_id,
                                                                  "findings": findings[-2:]})
                self.subagent = None
                self._advance_parent()
            return
        self.session.record_turn(calls or [(f"call_{self.turn}", "read_file", "{}")])
        if self.rng.random() < self.subagent_share:
            self.subagent = self._session(f"{self.session.session_id}-sub{self.turn}", self.app.subagent_brief,
                                          self.app.subagent_tools,
                                          f"Find where the {self.rng.choice(_WORDS)} is configured; cite file and line.")
            self.subagent_turn = 1
            self.subagent_turns = self.rng.randint(1, 2)
            return
        self._advance_parent()

    def _advance_parent(self) -> None:
        self.turn += 1
        if self.turn > self.session_turns:
            self._start_session()

    def pause_seconds(self) -> float:
        """The tool runs (a subagent's tools too) before the next turn."""
        return self.rng.uniform(*self.tool_seconds)


# ---- IDE completion -----------------------------------------------------------------------------

def make_code_file(rng: random.Random, num_functions: int) -> str:
    """A plausible Python module: a docstring, imports, a class with methods."""
    noun = rng.choice(_WORDS)
    lines = [f'"""The {noun} {rng.choice(_WORDS)} service of {rng.choice(_CITIES)}."""', "",
             "from __future__ import annotations", "", "import dataclasses", "import logging", "",
             "logger = logging.getLogger(__name__)", "", "", "@dataclasses.dataclass",
             f"class {noun.capitalize()}{rng.choice(_WORDS).capitalize()}:",
             f'    """Keeps the {noun} {rng.choice(_WORDS)} within its {rng.choice(_WORDS)}."""', "",
             "    limit: int", "    name: str", "    items: list[int] = dataclasses.field(default_factory=list)", ""]
    for _ in range(num_functions):
        verb, thing = rng.choice(("count", "merge", "check", "drop", "split", "scale")), rng.choice(_WORDS)
        threshold = rng.randrange(2, 90)
        lines += [f"    def {verb}_{thing}(self, values: list[int]) -> int:",
                  f'        """{verb.capitalize()} the {thing} values above {threshold}."""',
                  "        total = 0", "        for value in values:",
                  f"            if value > {threshold} and value < self.limit:",
                  "                total += value", "            else:",
                  f'                logger.debug("skip %s in %s", value, self.name)', "        return total", ""]
    return "\n".join(lines) + "\n"


class TypingSession:
    """A developer typing through a file; each request completes at the cursor.

    Cancellations are spread evenly rather than drawn: request i is cancelled when
    ceil((i + 1) * share) > ceil(i * share), so a run of n requests cancels about n * share of
    them whatever the seed, starting with the first.
    """

    def __init__(self, user_key: str, seed: int, prompt_scale: float = 1.0, cancel_share: float = 0.3,
                 use_suffix: bool = False, max_tokens: int = 24, typing_seconds: tuple[float, float] = (0.2, 0.8)) -> None:
        if not 0.0 <= cancel_share <= 1.0:
            raise ValueError(f"cancel_share must be within [0, 1], got {cancel_share}")
        self.rng = random.Random(f"ide-{seed}-{user_key}")
        self.user_key = user_key
        self.prompt_scale = prompt_scale
        self.cancel_share = cancel_share
        self.use_suffix = use_suffix
        self.max_tokens = max_tokens
        self.typing_seconds = typing_seconds
        self.num_requests = 0
        self._open_file()

    def _open_file(self) -> None:
        self.code = make_code_file(self.rng, _scaled(6, self.prompt_scale))
        # Start somewhere in the first third; type through to the end, then open another file.
        self.cursor = self.rng.randrange(len(self.code) // 6, len(self.code) // 3)

    def next_request(self, model: str) -> WorkRequest:
        index = self.num_requests
        self.num_requests += 1
        cancelled = math.ceil((index + 1) * self.cancel_share) > math.ceil(index * self.cancel_share)
        body: dict[str, Any] = {"model": model, "prompt": self.code[: self.cursor], "max_tokens": self.max_tokens,
                                "temperature": 0}
        if self.use_suffix:
            body["suffix"] = self.code[self.cursor: self.cursor + 400]
        else:
            body["stop"] = ["\n\n"]  # without the suffix, stop where a block ends
        request = WorkRequest("ide", "ide", COMPLETIONS_PATH, _streamed(body), turn=index + 1,
                              cancel_after_chunks=self.rng.randint(1, 3) if cancelled else None)
        # The next keystrokes: the developer types the file's own next characters.
        self.cursor += self.rng.randint(3, 12)
        if self.cursor >= len(self.code) - 1:
            self._open_file()
        return request

    def pause_seconds(self, cancelled: bool) -> float:
        # A cancelled request was overtaken by keystrokes: the next one follows almost at once.
        low, high = self.typing_seconds
        return self.rng.uniform(0.0, low) if cancelled else self.rng.uniform(low, high)


# ---- RAG over shared documents --------------------------------------------------------------------

@dataclass(frozen=True)
class Document:
    title: str
    text: str
    facts: tuple[tuple[str, str, int], ...]  # (metric, city, value) stated in the text


def make_documents(seed: int, num_documents: int = 3, prompt_scale: float = 1.0) -> list[Document]:
    """A few long reference documents every RAG user asks about (the shared prefixes)."""
    rng = random.Random(f"rag-{seed}")
    documents = []
    for number in range(num_documents):
        facts, paragraphs = [], []
        for section in range(_scaled(8, prompt_scale)):
            sentences = []
            for _ in range(6):
                metric, city, value = f"{rng.choice(_WORDS)} {rng.choice(_WORDS)}", rng.choice(_CITIES), rng.randrange(2, 999)
                facts.append((metric, city, value))
                sentences.append(f"In {city} the {metric} was set to {value} after the {rng.choice(_WORDS)} review.")
            paragraphs.append(f"### Section {section + 1}\n" + " ".join(sentences))
        title = f"Operations handbook {number + 1}: {rng.choice(_WORDS)} and {rng.choice(_WORDS)}"
        documents.append(Document(title, f"# {title}\n\n" + "\n\n".join(paragraphs), tuple(facts)))
    return documents


class RagQuestions:
    """A user asking questions about the shared documents, one request each."""

    SYSTEM = "Answer the question using only the document. Quote the numbers you use."

    def __init__(self, documents: list[Document], user_key: str, seed: int, max_tokens: int = 64,
                 reading_seconds: tuple[float, float] = (0.5, 2.0)) -> None:
        self.documents = documents
        self.rng = random.Random(f"rag-{seed}-{user_key}")
        self.max_tokens = max_tokens
        self.reading_seconds = reading_seconds

    def next_request(self, model: str) -> WorkRequest:
        document = self.rng.choice(self.documents)
        metric, city, _ = self.rng.choice(document.facts)
        question = f"What was the {metric} in {city}, and what review set it?"
        body = {"model": model, "max_tokens": self.max_tokens, "temperature": 0, "messages": [
            {"role": "system", "content": self.SYSTEM},
            {"role": "user", "content": f"Document:\n{document.text}\n\nQuestion: {question}"}]}
        return WorkRequest("rag", "rag", CHAT_PATH, _streamed(body))

    def pause_seconds(self) -> float:
        return self.rng.uniform(*self.reading_seconds)


# ---- plain chat -------------------------------------------------------------------------------------

_CHAT_OPENERS = ("Explain what a {a} {b} is in two sentences.", "Write a short poem about a {a}.",
                 "Give three tips for tuning a {a} {b}.", "What is the difference between a {a} and a {b}?")
_CHAT_FOLLOW_UPS = ("Make it shorter.", "Give an example.", "Why does that matter?")


class ChatConversations:
    """Short conversations: an opener and up to two follow-ups, each seeing the answers so far."""

    def __init__(self, user_key: str, seed: int, max_tokens: int = 96,
                 reading_seconds: tuple[float, float] = (0.5, 2.0)) -> None:
        self.rng = random.Random(f"chat-{seed}-{user_key}")
        self.max_tokens = max_tokens
        self.reading_seconds = reading_seconds
        self.new_conversation()

    def new_conversation(self) -> None:
        opener = self.rng.choice(_CHAT_OPENERS).format(a=self.rng.choice(_WORDS), b=self.rng.choice(_WORDS))
        self.messages: list[dict[str, str]] = [{"role": "user", "content": opener}]
        self.turns = self.rng.randint(1, 3)

    def next_request(self, model: str) -> WorkRequest:
        body = {"model": model, "messages": [dict(message) for message in self.messages],
                "max_tokens": self.max_tokens, "temperature": 0}
        turn = (len(self.messages) + 1) // 2
        return WorkRequest("chat", "chat", CHAT_PATH, _streamed(body), turn=turn)

    def record(self, text: str) -> None:
        if (len(self.messages) + 1) // 2 >= self.turns:
            self.new_conversation()
            return
        self.messages += [{"role": "assistant", "content": text or "..."},
                          {"role": "user", "content": self.rng.choice(_CHAT_FOLLOW_UPS)}]

    def pause_seconds(self) -> float:
        return self.rng.uniform(*self.reading_seconds)
