"""Closed-loop load scenarios against an OpenAI-compatible server (draftgate, llama.cpp, ...).

    locust -f scenarios/locust/locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.0.1:8000 \
        --csv runs/load/load --html runs/load/load.html                # the mix (weights below)
    locust -f scenarios/locust/locustfile.py ... AgentUser             # one scenario only

Each simulated user owns one workload of scenarios/locust/workloads.py and waits for each
answer before its next request (closed loop): agent tool loops (weight 4), IDE completion with
cancellations (3), RAG over shared documents (2), plain chat (1); `--mix agent=1,ide=1` changes
the weights (a scenario left out, or weighing 0, does not run). The open-loop variant with
Poisson arrivals is scenarios/locust/open_loop.py. Streaming figures (TTFT, chunk gaps, tokens/s)
are Locust rows of their own (see http_stream.py); options: load_hooks.py or `locust --help`.
"""

from __future__ import annotations

import random
import time

from typing import Any

from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment

from scenarios.locust.http_stream import send_streamed
from scenarios.locust.load_hooks import RUN
from scenarios.locust.options import parse_mix
from scenarios.locust.workloads import AgentConversations, ChatConversations, RagQuestions, TypingSession


class ScenarioUser(FastHttpUser):
    """A FastHttpUser with one connection, generous timeouts, and the run state resolved."""

    abstract = True
    scenario = ""  # its name in --mix
    wait_time = constant(0)  # each task sleeps its own pause: it depends on what came back
    concurrency = 1  # one connection per user, like one client process
    network_timeout = 600.0
    connection_timeout = 30.0

    def on_start(self) -> None:
        RUN.ensure_ready(self.environment)
        self.user_key = RUN.next_user_key()
        # Users that start together would send their first requests in one burst; spread them.
        time.sleep(random.Random(f"{RUN.seed}-{self.user_key}").uniform(0.0, 1.0))


class AgentUser(ScenarioUser):
    """An agent framework running tool-loop sessions, with subagents, one after another."""

    scenario = "agent"
    weight = 4

    def on_start(self) -> None:
        super().on_start()
        assert RUN.app is not None
        self.work = AgentConversations(RUN.app, self.user_key, RUN.seed, subagent_share=RUN.subagent_share,
                                       tool_seconds=RUN.tool_seconds, max_tokens=RUN.max_tokens(48))

    @task
    def turn(self) -> None:
        measurement = send_streamed(self, self.work.next_request(RUN.model))
        self.work.record(measurement.calls())
        time.sleep(self.work.pause_seconds())


class IDEUser(ScenarioUser):
    """A developer typing: completions at the cursor, a share cancelled by the next keystrokes."""

    scenario = "ide"
    weight = 3

    def on_start(self) -> None:
        super().on_start()
        self.work = TypingSession(self.user_key, RUN.seed, prompt_scale=RUN.prompt_scale,
                                  cancel_share=RUN.ide_cancel_share, use_suffix=RUN.use_suffix,
                                  max_tokens=RUN.max_tokens(24))

    @task
    def complete(self) -> None:
        request = self.work.next_request(RUN.model)
        send_streamed(self, request)
        time.sleep(self.work.pause_seconds(cancelled=request.cancel_after_chunks is not None))


class RAGUser(ScenarioUser):
    """Questions over a few shared long documents."""

    scenario = "rag"
    weight = 2

    def on_start(self) -> None:
        super().on_start()
        self.work = RagQuestions(RUN.documents, self.user_key, RUN.seed, max_tokens=RUN.max_tokens(64))

    @task
    def ask(self) -> None:
        send_streamed(self, self.work.next_request(RUN.model))
        time.sleep(self.work.pause_seconds())


class ChatUser(ScenarioUser):
    """Short conversations of one to three turns."""

    scenario = "chat"
    weight = 1

    def on_start(self) -> None:
        super().on_start()
        self.work = ChatConversations(self.user_key, RUN.seed, max_tokens=RUN.max_tokens(96))

    @task
    def chat(self) -> None:
        measurement = send_streamed(self, self.work.next_request(RUN.model))
        self.work.record(measurement.text)
        time.sleep(self.work.pause_seconds())


@events.init.add_listener
def _apply_mix(environment: Environment, **_: Any) -> None:
    """--mix sets the weights of the user classes; those weighing 0 are removed before the start."""
    options = environment.parsed_options
    if options is None:
        return
    weights = parse_mix(options.mix)
    for user_class in environment.user_classes:
        scenario = getattr(user_class, "scenario", "")
        if scenario in weights:
            user_class.weight = weights[scenario]
    environment.user_classes[:] = [cls for cls in environment.user_classes if cls.weight > 0 or cls.fixed_count > 0]
