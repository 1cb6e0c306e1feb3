"""Open-loop load: requests arrive at a fixed mean rate, whatever the server's speed.

    locust -f scenarios/locust/open_loop.py --headless -u 1 -r 1 -t 60s --host http://127.0.0.1:8000 \
        --arrival-rate 2 --mix ide=3,rag=2,chat=1

Closed-loop users (locustfile.py) slow down with the server, which hides queueing; here one
Locust user is an arrival process instead: exponential gaps of mean 1/--arrival-rate seconds,
each arrival a request of its own greenlet, so a slow server builds a queue as real traffic
would. Arrivals are single requests of the IDE, RAG and chat workloads, drawn by --mix weight
(agent sessions are conversations, inherently closed-loop; `agent` in --mix is ignored here).
At --max-in-flight outstanding requests an arrival is dropped and reported as a DROPPED row
(the client's limit, not the server's failure). Run it with -u 1: each user is one process.
"""

from __future__ import annotations

import random
import time
from typing import Any

import gevent
from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment

from scenarios.locust.http_stream import send_streamed
from scenarios.locust.load_hooks import RUN
from scenarios.locust.options import parse_mix
from scenarios.locust.workloads import ChatConversations, RagQuestions, TypingSession, WorkRequest


class ArrivalRateUser(FastHttpUser):
    """A Poisson arrival process over the single-request scenarios."""

    wait_time = constant(0)
    concurrency = 256  # connections the arrivals may hold at once
    network_timeout = 600.0
    connection_timeout = 30.0

    def on_start(self) -> None:
        RUN.ensure_ready(self.environment)
        options = self.environment.parsed_options
        key = RUN.next_user_key()
        if options.arrival_rate <= 0:
            raise ValueError(f"--arrival-rate must be > 0, got {options.arrival_rate}")
        self.rate = options.arrival_rate
        self.max_in_flight = options.max_in_flight
        self.rng = random.Random(f"arrivals-{RUN.seed}-{key}")
        weights = parse_mix(options.mix)
        self.kinds = [kind for kind in ("ide", "rag", "chat") if weights[kind] > 0]
        if not self.kinds:
            raise ValueError("open loop: --mix needs a positive weight for ide, rag or chat")
        self.weights = [weights[kind] for kind in self.kinds]
        self.typing = TypingSession(key, RUN.seed, prompt_scale=RUN.prompt_scale, cancel_share=RUN.ide_cancel_share,
                                    use_suffix=RUN.use_suffix, max_tokens=RUN.max_tokens(24))
        self.questions = RagQuestions(RUN.documents, key, RUN.seed, max_tokens=RUN.max_tokens(64))
        self.chats = ChatConversations(key, RUN.seed, max_tokens=RUN.max_tokens(96))
        self.in_flight: set[gevent.Greenlet] = set()

    def _next_request(self) -> WorkRequest:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        if kind == "ide":
            return self.typing.next_request(RUN.model)
        if kind == "rag":
            return self.questions.next_request(RUN.model)
        self.chats.new_conversation()  # an arrival is a new user: a fresh opener
        return self.chats.next_request(RUN.model)

    def _send(self, request: WorkRequest) -> None:
        try:
            send_streamed(self, request)
        finally:
            self.in_flight.discard(gevent.getcurrent())

    @task
    def arrive(self) -> None:
        time.sleep(self.rng.expovariate(self.rate))
        request = self._next_request()
        if len(self.in_flight) >= self.max_in_flight:
            self.environment.events.request.fire(request_type="DROPPED", name=request.scenario, response_time=0,
                                                 response_length=0, exception=None, context={})
            return
        self.in_flight.add(gevent.spawn(self._send, request))

    def on_stop(self) -> None:
        gevent.killall(list(self.in_flight), block=True, timeout=5)


@events.init.add_listener
def _check_options(environment: Environment, **_: Any) -> None:
    if environment.parsed_options is not None:
        parse_mix(environment.parsed_options.mix)  # a bad --mix fails before the run starts
