"""A lean closed-loop HTTP/1.1 load generator (keep-alive connections, raw asyncio streams).

Python HTTP client libraries spend more CPU per request than a fast server does, which on a
2-core machine would measure the client. This one sends pre-built request bytes and parses only
what it must (status, Content-Length or chunked framing), so the servers under test, not the
client, set the pace; every server in a comparison is driven by the same client.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)  # seconds, completed requests only
    num_errors: int = 0
    seconds: float = 0.0

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: keep-alive"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lowered = head.lower()
    marker = lowered.find(b"content-length:")
    if marker >= 0:
        end = lowered.index(b"\r\n", marker)
        await reader.readexactly(int(lowered[marker + 15:end]))
        return status
    if b"transfer-encoding: chunked" not in lowered:
        raise ValueError("response has neither Content-Length nor chunked encoding")
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def _worker(host: str, port: int, request: bytes, deadline: float, warmup_end: float,
                  result: LoadResult) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            started = time.perf_counter()
            if started >= deadline:
                return
            writer.write(request)
            status = await _read_response(reader)
            finished = time.perf_counter()
            if started >= warmup_end:
                if status == 200:
                    result.latencies.append(finished - started)
                else:
                    result.num_errors += 1
    finally:
        writer.close()


async def run_load(host: str, port: int, request: bytes, *, concurrency: int, seconds: float,
                   warmup_seconds: float = 1.0) -> LoadResult:
    """`concurrency` connections each send the request back to back for warmup + seconds."""
    result = LoadResult()
    start = time.perf_counter()
    warmup_end = start + warmup_seconds
    deadline = warmup_end + seconds
    await asyncio.gather(*[_worker(host, port, request, deadline, warmup_end, result) for _ in range(concurrency)])
    result.seconds = time.perf_counter() - warmup_end
    return result
