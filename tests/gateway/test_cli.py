"""`draftgate serve`: every flag documented, options -> GatewayConfig, clear errors before serving."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.cli import build_parser, config_from_args, main


def serve_parser():
    parser = build_parser()
    [subparsers] = [a for a in parser._actions if a.dest == "command"]
    return subparsers.choices["serve"]


def test_help_documents_every_flag() -> None:
    help_text = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--help"], capture_output=True,
                               text=True, check=True).stdout
    for action in serve_parser()._actions:
        for flag in action.option_strings:
            assert flag in help_text
        assert action.help, f"{action.option_strings} has no help"
    for flag in ("--model", "--draft", "--host", "--port", "--api-key", "--max-waiting-requests",
                 "--max-waiting-tokens", "--shutdown-timeout"):
        assert flag in help_text


def test_no_arguments_serve_the_embedded_model_on_localhost_8000() -> None:
    config = config_from_args(build_parser().parse_args(["serve"]), environ={})
    assert (config.host, config.port) == ("127.0.0.1", 8000)
    assert config.engine.model.model is None and config.api_keys == ()
    assert not config.engine_in_process
    # The embedded model has a shipped draft: hybrid speculation (draft model + suffix) by default.
    assert config.engine.speculative.method == "hybrid" and config.engine.speculative.draft_model is None


def test_speculation_defaults_to_suffix_without_a_draft_and_to_hybrid_with_one(tmp_path) -> None:
    other = tmp_path / "other-model.gguf"
    other.write_bytes(b"GGUF")
    def method(*argv: str) -> str:
        return config_from_args(build_parser().parse_args(["serve", "--model", str(other), *argv]),
                                environ={}).engine.speculative.method
    assert method() == "suffix"  # no shipped draft for another model: model-free drafting
    assert method("--draft", str(tmp_path)) == "hybrid"
    assert method("--speculative", "none") == "none"


def test_options_and_environment_keys() -> None:
    args = build_parser().parse_args([
        "serve", "--api-key", "a", "--api-key", "b", "--max-waiting-requests", "7", "--max-body-size", "2MiB",
        "--shutdown-timeout", "3", "--max-num-seqs", "8", "--kv-cache-memory", "64MiB", "--served-model-name", "x"])
    config = config_from_args(args, environ={"DRAFTGATE_API_KEYS": " c, ,d "})
    assert config.api_keys == ("a", "b", "c", "d")
    assert config.max_waiting_requests == 7 and config.max_body_bytes == 2 << 20 and config.shutdown_timeout == 3
    assert config.engine.scheduler.max_num_seqs == 8 and config.engine.cache.kv_cache_memory_bytes == 64 << 20
    assert config.served_model_names == ("x",)


def test_speculation_caps() -> None:
    def caps(*argv: str) -> tuple[int, int]:
        spec = config_from_args(build_parser().parse_args(["serve", *argv]), environ={}).engine.speculative
        return spec.num_speculative_tokens, spec.num_suffix_tokens
    assert caps() == (4, 16)
    assert caps("--num-speculative-tokens", "3", "--num-suffix-tokens", "24") == (3, 24)


def test_suffix_corpus_option() -> None:
    def corpus(*argv: str) -> str | None:
        return config_from_args(build_parser().parse_args(["serve", *argv]), environ={}).engine.speculative.suffix_corpus
    assert corpus() is None  # the shipped one, for the embedded model
    assert corpus("--suffix-corpus", "none") == "none"


def test_draft_dtype_option() -> None:
    def draft_dtype(*argv: str) -> str:
        return config_from_args(build_parser().parse_args(["serve", *argv]), environ={}).engine.speculative.draft_dtype
    assert draft_dtype() == "auto"
    assert draft_dtype("--draft-dtype", "float32") == "float32"


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--num-suffix-tokens", "0"], "num_suffix_tokens"),
    (["serve", "--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
    (["serve", "--draft", "/some/draft"], "/some/draft"),
    (["serve", "--suffix-corpus", "/some/corpus.npy"], "/some/corpus.npy"),
    (["serve", "--speculative", "none", "--draft", "drafts/smollm2-135m-eagle"], "draft"),
    (["serve", "--max-body-size", "lots"], "max_body_size"),
    (["serve", "--port", "70000"], "port"),
])
def test_bad_options_fail_before_serving(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
