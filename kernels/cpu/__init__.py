"""Compiled CPU kernels: paged attention and KV store in C++ with OpenMP.

Built on first use (kernels/cpu/build.py) with the system C++ compiler, cached per machine,
loaded with ctypes. When there is no compiler, the build fails or the environment switches them
off, `cpu_kernels()` returns None after logging one warning and the dispatcher in `kernels`
uses the torch references: the product works either way, only slower.

Environment (read here and nowhere else):
- DRAFTGATE_CPU_KERNELS: "0", "false", "off" or "no" forces the torch references (debugging).
- DRAFTGATE_CACHE_DIR: where compiled kernels are kept (default $XDG_CACHE_HOME/draftgate, or
  ~/.cache/draftgate); the library lives in its cpu_kernels/ folder.
- CXX: the C++ compiler (default c++).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from kernels.cpu.build import BuildError, BuildResult, build_library
from kernels.cpu.library import CpuAttentionPlan, CpuKernels, DecoderLayerTensors, DecoderStack

logger = logging.getLogger(__name__)

ENV_SWITCH = "DRAFTGATE_CPU_KERNELS"
_OFF_VALUES = {"0", "false", "off", "no"}

_lock = threading.Lock()
_loaded = False
_kernels: CpuKernels | None = None
_build: BuildResult | None = None
_unavailable_reason: str | None = None


def cache_dir() -> Path:
    root = os.environ.get("DRAFTGATE_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "draftgate")
    return Path(root) / "cpu_kernels"


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, building them on the first call; None when unavailable."""
    global _loaded, _kernels, _build, _unavailable_reason
    if _loaded:
        return _kernels
    with _lock:
        if _loaded:
            return _kernels
        if os.environ.get(ENV_SWITCH, "1").strip().lower() in _OFF_VALUES:
            _unavailable_reason = f"switched off by {ENV_SWITCH}={os.environ[ENV_SWITCH]}"
        else:
            try:
                _build = build_library(compiler(), cache_dir())
                _kernels = CpuKernels(_build.path)
                if _build.built:
                    logger.info("Built the CPU kernels in %.1f s: %s", _build.seconds, _build.path)
            except (BuildError, OSError, AttributeError) as exc:  # AttributeError: a symbol is missing
                _unavailable_reason = f"{type(exc).__name__}: {exc}"
                logger.warning("Compiled CPU kernels unavailable, using the torch reference (%s)",
                               _unavailable_reason)
        _loaded = True
        return _kernels


def unavailable_reason() -> str | None:
    """Why `cpu_kernels()` returned None (after it was called), else None."""
    return _unavailable_reason


def last_build() -> BuildResult | None:
    """How this process obtained the library: its path, and whether it compiled it."""
    return _build


__all__ = ["BuildError", "BuildResult", "CpuAttentionPlan", "CpuKernels", "DecoderLayerTensors", "DecoderStack", "build_library",
           "cache_dir", "cpu_kernels", "last_build", "unavailable_reason"]
