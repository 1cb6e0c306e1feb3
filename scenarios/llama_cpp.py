"""llama.cpp's C++ `llama-server`: the peer of `make bench`, found, built when missing, and run.

    python -m scenarios.llama_cpp build            # find or build the binary, print its path
    python -m scenarios.llama_cpp serve --port 8090 --parallel 8   # run it on the embedded GGUF

The strongest llama.cpp peer on a CPU is its C++ server (continuous batching over parallel
slots), not the Python server of llama-cpp-python. The llama-cpp-python source distribution on
PyPI vendors llama.cpp's sources, so the build needs nothing but pip, cmake and a C++ compiler:
`pip download --no-binary :all: --no-deps llama-cpp-python` fetches it, cmake builds only the
`llama-server` target (about 20 minutes on 2 cores). Binary and sources are cached outside the
repository (DRAFTGATE_CACHE_DIR or ~/.cache/draftgate): llama.cpp code never enters this project.

Only HTTP and processes: nothing of engine/ or gateway/ is imported. The embedded GGUF path is
asked of the installed product in a child interpreter (`engine.model.resolve`), so there is one
definition of where the model lies.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx

LLAMA_SERVER_ENV = "DRAFTGATE_LLAMA_SERVER"  # an explicit binary wins over everything else
CACHE_ENV = "DRAFTGATE_CACHE_DIR"  # shared with kernels/cpu
SDIST_PACKAGE = "llama-cpp-python"

# Options that keep the build small and offline: no tests/examples, no HTTPS or curl (the server
# is reached on localhost), no web UI (its assets would be downloaded), static so the binary
# moves alone. Instruction sets are named rather than GGML_NATIVE: on this machine -march=native
# turns on ggml's AMX kernels, whose first tile instruction dies of SIGILL (the kernel here does
# not grant ggml's threads the AMX state), so the peer gets AVX2 and AVX-512 (VNNI, BF16), the
# fastest of its CPU paths that runs here.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VBMI=ON",
    "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "draftgate")
    return Path(root)


def build_key() -> str:
    """A short hash of this CPU's instruction-set flags and the build options: a cached binary
    built for other instructions (a VM moved to another host) or with other options is never
    handed out; each key gets its own build folder and binary."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        pass
    text = " ".join(sorted(flags.split())) + "|" + " ".join(CMAKE_OPTIONS)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cached_binary_path() -> Path:
    return cache_dir() / f"llama-server-{build_key()}"


def find_llama_server() -> Path | None:
    """An existing llama-server: $DRAFTGATE_LLAMA_SERVER, the cached build, then $PATH."""
    explicit = os.environ.get(LLAMA_SERVER_ENV)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{LLAMA_SERVER_ENV}={explicit} is not an executable file")
        return path
    cached = cached_binary_path()
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def _run_logged(command: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(command)}\n")
        sink.flush()
        completed = subprocess.run(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT)
    if completed.returncode != 0:
        raise RuntimeError(f"{command[0]} failed (exit {completed.returncode}); see {log}")


def _download_sdist(work: Path, log: Path) -> Path:
    existing = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not existing:
        _run_logged(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             SDIST_PACKAGE, "-d", str(work)],
            log,
        )
        existing = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not existing:
        raise FileNotFoundError(f"pip download left no llama_cpp_python sdist in {work}")
    return existing[-1]


def _unpack_sources(sdist: Path, work: Path) -> Path:
    root = work / sdist.name[: -len(".tar.gz")]
    sources = root / "vendor" / "llama.cpp"
    if not (sources / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
    if not (sources / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{sdist.name} vendors no llama.cpp sources at {sources}")
    return sources


def build_llama_server(jobs: int = 2, nice: int = 10) -> Path:
    """Build `llama-server` from the llama-cpp-python sdist; returns the cached binary.

    Re-running resumes an interrupted build (cmake's build folder is kept in the cache).
    """
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"building llama-server needs {tool} on PATH")
    work = cache_dir() / "llama-src"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    sources = _unpack_sources(_download_sdist(work, log), work)
    build = work / f"build-{build_key()}"
    # `nice` because the machine's cores are shared: the build yields to interactive work.
    niced = ["nice", "-n", str(nice)] if shutil.which("nice") else []
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run_logged(["cmake", "-S", str(sources), "-B", str(build), *generator, *CMAKE_OPTIONS], log)
    _run_logged(
        [*niced, "cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], log
    )
    built = build / "bin" / "llama-server"
    if not built.is_file():
        raise FileNotFoundError(f"the build finished but {built} is missing; see {log}")
    target = cached_binary_path()
    shutil.copy2(built, target)
    return target


def ensure_llama_server(build_if_missing: bool = True) -> Path:
    found = find_llama_server()
    if found is not None:
        return found
    if not build_if_missing:
        raise FileNotFoundError(
            f"no llama-server found (set {LLAMA_SERVER_ENV}, or run `python -m scenarios.llama_cpp build`)"
        )
    print("llama-server not found: building it from the llama-cpp-python sdist (~20 min on 2 cores)...",
          file=sys.stderr, flush=True)
    return build_llama_server()


def embedded_gguf_path(python: str = sys.executable) -> str:
    """The product's embedded GGUF, asked of the installed product in a child interpreter."""
    completed = subprocess.run(
        [python, "-c", "from engine.model.resolve import embedded_gguf_path as p; print(p())"],
        capture_output=True, text=True, check=False,
    )
    if completed.returncode != 0:
        raise FileNotFoundError(f"cannot locate the embedded GGUF: {completed.stderr.strip()[-500:]}")
    return completed.stdout.strip()


def llama_server_command(
    binary: Path, gguf: str, port: int, parallel: int, threads: int = 2, context_per_slot: int = 4096,
) -> list[str]:
    """The peer's command line: same GGUF, same threads, one slot per concurrent user.

    llama-server splits --ctx-size evenly over its slots, so the total grows with --parallel to
    give every slot the same context. Continuous batching is on by default (-cb spelled out).
    """
    return [
        str(binary), "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--parallel", str(parallel), "--ctx-size", str(context_per_slot * parallel),
        "--cont-batching", "--metrics", "--jinja", "--no-webui",
    ]


def wait_until_healthy(url: str, process: subprocess.Popen[bytes], timeout_seconds: float = 120.0) -> None:
    """Wait for GET {url}/health to answer 200 (llama-server answers 503 while loading)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_seconds:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scenarios.llama_cpp", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="find llama-server or build it; print its path")
    build.add_argument("--force", action="store_true", help="rebuild even when a binary is found")
    build.add_argument("--jobs", type=int, default=2)
    serve = commands.add_parser("serve", help="run llama-server on the embedded GGUF (foreground)")
    serve.add_argument("--gguf", default=None, help="GGUF file (default: the embedded model)")
    serve.add_argument("--port", type=int, default=8090)
    serve.add_argument("--parallel", type=int, default=8)
    serve.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "build":
        binary = build_llama_server(jobs=args.jobs) if args.force else ensure_llama_server()
        print(binary)
        return 0
    binary = ensure_llama_server()
    command = llama_server_command(binary, args.gguf or embedded_gguf_path(), args.port, args.parallel, args.threads)
    print(" ".join(command), file=sys.stderr, flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    raise SystemExit(main())
