"""The asyncio (anyio) face of the engine: stream per-request deltas, abort, stats.

    async with AsyncEngine.start(config) as engine:          # engine process
        async for delta in engine.generate(token_ids, params):
            ...

The engine core runs in a spawned process by default, or in a thread of this process with
`in_process=True` (tests); both talk msgspec frames over a stream socket, so they share every line
of the protocol code. Leaving a `generate` iterator early (a client gone, a cancelled task) aborts
the request in the engine, which frees its blocks.
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectSendStream

from engine.config import EngineConfig
from engine.protocol import (
    FRAME_HEADER,
    AbortRequests,
    AddRequest,
    CallDone,
    EngineFailed,
    EngineOutputs,
    EngineReady,
    EngineStats,
    GetStats,
    RequestDelta,
    ResetPrefixCache,
    RetentionSpec,
    Shutdown,
    StatsReply,
    StructuredOutputSpec,
    encode_frame,
    message_decoder,
)
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine process stopped; no further request can be served."""


class RequestRejectedError(ValueError):
    """The engine refused a request (e.g. longer than the context); the message says why."""


class AsyncEngine:
    def __init__(self, stream: anyio.abc.SocketStream, receiver: BufferedByteReceiveStream,
                 ready: EngineReady) -> None:
        self._stream = stream
        self._receiver = receiver
        self.info = ready
        self._send_lock = anyio.Lock()
        self._requests: dict[str, MemoryObjectSendStream[RequestDelta]] = {}
        self._calls: dict[int, tuple[anyio.Event, list]] = {}
        self._call_ids = itertools.count()
        self._dead: str | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    @classmethod
    @asynccontextmanager
    async def start(cls, config: EngineConfig, *, in_process: bool = False,
                    startup_timeout: float = 600.0) -> AsyncIterator[AsyncEngine]:
        """Starts the engine, waits until its model is loaded, and stops it on exit."""
        if in_process:
            launcher = _ThreadLauncher(config)
        else:
            launcher = _ProcessLauncher(config)
        stream = await launcher.connect(startup_timeout)
        try:
            receiver = BufferedByteReceiveStream(stream)
            first = await _read_message(receiver)
            if isinstance(first, EngineFailed):
                raise EngineDeadError(f"engine failed to start: {first.message}")
            if not isinstance(first, EngineReady):
                raise EngineDeadError(f"engine sent {type(first).__name__} before ready")
            engine = cls(stream, receiver, first)
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine._read_loop)
                try:
                    yield engine
                finally:
                    await engine._shutdown()
                    tg.cancel_scope.cancel()
        finally:
            await stream.aclose()
            await anyio.to_thread.run_sync(launcher.join)

    async def _shutdown(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._dead is None:
                try:
                    await self._send(Shutdown())
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, EngineDeadError):
                    pass
            self._fail_all("engine shut down")

    @property
    def is_alive(self) -> bool:
        return self._dead is None

    @property
    def num_open_requests(self) -> int:
        return len(self._requests)

    # ---- requests ----------------------------------------------------------------------------
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        session_id: str | None = None,
        retention: RetentionSpec | None = None,
        structured_output: StructuredOutputSpec | None = None,
    ) -> AsyncIterator[RequestDelta]:
        """Streams the request's deltas; the last one has finish_reason set.

        session_id / retention: the agent session and whether to keep this turn's KV blocks after
        it (engine/core/session_retention.py); structured_output: a grammar the output must follow.

        Raises RequestRejectedError when the engine refuses the request, EngineDeadError when the
        engine stops. Exiting the iterator before the end aborts the request: wrap it in
        contextlib.aclosing() so that the abort is sent at once, not when it is garbage collected.
        """
        if params.n != 1:
            raise ValueError("n must be 1 for AsyncEngine.generate: fan out n requests instead")
        if len(prompt_token_ids) >= self.info.max_model_len:
            raise RequestRejectedError(
                f"prompt has {len(prompt_token_ids)} tokens but the model's context (max_model_len) is "
                f"{self.info.max_model_len}; at least one token must be left for the output"
            )
        self._check_alive()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        send_stream, receive_stream = anyio.create_memory_object_stream[RequestDelta](math.inf)
        self._requests[request_id] = send_stream
        finished = False
        try:
            await self._send(AddRequest(request_id, list(prompt_token_ids), params, time.monotonic(),
                                        priority, cache_salt, session_id, retention, structured_output))
            async with receive_stream:
                async for delta in receive_stream:
                    if delta.error is not None:
                        finished = True
                        raise RequestRejectedError(delta.error)
                    if delta.finish_reason is not None:
                        finished = True
                    yield delta
                    if finished:
                        return
            if not finished:
                raise EngineDeadError(self._dead or "engine stream closed")
        finally:
            self._requests.pop(request_id, None)
            if not finished and self._dead is None:
                with anyio.CancelScope(shield=True):
                    try:
                        await self._send(AbortRequests([request_id]))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, EngineDeadError):
                        pass

    async def abort(self, request_ids: list[str]) -> None:
        """Aborts requests from outside their generate() loop; those loops end with an
        "abort" delta."""
        for request_id in request_ids:
            stream = self._requests.pop(request_id, None)
            if stream is not None:
                stream.send_nowait(RequestDelta(request_id, finish_reason="abort"))
                stream.close()
        await self._send(AbortRequests(list(request_ids)))

    async def get_stats(self) -> EngineStats:
        reply = await self._call(GetStats)
        return reply.stats

    async def reset_prefix_cache(self) -> None:
        await self._call(ResetPrefixCache)

    # ---- plumbing ----------------------------------------------------------------------------
    async def _call(self, message_type: type) -> StatsReply | CallDone:
        self._check_alive()
        call_id = next(self._call_ids)
        event, slot = anyio.Event(), []
        self._calls[call_id] = (event, slot)
        try:
            await self._send(message_type(call_id))
            await event.wait()
        finally:
            self._calls.pop(call_id, None)
        if not slot:
            raise EngineDeadError(self._dead or "engine stopped")
        return slot[0]

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)

    async def _send(self, message) -> None:
        self._check_alive()
        async with self._send_lock:
            await self._stream.send(encode_frame(message))

    async def _read_loop(self) -> None:
        reason = "engine connection closed"
        try:
            while True:
                message = await _read_message(self._receiver)
                match message:
                    case EngineOutputs(deltas=deltas):
                        for delta in deltas:
                            stream = self._requests.get(delta.request_id)
                            if stream is None:
                                continue  # aborted on our side already
                            stream.send_nowait(delta)
                            if delta.finish_reason is not None:
                                stream.close()
                    case StatsReply(call_id=call_id) | CallDone(call_id=call_id):
                        entry = self._calls.get(call_id)
                        if entry is not None:
                            entry[1].append(message)
                            entry[0].set()
                    case EngineFailed(message=text):
                        reason = f"engine failed: {text}"
                        logger.error(reason)
                        return
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        if self._dead is None:
            self._dead = reason
        for stream in self._requests.values():
            stream.close()  # waiting generators see the end and raise EngineDeadError
        for event, _ in self._calls.values():
            event.set()


async def _read_message(receiver: BufferedByteReceiveStream):
    header = await receiver.receive_exactly(FRAME_HEADER.size)
    (length,) = FRAME_HEADER.unpack(header)
    return message_decoder.decode(await receiver.receive_exactly(length))


class _ProcessLauncher:
    """Spawns the engine process and accepts its connection on a private unix socket."""

    def __init__(self, config: EngineConfig) -> None:
        self._dir = tempfile.mkdtemp(prefix="draftgate-")
        self.path = os.path.join(self._dir, "engine.sock")
        from engine.engine_process import run_engine_process

        context = multiprocessing.get_context("spawn")
        self.process = context.Process(
            target=run_engine_process, args=(config, self.path, logging.getLogger().level or logging.INFO),
            name="draftgate-engine", daemon=True,
        )

    async def connect(self, timeout: float) -> anyio.abc.SocketStream:
        listener = await anyio.create_unix_listener(self.path)
        self.process.start()
        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    result: list[anyio.abc.SocketStream] = []

                    async def accept() -> None:
                        result.append(await listener.accept())
                        tg.cancel_scope.cancel()

                    tg.start_soon(accept)
                    while not result:
                        if not self.process.is_alive():
                            raise EngineDeadError(f"engine process exited with code {self.process.exitcode}")
                        await anyio.sleep(0.1)
            return result[0]
        except BaseException:
            self.join()
            raise
        finally:
            await listener.aclose()

    def join(self, timeout: float = 30.0) -> None:
        if self.process.pid is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                logger.warning("engine process did not exit in %.0f s; killing it", timeout)
                self.process.kill()
                self.process.join(5)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass


class _ThreadLauncher:
    """In-process mode: the same engine loop in a thread, over a socket pair."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.thread: threading.Thread | None = None

    async def connect(self, timeout: float) -> anyio.abc.SocketStream:
        from engine.engine_process import serve_engine

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def run() -> None:
            try:
                serve_engine(self.config, theirs)
            finally:
                theirs.close()

        self.thread = threading.Thread(target=run, name="draftgate-engine", daemon=True)
        self.thread.start()
        return await anyio.abc.SocketStream.from_socket(ours)

    def join(self, timeout: float = 30.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
