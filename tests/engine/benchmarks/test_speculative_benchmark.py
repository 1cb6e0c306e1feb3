"""The speculative benchmark runs end to end at a tiny size (and checks identical outputs)."""

from __future__ import annotations

import pytest

from engine.benchmarks.speculative import main


def test_speculative_benchmark_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--methods", "none,suffix", "--max-tokens", "8", "--num-prompts", "2", "--streams", "1,2", "--rounds", "1", "--batched-rounds", "2",
          "--dtype", "float32"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| agent")]
    assert len(rows) == 4  # 2 stream counts x 2 methods
    assert all(float(row.split("|")[4]) > 0 for row in rows)
