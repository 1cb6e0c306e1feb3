"""`make bench` runs level by level, every system in turn with a rotating order; draftgate's
servers are started once and kept, llama.cpp's per level. (Servers and Locust are replaced by
recorders here: what is tested is the order and the server lifetimes.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scenarios import bench


class FakeServer:
    def __init__(self, name: str, users: int, log: list) -> None:
        self.name, self.users, self.log = name, users, log
        log.append(("start", name, users))

    def stop(self) -> None:
        self.log.append(("stop", self.name, self.users))


def test_levels_take_turns_and_servers_live_as_long_as_they_should(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    log: list = []
    monkeypatch.setattr(bench, "start_server", lambda spec, users, threads, gguf, out: FakeServer(spec.name, users, log))

    def measure(spec, server, label, users, seconds, mix, seed, out, extra):
        assert server.name == spec.name
        log.append(("run", spec.name, label, users, seed))
        return (spec.name, label, users)

    monkeypatch.setattr(bench, "measure", measure)
    specs = bench.system_specs(["draftgate", "draftgate+spec", "llama.cpp"], 2, [], [])
    args = argparse.Namespace(levels=[1, 2, 4], durations=[5, 5, 5], mix_seconds=10, mix_users=8,
                              mix="agent=1", seed=0, threads=2, locust_arg=[])
    results = bench.run_levels(specs, args, "model.gguf", tmp_path)
    runs = [entry[1:4] for entry in log if entry[0] == "run"]
    assert runs == [
        ("draftgate", "agent", 1), ("draftgate+spec", "agent", 1), ("llama.cpp", "agent", 1),
        ("draftgate+spec", "agent", 2), ("llama.cpp", "agent", 2), ("draftgate", "agent", 2),
        ("llama.cpp", "agent", 4), ("draftgate", "agent", 4), ("draftgate+spec", "agent", 4),
        ("draftgate", "mix", 8), ("draftgate+spec", "mix", 8), ("llama.cpp", "mix", 8),
    ]
    assert len(results) == 12
    # Each level's seed is the same for every system.
    seeds = {(entry[3], entry[2]): set() for entry in log if entry[0] == "run"}
    for entry in log:
        if entry[0] == "run":
            seeds[(entry[3], entry[2])].add(entry[4])
    assert all(len(s) == 1 for s in seeds.values())
    # draftgate's two servers: started once each; llama.cpp's: once per level and the mix, each
    # stopped before the next system runs; everything stopped at the end.
    starts = [entry[1:] for entry in log if entry[0] == "start"]
    assert starts.count(("draftgate", 1)) == 1 and starts.count(("draftgate+spec", 1)) == 1
    assert [s for s in starts if s[0] == "llama.cpp"] == [("llama.cpp", 1), ("llama.cpp", 2), ("llama.cpp", 4),
                                                         ("llama.cpp", 8)]
    for i, entry in enumerate(log):
        if entry[0] == "start" and entry[1] == "llama.cpp":
            following = log[i + 1:]
            stop = following.index(("stop", "llama.cpp", entry[2]))
            assert [e for e in following[:stop] if e[0] == "run"] == [following[0]]  # only its own run
    assert sum(1 for e in log if e[0] == "start") == sum(1 for e in log if e[0] == "stop")
