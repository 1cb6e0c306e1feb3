"""The offline benchmark runs end to end at a tiny size, so it cannot rot between real runs."""

from __future__ import annotations

import pytest

from engine.benchmarks.offline import main


def test_offline_benchmark_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--num-requests", "3", "--min-len", "8", "--max-len", "12", "--decode-tokens", "8",
          "--ttft-prompt-len", "40", "--hf-batch-size", "2", "--dtypes", "float32"])
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| float32"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and float(cells[2]) > 0  # both systems produced tokens
    assert cells[3].endswith("x**")
