"""The speculative benchmark's code and chat prompts avoid the draft's training tasks and topics,
and its agent tools the tools of its training transcripts, so the draft's acceptance there is
held-out acceptance."""

from __future__ import annotations

from drafts.data import prompts as P
from drafts.data.stdlib import is_held_out
from engine.benchmarks.speculative import CHAT, CODE, TOOLS

HELD_OUT_PERCENT = 10.0  # drafts.data's default, which the shipped draft's data used


def test_benchmark_prompts_avoid_the_drafts_training_prompts() -> None:
    trained_tasks = [t for t in P.CODE_TASKS if not is_held_out("code:" + t, HELD_OUT_PERCENT)]
    trained_topics = [t for t in P.CHAT_TOPICS if not is_held_out("chat:" + t, HELD_OUT_PERCENT)]
    assert trained_tasks and trained_topics
    for prompt in CODE:
        words = set(prompt.lower().replace(",", " ").replace(".", " ").split())
        for task in trained_tasks:
            # A task is in the prompt when most of its words (those over 3 letters) are.
            content = [w for w in task.lower().split() if len(w) > 3]
            assert sum(w in words for w in content) < 2 / 3 * len(content), (prompt, task)
    for prompt in CHAT:
        lowered = prompt.lower()
        # Topics match by their main word ("the violin" -> "violin", "black holes" -> "black hole").
        assert not [t for t in trained_topics if t.lower().removeprefix("the ").rstrip("s") in lowered], prompt
    trained_tools = {tool for tool, _, _ in P.TOOL_TASKS}
    assert not trained_tools & {t["function"]["name"] for t in TOOLS}


def test_every_workload_has_24_distinct_prompts() -> None:
    """No prompt repeats within a workload: a repeated one's answer would be drafted whole from
    the first one's (the suffix index of recent outputs), a speedup no real traffic offers."""
    import json

    from engine.benchmarks.speculative import _agent_turns

    for prompts in (CODE, CHAT, [json.dumps(messages) for messages in _agent_turns()]):
        assert len(prompts) == len(set(prompts)) == 24
