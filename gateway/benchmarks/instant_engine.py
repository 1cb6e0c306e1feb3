"""An engine that answers instantly, behind the real EngineClient interface (benchmark only).

It is what the gateway-overhead benchmark puts behind the gateway (and behind LiteLLM) so that
everything measured is HTTP and gateway work: every request gets the same fixed completion, one
delta per token, with a scheduler checkpoint between deltas and no model anywhere. It uses the
real tokenizer, so the gateway still renders and tokenizes prompts as it does in production.

    python -m gateway.benchmarks.instant_engine --port 8100    # the gateway with this engine
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.protocol import EngineStats, RequestDelta
from engine.sampling_params import SamplingParams
from gateway.config import GatewayConfig

INSTANT_MODEL_NAME = "instant"
COMPLETION_TEXT = " The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun."


class InstantEngineClient:
    """A real EngineClient whose every request yields the same tokens at once."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int = 8192) -> None:
        self.tokenizer = tokenizer
        self.model_name = INSTANT_MODEL_NAME
        self.max_model_len = max_model_len
        self.vocab_size = tokenizer.vocab_size
        self._token_ids = tokenizer.encode(COMPLETION_TEXT)
        self._texts = [tokenizer.decode([token_id]) for token_id in self._token_ids]
        self._num_requests = 0
        self._num_tokens = 0

    @property
    def is_alive(self) -> bool:
        return True

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str,
                       priority: int = 0, cache_salt: str | None = None) -> AsyncIterator[RequestDelta]:
        num_tokens = min(params.max_tokens or len(self._token_ids), len(self._token_ids))
        self._num_requests += 1
        for index in range(num_tokens):
            await anyio.lowlevel.checkpoint()  # one scheduler turn per token, like a real stream
            last = index == num_tokens - 1
            self._num_tokens += 1
            yield RequestDelta(
                request_id, new_token_ids=[self._token_ids[index]], text=self._texts[index],
                finish_reason=("length" if num_tokens < len(self._token_ids) else "stop") if last else None,
                num_prompt_tokens=len(prompt_token_ids) if index == 0 else 0,
            )

    async def abort(self, request_ids: list[str]) -> None:
        return None

    async def get_stats(self) -> EngineStats:
        return EngineStats(num_running=0, num_waiting=0, kv_cache_usage=0.0, num_blocks=0, prefix_cache_queries=0,
                           prefix_cache_hits=0, num_preemptions=0, num_steps=self._num_requests,
                           num_prompt_tokens=0, num_generation_tokens=self._num_tokens, last_step_seconds=0.0,
                           mean_step_seconds=0.0)


def instant_engine_factory(config: GatewayConfig):
    """An EngineFactory for create_app: the instant engine with the embedded model's tokenizer."""

    @asynccontextmanager
    async def start() -> AsyncIterator[InstantEngineClient]:
        tokenizer = await anyio.to_thread.run_sync(load_tokenizer, None)
        yield InstantEngineClient(tokenizer)

    return start()


def main(argv: list[str] | None = None) -> int:
    from gateway.cli import serve

    parser = argparse.ArgumentParser(description="Serve the gateway with the instant engine (benchmark only).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--api-key", action="append", default=[])
    args = parser.parse_args(argv)
    config = GatewayConfig(host=args.host, port=args.port, accept_any_model=True, log_level="warning",
                           api_keys=tuple(args.api_key),
                           max_waiting_requests=1 << 20, max_waiting_tokens=1 << 40)
    return serve(config, engine_factory=instant_engine_factory)


if __name__ == "__main__":
    sys.exit(main())
