"""The gateway benchmark's machinery: the instant engine, the load generator, the docs section."""

from __future__ import annotations

import asyncio

from engine.model.tokenizer import load_tokenizer
from engine.sampling_params import SamplingParams
from gateway.benchmarks.instant_engine import COMPLETION_TEXT, InstantEngineClient
from gateway.benchmarks.load import build_request, run_load
from gateway.benchmarks.overhead import API_KEY, BEGIN, BODY, END, gateway_server, write_docs
from gateway.engine_client import EngineClient


def test_instant_engine_is_an_engine_client_streaming_its_text() -> None:
    engine = InstantEngineClient(load_tokenizer(None))
    assert isinstance(engine, EngineClient)

    async def collect(max_tokens: int) -> tuple[str, list]:
        deltas = [d async for d in engine.generate([1, 2, 3], SamplingParams(max_tokens=max_tokens), request_id="r")]
        return "".join(d.text for d in deltas), deltas

    text, deltas = asyncio.run(collect(1000))
    assert text == COMPLETION_TEXT and deltas[-1].finish_reason == "stop"
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    _, cut = asyncio.run(collect(3))
    assert len(cut) == 3 and cut[-1].finish_reason == "length"


def test_load_generator_against_the_instant_gateway() -> None:
    with gateway_server() as port:
        request = build_request("127.0.0.1", port, "/v1/chat/completions", BODY, {"Authorization": f"Bearer {API_KEY}"})
        result = asyncio.run(run_load("127.0.0.1", port, request, concurrency=4, seconds=0.5, warmup_seconds=0.2))
        assert result.num_errors == 0 and len(result.latencies) > 10
        assert 0 < result.percentile(0.5) <= result.percentile(0.99)
        unauthorized = build_request("127.0.0.1", port, "/v1/chat/completions", BODY)
        refused = asyncio.run(run_load("127.0.0.1", port, unauthorized, concurrency=1, seconds=0.2, warmup_seconds=0))
        assert refused.latencies == [] and refused.num_errors > 0


def test_write_docs_replaces_only_its_section(tmp_path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(f"# Benchmarks\n\n## Engine\nkeep me\n\n{BEGIN}\nold\n{END}\n\n## Later\nkeep me too\n")
    write_docs("new table\n", str(path))
    text = path.read_text()
    assert "keep me\n" in text and "keep me too" in text and "old" not in text
    assert f"{BEGIN}\nnew table\n{END}" in text
    fresh = tmp_path / "fresh.md"
    write_docs("table\n", str(fresh))
    assert fresh.read_text() == f"# Benchmarks\n\n{BEGIN}\ntable\n{END}\n"
