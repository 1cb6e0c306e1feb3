"""The engine loop that serves one front over a stream socket.

It runs in its own process (so the HTTP loop never waits on the GIL of a forward pass) or, in
in-process mode, in a thread of the front's process; the code is the same. A reader thread turns
incoming frames into an inbox queue; the loop drains the inbox between steps, so new requests and
aborts take effect at the next step, and blocks on the inbox only when it has nothing to run.
The loop ends on a Shutdown message or when the front's end of the socket closes (front gone),
so an engine process never outlives its front.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import socket
import threading
import traceback

import msgspec

from engine.config import EngineConfig
from engine.protocol import (
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    AbortRequests,
    AddRequest,
    CallDone,
    EngineFailed,
    EngineOutputs,
    GetStats,
    ResetPrefixCache,
    Shutdown,
    StatsReply,
    encode_frame,
    input_decoder,
)

logger = logging.getLogger(__name__)


def run_engine_process(config: EngineConfig, socket_path: str, log_level: int = logging.INFO) -> None:
    """Entry point of the spawned engine process: connect back to the front, then serve it."""
    logging.basicConfig(level=log_level, format="%(asctime)s engine %(levelname)s %(name)s: %(message)s")
    # SIGINT goes to the whole process group on Ctrl-C; the front decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    try:
        serve_engine(config, sock)
    finally:
        sock.close()


def serve_engine(config: EngineConfig, sock: socket.socket) -> None:
    send_lock = threading.Lock()

    def send(message: msgspec.Struct) -> bool:
        try:
            with send_lock:
                sock.sendall(encode_frame(message))
            return True
        except OSError:
            return False  # front gone; the reader sees EOF and ends the loop

    try:
        from engine.engine_core import EngineCore

        core = EngineCore(config)
    except Exception as error:  # noqa: BLE001 - any load failure is reported, then we exit
        logger.exception("engine failed to start")
        send(EngineFailed(f"{type(error).__name__}: {error}"))
        return

    # The engine lives as long as this process: what it built (modules, tokenizer tables) is
    # moved out of the collector's generations, so a gen-2 collection mid-step walks only what
    # serving allocates (vLLM's engine process does the same). One such collection took 65 ms of
    # an 8-stream step on a 2-core CPU (a scratch profile with gc callbacks, 2026-12-04). Not in
    # the in-process LLM: frozen objects are never collected, and an engine built and dropped
    # there would leave its reference cycles behind (~300 MiB a hybrid engine, measured).
    gc.collect()
    gc.freeze()
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read_frames, args=(sock, inbox), name="engine-reader", daemon=True).start()
    send(core.ready_message())
    logger.info("engine ready: %s on %s, %d KV blocks, pid %d", core.model_name, core.runner.device,
                core.num_blocks, os.getpid())

    while True:
        if not core.has_unfinished_requests():
            messages = [inbox.get()]  # idle: sleep until the front says something
        else:
            messages = []
        while True:
            try:
                messages.append(inbox.get_nowait())
            except queue.Empty:
                break
        deltas = []
        for message in messages:
            match message:
                case AddRequest():
                    rejected = core.add_request(message)
                    if rejected is not None:
                        deltas.append(rejected)
                case AbortRequests(request_ids=ids):
                    core.abort_requests(ids)
                case GetStats(call_id=call_id):
                    send(StatsReply(call_id, core.stats()))
                case ResetPrefixCache(call_id=call_id):
                    core.reset_prefix_cache()
                    send(CallDone(call_id))
                case Shutdown():
                    logger.info("engine shutting down")
                    return
        try:
            deltas.extend(core.step())
        except Exception as error:  # noqa: BLE001 - a failed step leaves state unknown: stop
            logger.exception("engine step failed")
            send(EngineFailed(f"engine step failed: {type(error).__name__}: {error}\n{traceback.format_exc()}"))
            return
        if deltas and not send(EngineOutputs(deltas)):
            return


def _read_frames(sock: socket.socket, inbox: queue.Queue) -> None:
    try:
        while True:
            header = _recv_exactly(sock, FRAME_HEADER.size)
            (length,) = FRAME_HEADER.unpack(header)
            if length > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {length} bytes exceeds the limit")
            inbox.put(input_decoder.decode(_recv_exactly(sock, length)))
    except (OSError, EOFError, ValueError, msgspec.DecodeError) as error:
        if not isinstance(error, EOFError):
            logger.warning("engine socket closed: %s", error)
    finally:
        inbox.put(Shutdown())


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise EOFError
        chunks += chunk
    return bytes(chunks)
