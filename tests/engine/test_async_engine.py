"""The asyncio face: streaming, abort frees blocks, refusals, in-process and engine-process modes."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from engine.async_engine import AsyncEngine, RequestRejectedError
from engine.config import build_engine_config
from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(None))


def _config():
    return build_engine_config(kv_cache_memory="64MiB", max_num_batched_tokens=256)


async def _collect(engine: AsyncEngine, ids: list[int], params: SamplingParams) -> tuple[str, list[int], str | None]:
    text, tokens, finish = "", [], None
    async with contextlib.aclosing(engine.generate(ids, params)) as stream:
        async for delta in stream:
            text += delta.text
            tokens += delta.new_token_ids
            finish = delta.finish_reason
    return text, tokens, finish


@pytest.mark.parametrize("in_process", [True, False], ids=["thread", "process"])
async def test_stream_concurrent_abort_and_refusal(tokenizer, in_process: bool) -> None:
    async with AsyncEngine.start(_config(), in_process=in_process) as engine:
        assert engine.info.model_name == "SmolLM2-135M-Instruct"
        prompt = tokenizer.encode("The capital of France is")
        greedy = SamplingParams(temperature=0.0, max_tokens=6)

        results: list = [None] * 4

        async def run(i: int) -> None:
            results[i] = await _collect(engine, prompt, greedy)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(run, i)
        assert all(r == results[0] for r in results)  # concurrent greedy requests agree
        text, tokens, finish = results[0]
        assert text.startswith(" Paris") and len(tokens) == 6 and finish == "length"

        # Leaving the stream early aborts the request and frees its blocks.
        async with contextlib.aclosing(
            engine.generate(prompt, SamplingParams(max_tokens=500, ignore_eos=True))
        ) as stream:
            async for _ in stream:
                break
        with anyio.fail_after(30):
            while True:
                stats = await engine.get_stats()
                if stats.num_running == 0 and stats.num_waiting == 0:
                    break
                await anyio.sleep(0.05)
        assert stats.kv_cache_usage == 0.0

        # A cancelled task aborts too.
        with anyio.move_on_after(0.5):
            await _collect(engine, prompt, SamplingParams(max_tokens=500, ignore_eos=True))
        with anyio.fail_after(30):
            while (await engine.get_stats()).num_running:
                await anyio.sleep(0.05)

        with pytest.raises(RequestRejectedError, match="max_model_len"):
            await _collect(engine, [1] * engine.info.max_model_len, greedy)
        with pytest.raises(RequestRejectedError, match="vocabulary"):
            await _collect(engine, [10**8], greedy)
        # The engine is still serving after refusals.
        assert (await _collect(engine, prompt, greedy))[0] == text


async def test_engine_failure_is_reported() -> None:
    config = build_engine_config("/nonexistent/model.gguf")
    with pytest.raises(Exception, match="nonexistent"):
        async with AsyncEngine.start(config, in_process=True):
            pass
