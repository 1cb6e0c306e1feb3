"""`draftgate serve`: the OpenAI- and Anthropic-compatible HTTP server (what `make serve` runs).

With no arguments it serves the embedded SmolLM2-135M-Instruct on 127.0.0.1:8000. The server is
uvicorn with uvloop and httptools; the engine runs in its own process, started by the app's
lifespan. SIGTERM or Ctrl-C drains: /ready turns 503, new requests get 503, in-flight requests
get --shutdown-timeout seconds to finish, the rest are aborted, then the engine process stops
and the server exits. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn

from engine.config import (
    DRAFT_WEIGHT_FORMATS,
    DTYPES,
    KV_CACHE_DTYPES,
    QUANTIZATION_METHODS,
    SPECULATIVE_METHODS,
    build_engine_config,
    parse_bytes,
)
from engine.model.resolve import resolve_model, shipped_draft_path
from engine.spec_decode.corpus import resolve_suffix_corpus_path
from gateway.app import create_app
from gateway.canonical.policy import POLICY_HEADER, POLICY_NAMES
from gateway.config import GatewayConfig, gateway_env
from gateway.state import EngineFactory, GatewayState

logger = logging.getLogger("draftgate.gateway")


class _HelpFormatter(argparse.HelpFormatter):
    """Shows a flag's default when it has a meaningful one that its help does not state already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: {default})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftgate", description="draftgate: agent-workload gateway and engine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve the OpenAI and Anthropic HTTP APIs",
        description="Serve a model over the OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and "
                    "Anthropic (/v1/messages) HTTP APIs, plus /health, /ready and /metrics.",
        formatter_class=_HelpFormatter,
    )
    model = serve.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="a .gguf file or a Hugging Face checkpoint folder (default: the embedded "
                            "SmolLM2-135M-Instruct)")
    model.add_argument("--speculative", default="auto", choices=["auto", *SPECULATIVE_METHODS],
                       help="speculative decoding: none, draft (a small draft model), suffix (model-free, from "
                            "repeated text) or hybrid (per request and step, whichever expects more accepted "
                            "tokens); auto: hybrid when there is a draft (--draft, or the one shipped for the "
                            "embedded model), else suffix")
    model.add_argument("--draft", default=None,
                       help="draft model (a GGUF file or a draft folder) for --speculative draft|hybrid "
                            "(default: the draft shipped for the embedded model)")
    model.add_argument("--draft-dtype", default="auto", choices=list(DTYPES),
                       help="the draft's dtype (auto: float32 over held weights, see --draft-weights, on CPUs "
                            "with AVX2 or wider where the compiled kernels built; elsewhere the target's, but "
                            "bfloat16 under a float32 target where --dtype auto would take bfloat16; drafts "
                            "only propose, so it moves speed, never the output)")
    model.add_argument("--draft-weights", default="auto", choices=list(DRAFT_WEIGHT_FORMATS),
                       help="how a float32 draft holds its weights on AVX2 or wider CPUs, computing in float32 over them: "
                            "bf16, int8 (one scale per row), dtype (float32 itself); auto: int8 under "
                            "--draft-dtype auto, else the dtype")
    model.add_argument("--num-speculative-tokens", type=int, default=4,
                       help="most tokens the draft model drafts per request per step (1-16)")
    model.add_argument("--num-suffix-tokens", type=int, default=16,
                       help="most tokens suffix matching drafts per request per step (1-32; its drafts cost no "
                            "model compute, so its cap is longer)")
    model.add_argument("--suffix-corpus", default=None, metavar="PATH|none",
                       help="a corpus of the model's past outputs that suffix matching (suffix, hybrid) also "
                            "follows: a .npy of token ids, documents ended by -1 (python -m drafts suffix-corpus); "
                            "default: the one shipped for the embedded model; none: no corpus")
    model.add_argument("--no-adaptive-speculation", action="store_true",
                       help="always draft up to --num-speculative-tokens (draft model) and --num-suffix-tokens "
                            "(suffix), whatever the acceptance and batch size")
    model.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                       help="name clients use in 'model' (repeatable; default: the model's own name)")
    model.add_argument("--accept-any-model", action="store_true",
                       help="serve requests whatever 'model' they name, instead of answering 404")
    model.add_argument("--dtype", default="auto", choices=list(DTYPES),
                       help="weights and activations dtype (auto: bfloat16 on CUDA and on CPUs with native bf16, AMX or AVX512-BF16; else float32)")
    model.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                       help="weight-only quantization at load (int8 per channel, int4 group-wise, fp8), or name "
                            "the format of a GPTQ/AWQ checkpoint (detected from its config.json anyway)")
    model.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    model.add_argument("--max-model-len", type=int, default=None,
                       help="context length in tokens (default: the model's own)")
    model.add_argument("--seed", type=int, default=0, help="engine seed for unseeded sampling")

    engine = serve.add_argument_group("engine")
    engine.add_argument("--kv-cache-memory", default=None,
                        help="KV-cache budget such as 2GiB (default: DRAFTGATE_KV_CACHE_MEMORY or the engine's choice)")
    engine.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                        help="KV cache storage: auto (the model dtype) or fp8 (e4m3 with a scale per stored "
                             "vector, about half the bytes of bf16)")
    engine.add_argument("--num-blocks", type=int, default=None, help="exact number of KV blocks (overrides the budget)")
    engine.add_argument("--block-size", type=int, default=16, help="tokens per KV block (a power of two)")
    engine.add_argument("--max-num-seqs", type=int, default=64, help="most requests in one batch")
    engine.add_argument("--max-num-batched-tokens", type=int, default=1024, help="token budget of one engine step")
    engine.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    engine.add_argument("--num-threads", type=int, default=None, help="CPU threads for the engine (default: torch's)")
    engine.add_argument("--no-huge-pages", action="store_true",
                        help="on a CPU, leave the weights and KV caches in the allocator's pages (default: 2 MiB "
                             "pages where Linux allows them, which makes decoding faster)")
    engine.add_argument("--in-process-engine", action="store_true",
                        help="run the engine in a thread of the server process (debugging; slower under load)")

    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=int, default=8000, help="port to listen on")
    server.add_argument("--api-key", action="append", default=[], metavar="KEY",
                        help="accept this API key (repeatable; DRAFTGATE_API_KEYS adds comma-separated keys); "
                             "with any key set, every route but /health requires one")
    server.add_argument("--max-waiting-requests", type=int, default=256,
                        help="admitted requests without output yet beyond which new ones get 429")
    server.add_argument("--max-waiting-tokens", type=int, default=1 << 20,
                        help="prompt tokens of waiting requests beyond which new ones get 429")
    server.add_argument("--max-n", type=int, default=16, help="largest n (choices per request) accepted")
    server.add_argument("--max-body-size", default="32MiB", help="largest request body accepted (413 beyond)")
    server.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="log level of the server and the engine")

    agents = serve.add_argument_group("agent sessions")
    agents.add_argument("--canonicalization", default="safe", choices=list(POLICY_NAMES),
                        help="prompt canonicalization: off (verbatim), safe (meaning-preserving rewrites; volatile "
                             "values moved to a note at the end) or aggressive (volatile values stripped); a request "
                             f"may narrow it with the {POLICY_HEADER} header (default: safe)")
    agents.add_argument("--session-retention-ttl", type=float, default=30.0, metavar="SECONDS",
                        help="keep a session's KV blocks this long after a turn that ends in a tool call (0: off)")
    agents.add_argument("--session-retention-cap", type=float, default=0.25, metavar="FRACTION",
                        help="most of the KV cache that retained sessions may hold, as a fraction")
    return parser


def config_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> GatewayConfig:
    env = gateway_env(environ)
    engine = build_engine_config(
        args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        block_size=args.block_size, kv_cache_memory=args.kv_cache_memory, num_blocks=args.num_blocks,
        enable_prefix_caching=not args.no_prefix_caching, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed, num_threads=args.num_threads,
        huge_pages=not args.no_huge_pages,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        speculative=default_speculation(args.model, args.draft) if args.speculative == "auto" else args.speculative,
        draft=args.draft, num_speculative_tokens=args.num_speculative_tokens,
        num_suffix_tokens=args.num_suffix_tokens, adaptive_speculation=not args.no_adaptive_speculation,
        draft_dtype=args.draft_dtype, draft_weights=args.draft_weights, suffix_corpus=args.suffix_corpus,
    )
    return GatewayConfig(
        engine=engine, host=args.host, port=args.port,
        api_keys=tuple(args.api_key) + env.api_keys, served_model_names=tuple(args.served_model_name),
        accept_any_model=args.accept_any_model, max_waiting_requests=args.max_waiting_requests,
        max_waiting_tokens=args.max_waiting_tokens, max_n=args.max_n,
        max_body_bytes=_parse_size(args.max_body_size, "max_body_size"), shutdown_timeout=args.shutdown_timeout,
        engine_in_process=args.in_process_engine, log_level=args.log_level,
        canonicalization=args.canonicalization, session_retention_seconds=args.session_retention_ttl,
        session_retention_max_fraction=args.session_retention_cap,
    )


def default_speculation(model: str | None, draft: str | None) -> str:
    """--speculative auto: hybrid (the draft model and suffix drafting, whichever expects more per
    request and step) when there is a draft to load, suffix (model-free) otherwise. Measured on the
    embedded model in docs/benchmarks.md: hybrid is the fastest mode on code at one stream, 3x on
    agent turns, and faster than no speculation under agent load."""
    if draft is not None:
        return "hybrid"
    return "hybrid" if shipped_draft_path(resolve_model(model)) is not None else "suffix"


def _parse_size(text: str, name: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError:
        raise ValueError(f"{name} must be a size like '32MiB' or a byte count, got {text!r}") from None


class DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains the gateway before the usual shutdown."""

    def __init__(self, config: uvicorn.Config, state: GatewayState, shutdown_timeout: float) -> None:
        super().__init__(config)
        self._state = state
        self._shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self.exit_code = 0

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain_task is not None or self.should_exit:
            # A second signal (or one before the loop runs): uvicorn's own immediate shutdown.
            self.force_exit = self._drain_task is not None
            self.should_exit = True
            return
        logger.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self._state.drain(self._shutdown_timeout)
        finally:
            self.should_exit = True

    def fatal(self, message: str) -> None:
        """The engine failed: stop serving with a non-zero exit status."""
        self.exit_code = 1
        self.should_exit = True


def serve(config: GatewayConfig, engine_factory: EngineFactory | None = None) -> int:
    """Runs the server until it is stopped; the exit status (1 when the engine failed)."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(config, engine_factory=engine_factory)
    state: GatewayState = app.state.gateway
    uvicorn_config = uvicorn.Config(
        app, host=config.host, port=config.port, loop="uvloop", http="httptools", lifespan="on",
        log_level=config.log_level, access_log=False, timeout_graceful_shutdown=5,
    )
    server = DrainingServer(uvicorn_config, state, config.shutdown_timeout)
    state.on_fatal = server.fatal
    server.run()
    return server.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        resolved = resolve_model(config.engine.model.model)  # a wrong path fails here, before the server starts
        draft = config.engine.speculative.draft_model
        if draft is not None and not os.path.exists(draft):
            raise FileNotFoundError(f"draft {draft!r} does not exist (a draft folder or a .gguf file)")
        resolve_suffix_corpus_path(config.engine.speculative, resolved)
    except (ValueError, FileNotFoundError) as error:
        print(f"draftgate: error: {error}", file=sys.stderr)
        return 2
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
