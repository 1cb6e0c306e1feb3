"""Compiles the CPU kernels' C++ sources into a shared library, once per machine and source.

The library is a plain C ABI (no torch headers), so one build takes seconds rather than the
minute a torch extension needs, and it does not depend on torch's C++ ABI. It is cached under
`cache_dir` by a key that covers the sources, the flags, the compiler's version and the CPU's
feature flags (`-march=native` code must never run on another CPU model that shares the
folder). An exclusive `flock` serialises builds across processes (test workers, the engine
process); the compiler writes a temporary file that is renamed into place, so a reader never
sees half a library, and a process killed mid-build leaves no stale lock behind.

Standard library only: this file also runs as a script (`python kernels/cpu/build.py
--cache-dir DIR`), which the tests use to build from several processes at once without
importing torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("paged_attention.cpp", "kv_store.cpp", "rms_norm.cpp", "silu_mul.cpp", "skinny_linear.cpp",
           "panel_linear.cpp", "decoder_layers.cpp", "eagle_head.cpp")
HEADERS = ("vec.h", "attention_chunk.h", "skinny_entry.h")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC")
LIBRARY_PREFIX = "draftgate_cpu_kernels"
BUILD_TIMEOUT_S = 600


class BuildError(RuntimeError):
    """The library could not be built (no compiler, a compile error, no writable cache)."""


@dataclass(frozen=True)
class BuildResult:
    path: Path  # the shared library
    built: bool  # True when this call compiled it, False when it was already cached
    seconds: float  # time spent here, waiting for another builder included


def build_library(compiler: str, cache_dir: Path, extra_flags: tuple[str, ...] = ()) -> BuildResult:
    """Returns the cached library for the current sources, building it first if needed."""
    started = time.perf_counter()
    flags = FLAGS + tuple(extra_flags)
    target = cache_dir / f"{LIBRARY_PREFIX}-{_cache_key(compiler, flags)}.so"
    if target.exists():
        return BuildResult(target, False, time.perf_counter() - started)
    try:
        import fcntl
    except ImportError as exc:  # not a POSIX system
        raise BuildError("building the CPU kernels needs fcntl (a POSIX system)") from exc
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / "build.lock", "a")
    except OSError as exc:
        raise BuildError(f"cache folder {cache_dir} is not writable: {exc}") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if target.exists():  # another process built it while this one waited
            return BuildResult(target, False, time.perf_counter() - started)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        command = [compiler, *flags, *(str(SOURCE_DIR / s) for s in SOURCES), "-o", str(partial)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"could not run {compiler}: {exc}") from exc
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise BuildError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        os.replace(partial, target)
    return BuildResult(target, True, time.perf_counter() - started)


def _cache_key(compiler: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    digest.update("\0".join(flags).encode())
    digest.update(_compiler_version(compiler).encode())
    digest.update(_cpu_signature().encode())
    return digest.hexdigest()[:20]


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"C++ compiler {compiler!r} not usable: {exc}") from exc
    if done.returncode != 0:
        raise BuildError(f"C++ compiler {compiler!r} not usable: {done.stderr.strip()}")
    return done.stdout


def _cpu_signature() -> str:
    """The CPU's model and feature flags: what `-march=native` compiles for."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the draftgate CPU kernels into a cache folder.")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--compiler", default="c++")
    parser.add_argument("--flag", action="append", default=[], help="an extra compiler flag (repeatable)")
    args = parser.parse_args(argv)
    result = build_library(args.compiler, args.cache_dir, tuple(args.flag))
    print(json.dumps({"path": str(result.path), "built": result.built, "seconds": result.seconds}))


if __name__ == "__main__":
    main()
