"""Gateway configuration: one frozen dataclass, built by the CLI (or by tests) and validated here.

Environment variables the gateway reads are read in `gateway_env()` and nowhere else:
- DRAFTGATE_API_KEYS: comma-separated API keys, added to those given with --api-key.
The engine's own variables (e.g. DRAFTGATE_KV_CACHE_MEMORY) are read by engine/config.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from engine.config import EngineConfig
from gateway.canonical.policy import POLICY_NAMES

API_KEYS_ENV = "DRAFTGATE_API_KEYS"


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the HTTP server needs; the engine's part is an EngineConfig handed on as is.

    served_model_names: the names /v1/models lists and requests may use in "model"; empty means
    the engine's model name. accept_any_model: serve whatever "model" a request names (clients
    hard-wired to a vendor's model names). max_waiting_requests / max_waiting_tokens: the
    admission bound on requests admitted but not yet producing output, and on their prompt
    tokens; beyond either a request gets 429 with Retry-After. shutdown_timeout: seconds that
    in-flight requests get to finish after SIGTERM before they are aborted.
    canonicalization: the prompt canonicalization policy, off / safe / aggressive (a request may
    narrow it with a header). session_retention_seconds: how long the engine keeps a session's
    KV blocks after a turn that ends in a tool call (0: never); session_retention_max_fraction:
    the cap on all retained blocks, as a fraction of the KV cache. max_sessions: sessions whose
    previous turn is remembered for prefix diagnostics.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    served_model_names: tuple[str, ...] = ()
    accept_any_model: bool = False
    max_waiting_requests: int = 256
    max_waiting_tokens: int = 1 << 20
    max_n: int = 16
    max_body_bytes: int = 32 << 20
    shutdown_timeout: float = 30.0
    engine_in_process: bool = False
    engine_startup_timeout: float = 600.0
    log_level: str = "info"
    canonicalization: str = "safe"
    session_retention_seconds: float = 30.0
    session_retention_max_fraction: float = 0.25
    max_sessions: int = 4096

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "port", f"must be in [0, 65535], got {self.port}")
        _require(all(isinstance(key, str) and key for key in self.api_keys), "api_keys", "must be non-empty strings")
        _require(self.max_waiting_requests >= 1, "max_waiting_requests",
                 f"must be >= 1, got {self.max_waiting_requests}")
        _require(self.max_waiting_tokens >= 1, "max_waiting_tokens", f"must be >= 1, got {self.max_waiting_tokens}")
        _require(self.max_n >= 1, "max_n", f"must be >= 1, got {self.max_n}")
        _require(self.max_body_bytes >= 1024, "max_body_bytes", f"must be >= 1024, got {self.max_body_bytes}")
        _require(self.shutdown_timeout >= 0, "shutdown_timeout", f"must be >= 0, got {self.shutdown_timeout}")
        _require(self.engine_startup_timeout > 0, "engine_startup_timeout",
                 f"must be > 0, got {self.engine_startup_timeout}")
        _require(self.log_level in ("critical", "error", "warning", "info", "debug"), "log_level",
                 f"must be one of critical, error, warning, info, debug; got {self.log_level!r}")
        _require(self.canonicalization in POLICY_NAMES, "canonicalization",
                 f"must be one of {', '.join(POLICY_NAMES)}; got {self.canonicalization!r}")
        _require(self.session_retention_seconds >= 0, "session_retention_seconds",
                 f"must be >= 0, got {self.session_retention_seconds}")
        _require(0.0 <= self.session_retention_max_fraction <= 1.0, "session_retention_max_fraction",
                 f"must be in [0, 1], got {self.session_retention_max_fraction}")
        _require(self.max_sessions >= 1, "max_sessions", f"must be >= 1, got {self.max_sessions}")


@dataclass(frozen=True)
class GatewayEnv:
    api_keys: tuple[str, ...] = ()


def gateway_env(environ: dict[str, str] | None = None) -> GatewayEnv:
    """The gateway's environment variables, parsed (the one place they are read)."""
    environ = dict(os.environ) if environ is None else environ
    raw = environ.get(API_KEYS_ENV, "")
    keys = tuple(key.strip() for key in raw.split(",") if key.strip())
    return GatewayEnv(api_keys=keys)
