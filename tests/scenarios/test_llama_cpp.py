"""Finding and starting the llama.cpp peer (the build itself is exercised by `make bench`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scenarios import llama_cpp


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\necho version: 1 (test)\n")
    path.chmod(0o755)
    return path


def test_the_command_matches_the_peer_setup_of_the_benchmark() -> None:
    command = llama_cpp.llama_server_command(Path("/bin/llama-server"), "/m.gguf", 8090, parallel=8, threads=2)
    flags = " ".join(command)
    assert command[0] == "/bin/llama-server"
    for expected in ("--model /m.gguf", "--port 8090", "--threads 2", "--threads-batch 2", "--parallel 8",
                     "--ctx-size 32768", "--cont-batching", "--metrics", "--jinja"):
        assert expected in flags


def test_an_explicit_binary_wins_and_a_wrong_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llama_cpp.CACHE_ENV, str(tmp_path / "cache"))
    binary = _executable(tmp_path / "my-llama-server")
    monkeypatch.setenv(llama_cpp.LLAMA_SERVER_ENV, str(binary))
    assert llama_cpp.find_llama_server() == binary
    monkeypatch.setenv(llama_cpp.LLAMA_SERVER_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=llama_cpp.LLAMA_SERVER_ENV):
        llama_cpp.find_llama_server()


def test_the_cached_build_is_found_before_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(llama_cpp.LLAMA_SERVER_ENV, raising=False)
    monkeypatch.setenv(llama_cpp.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert llama_cpp.find_llama_server() is None
    with pytest.raises(FileNotFoundError, match="no llama-server found"):
        llama_cpp.ensure_llama_server(build_if_missing=False)
    (tmp_path / "bin").mkdir()
    on_path = _executable(tmp_path / "bin" / "llama-server")
    assert llama_cpp.find_llama_server() == on_path
    cached = _executable(tmp_path / f"llama-server-{llama_cpp.build_key()}")
    assert llama_cpp.cached_binary_path() == cached and llama_cpp.find_llama_server() == cached


def test_the_embedded_gguf_is_asked_of_the_product() -> None:
    path = llama_cpp.embedded_gguf_path()
    assert path.endswith(".gguf") and os.path.isfile(path)
