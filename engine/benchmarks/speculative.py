"""Speculative decoding benchmark: none, draft, suffix and hybrid side by side in one run.

    python -m engine.benchmarks.speculative [--draft PATH] [--max-tokens 128] [--write-docs]

Three workloads, each rendered with the model's chat template and decoded greedily (in float32
every method must produce the very same tokens, which the script checks; in bf16 it counts them):
- code: requests to write or modify Python code, some quoting code to change;
- chat: short open questions;
- agent: tool-loop turns: a system prompt with tools, earlier tool calls and their JSON results,
  and the model's next tool call or answer.
Single-stream: one request at a time; 8 streams: 8 requests in flight, each stream sending its
next prompt as soon as its last one finished (24 prompts per workload, 3 per stream). One engine per
method, loaded once; every method runs the same group of requests at once, their engine steps
interleaved (one step of each in turn) and each method's time the sum of its own steps, so this
machine's drift (tens of percent within seconds) hits every method alike; each round starts every
engine afresh (empty prefix cache, speculation reset: no suffix index of another round's
answers). With plain methods (no METHOD/N or METHOD@DTYPE) every engine is built with what all
of them need and switched to another method each round (LLM.set_speculative_method), so each
method runs on a different engine every round: engines doing the same work differ by a steady
few percent of their own. Output tokens/s over each method's own step time (median over
rounds), speedup over "none" (the median of the per-round ratios, and their range), acceptance
rate (accepted / drafted) and mean accepted length per verification, and the share of runner
time spent proposing. A control, a second engine without speculation measured like the methods, shows the
run's noise floor: its speedup over "none" would be 1.00x on a steady machine (--no-control
skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from engine.benchmarks.docs_section import write_section
from engine.config import DRAFT_WEIGHT_FORMATS, DTYPES, SPECULATIVE_METHODS
from engine.llm import LLM
from engine.model.resolve import EMBEDDED_MODEL_NAME
from engine.protocol import AddRequest
from engine.sampling_params import SamplingParams
from kernels.onednn_linear import onednn_bf16_available

# A second engine without speculation, measured like the methods: how far its speedup over "none"
# strays from 1.00x is the run's noise (bf16 on this machine, 2026-12-01: per round 0.97-1.02x at
# one stream, 0.96-1.09x at 8 streams, medians 0.98-1.02x).
CONTROL = "none (control)"

CODE_SNIPPET = '''def parse_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config
'''

# The code and chat prompts stay clear of what the shipped draft was trained on: their tasks and
# topics are drafts/data's held-out ones or in none of its lists (tests/engine/benchmarks checks
# this), so the draft's acceptance here is held-out acceptance, not recall of its training text.
CODE = [
    f"Add type hints and a docstring to this function, and return the whole function:\n\n{CODE_SNIPPET}",
    f"Rewrite this function so that it also accepts ':' as a separator. Show the full code.\n\n{CODE_SNIPPET}",
    "Write a Python function that checks whether a number is prime, with a docstring and tests.",
    "Write a Python function that finds the greatest common divisor of two numbers, with a docstring.",
    f"Rename the variable 'config' to 'settings' in this function and show the result:\n\n{CODE_SNIPPET}",
    "Write a Python function that checks whether two strings are anagrams, ignoring case and spaces.",
    "Write a Python script that reads a CSV file given on the command line and prints each row as a dictionary.",
    "Write a Python function that reverses a string, then show two example calls.",
    "Write a Python function that converts a hex color string such as '#ff8800' into an (r, g, b) tuple.",
    f"Make this function skip lines that have no '=' instead of failing, and show the full code.\n\n{CODE_SNIPPET}",
    "Write a Python function that returns the number of days between two dates given as 'YYYY-MM-DD' strings.",
    "Write a Python function that masks all but the last four characters of a credit card number.",
    f"Add a check to this function that raises FileNotFoundError with a clear message, and show the result."
    f"\n\n{CODE_SNIPPET}",
    "Write a Python class for a temperature sensor reading with a unit field and a method to compare two readings.",
    "Write a Python function that truncates a string to a given width and adds '...' when it was cut.",
    "Write a Python function that pads every line of a text block to the same width.",
    f"Change this function so that it returns the keys in lower case, and show the whole function.\n\n{CODE_SNIPPET}",
    "Write a Python function that checks whether a password has at least one digit, one upper case letter and "
    "eight characters.",
    "Write a Python function that builds a multiplication table as a list of lists.",
    "Write a Python function that returns the initials of a person's name, like 'Ada Lovelace' -> 'A.L.'.",
    f"Write unit tests with pytest for this function, using a temporary file.\n\n{CODE_SNIPPET}",
    "Write a Python function that turns a list of (name, score) pairs into a ranking, ties sharing a place.",
    "Write a Python function that counts how many times each HTTP status code appears in a list of log lines.",
    "Write a Python function that interleaves two lists element by element, keeping the rest of the longer one.",
]

CHAT = [
    "What is the capital of France, and what is it famous for?",
    "Give me three tips for learning to play the violin.",
    "Explain what inflation is in simple words.",
    "What are the main differences between cats and dogs as pets?",
    "What is honey made of, and why does it keep so long?",
    "Why is the sky blue?",
    "Suggest a name for a small bakery and explain why.",
    "What should I pack for a weekend hiking trip?",
    "How do I keep a sourdough starter alive?",
    "What is a good routine for a lazy Sunday morning?",
    "Explain what an insurance deductible is in simple words.",
    "Give me three ideas for a picnic lunch.",
    "Why do cats purr?",
    "How can I make a small bedroom feel bigger?",
    "What are some good questions to ask a new neighbor?",
    "Explain why bread goes stale.",
    "What should I look for when buying a used bike?",
    "Suggest a short poem topic for a child's birthday card.",
    "Why do onions make people cry?",
    "How do I politely decline an invitation?",
    "What is the best way to clean a cast iron pan?",
    "Give me three tips for a long car ride with kids.",
    "Why do some birds fly south for the winter?",
    "What makes a good name for a pet goldfish?",
]

TOOLS = [
    {"type": "function", "function": {"name": "get_air_quality", "description": "Current air quality of a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_files", "description": "Find files matching a pattern",
                                      "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                                                     "required": ["pattern"]}}},
]


CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Lisbon", "Prague",
          "Oslo", "Dublin", "Warsaw", "Athens", "Zurich", "Helsinki", "Brussels", "Budapest"]


def _agent_turns(count: int = 24) -> list[list[dict]]:
    """Agent conversations at their Nth tool-loop turn: earlier calls and results in the history.
    Each asks about its own list of 3-6 cities, so no two are alike: until 2026-12-06 the 8
    conversations were 4 distinct ones twice, and at one stream the second of a pair had its
    whole answer drafted from the first's (the suffix index of recent outputs), a repeat that
    agents' real turns do not offer."""
    system = ("You are an agent. To call a tool, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}"
              "</tool_call>. Tools:\n" + "\n".join(json.dumps(t["function"]) for t in TOOLS))
    conversations = []
    for i in range(count):
        # Consecutive cities from a rotating start, then every third one: distinct lists for 24.
        stride = 1 if i < len(CITIES) else 3
        start = 5 * i % len(CITIES)
        cities = [CITIES[(start + stride * j) % len(CITIES)] for j in range(i % 4 + 3)]
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": f"Check the air quality in {', '.join(cities)}, one call each."}]
        for city in cities[:-1]:
            call = json.dumps({"name": "get_air_quality", "arguments": {"city": city}})
            messages.append({"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"})
            result = json.dumps({"city": city, "aqi": 20 + 3 * len(city), "level": "good"})
            messages.append({"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"})
        conversations.append(messages)
    return conversations


def workloads(llm: LLM) -> dict[str, list[list[int]]]:
    def render(messages: list[dict]) -> list[int]:
        return llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                                    add_special_tokens=False)

    return {
        "code": [render([{"role": "user", "content": c}]) for c in CODE],
        "chat": [render([{"role": "user", "content": c}]) for c in CHAT],
        "agent": [render(m) for m in _agent_turns()],
    }


def _load(method: str, args: argparse.Namespace) -> LLM:
    """method: a speculative method, or METHOD/CAP with its own cap (the draft model's for
    draft, the suffix's for suffix and hybrid), and @DTYPE its own draft dtype, or @bf16 / @int8 /
    @dtype its own draft_weights (see --methods)."""
    options = {"num_speculative_tokens": args.num_speculative_tokens, "num_suffix_tokens": args.num_suffix_tokens,
               "draft_dtype": args.draft_dtype}
    method, _, draft_option = method.partition("@")
    if draft_option in DRAFT_WEIGHT_FORMATS:
        options["draft_weights"] = draft_option
    elif draft_option:
        options["draft_dtype"] = draft_option
    method, _, cap = method.partition("/")
    if cap:
        options["num_speculative_tokens" if method == "draft" else "num_suffix_tokens"] = int(cap)
    options["speculative"] = method
    if method in ("draft", "hybrid") and args.draft:
        options["draft"] = args.draft
    llm = LLM(dtype=args.dtype, kv_cache_memory=args.kv_cache_memory, **options)
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    return llm


def _measure_round(engines: dict[str, LLM], prompts: list[list[int]], streams: int, params: SamplingParams,
                   rotation: int) -> dict[str, tuple[dict, list[list[int]]]]:
    """One round of one workload at one stream count: `streams` streams, stream s sending prompts
    s, s + streams, ... one after another, each as soon as its previous one finished (a fixed
    concurrency, like vLLM's --max-concurrency): one prompt at a time at 1 stream, and all of them
    at once when there are as many prompts as streams. Every method runs the same prompts, and
    the methods' engine steps interleave, one step of each in turn (the first to go rotates),
    each engine's time being the sum of its own steps (and of submitting its requests). This
    machine's speed drifts by tens of percent within seconds; a step is tens of milliseconds, so
    every method's steps see the same machine, where taking turns group by group (seconds apart)
    left the per-round ratios of two engines doing identical work spread over 0.81-1.10x at 8
    streams. Each method starts the round as a fresh engine would (empty prefix cache,
    speculation forgetting earlier rounds) and keeps, like a server, what this round's earlier
    requests taught it.

    Until 2026-12-06 a batch was a group of `streams` prompts submitted together, the next group
    once all had finished: a group lasted as long as its longest answer, so tokens that
    speculation gained for its shorter answers bought no time (at 8 chat streams, 5 of 8 answers
    ran to max_tokens), which measured how long a batch takes to drain rather than a stream's
    throughput."""
    methods = list(engines)
    samples = {m: {"tokens": 0, "seconds": 0.0} for m in methods}
    outputs: dict[str, list[list[int]]] = {m: [[] for _ in prompts] for m in methods}
    ids = [f"bench-{rotation}-{i}" for i in range(len(prompts))]
    index_of = {request_id: i for i, request_id in enumerate(ids)}
    queues = {m: [list(range(s, len(prompts), streams)) for s in range(streams)] for m in methods}
    before = {}
    for method, llm in engines.items():
        llm.reset_prefix_cache()
        llm.reset_speculation()
        before[method] = llm.stats()

    def submit(method: str, stream: int) -> None:
        """The stream's next prompt, if it has one left."""
        if not queues[method][stream]:
            return
        i = queues[method][stream].pop(0)
        error = engines[method].engine.add_request(AddRequest(request_id=ids[i], prompt_token_ids=prompts[i],
                                                              sampling_params=params, arrival_time=time.monotonic()))
        if error is not None:
            raise RuntimeError(f"{method} refused a benchmark prompt: {error.error}")

    for method in methods:
        started = time.perf_counter()
        for stream in range(streams):
            submit(method, stream)
        samples[method]["seconds"] += time.perf_counter() - started
    running = set(methods)
    turn = rotation
    while running:
        shift = turn % len(methods)  # nobody always goes first
        turn += 1
        for method in methods[shift:] + methods[:shift]:
            if method not in running:
                continue
            engine = engines[method].engine
            started = time.perf_counter()
            deltas = engine.step()
            for delta in deltas:
                if delta.error is not None:
                    raise RuntimeError(f"{method}: {delta.error}")
                i = index_of[delta.request_id]
                outputs[method][i] += delta.new_token_ids
                if delta.finish_reason is not None:
                    submit(method, i % streams)
            samples[method]["seconds"] += time.perf_counter() - started
            if not engine.has_unfinished_requests():
                running.discard(method)
    for method in methods:
        samples[method]["tokens"] = sum(len(tokens) for tokens in outputs[method])
    measured = {}
    for method, llm in engines.items():
        after, first = llm.stats(), before[method]
        samples[method].update(
            drafted=after.spec_num_draft_tokens - first.spec_num_draft_tokens,
            accepted=after.spec_num_accepted_tokens - first.spec_num_accepted_tokens,
            verifications=after.spec_num_drafts - first.spec_num_drafts,
            proposer_seconds=after.spec_proposer_seconds - first.spec_proposer_seconds,
            runner_seconds=after.runner_seconds - first.runner_seconds,
        )
        measured[method] = (samples[method], outputs[method])
    return measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default=None, help="draft model (default: the shipped draft)")
    parser.add_argument("--methods", default="none,draft,suffix,hybrid",
                        help="comma-separated; METHOD/N gives a method its own cap, side by side with the "
                             "others (draft/N: the draft model's; suffix/N, hybrid/N: the suffix's), e.g. "
                             "none,suffix/4,suffix; METHOD@DTYPE its own draft dtype, e.g. hybrid@float32,hybrid, "
                             "and METHOD@bf16 / @int8 / @dtype its own draft_weights, e.g. hybrid@bf16,hybrid@int8")
    parser.add_argument("--draft-dtype", default="auto", choices=DTYPES,
                        help="the draft's dtype (auto: the target's, bfloat16 under a float32 target where "
                             "dtype auto takes bfloat16)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=4, help="the draft model's cap")
    parser.add_argument("--num-suffix-tokens", type=int, default=16, help="suffix matching's cap")
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--workloads", default="code,chat,agent")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts per workload at one stream")
    parser.add_argument("--batched-prompts", type=int, default=24,
                        help="prompts per workload at more than one stream, shared out among the streams "
                             "(with as many prompts as streams, all of them are submitted at once)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-memory", default="1GiB", help="KV budget of each method's engine")
    parser.add_argument("--rounds", type=int, default=3, help="single-stream rounds (medians over them)")
    parser.add_argument("--batched-rounds", type=int, default=5,
                        help="rounds at more than one stream (with the control and all four methods, 5 runs "
                             "each method once on each of the 5 engines)")
    parser.add_argument("--no-control", action="store_true",
                        help=f"skip the control ('{CONTROL}': a second engine without speculation, whose "
                             f"speedup over 'none' shows the run's noise floor)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--docs-section", default="speculative-benchmark",
                        help="the marked section of docs/benchmarks.md that --write-docs rewrites")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    if "none" not in methods:
        methods.insert(0, "none")  # the reference of every speedup and output comparison
    if not args.no_control:
        methods.insert(methods.index("none") + 1, CONTROL)
    stream_counts = [int(s) for s in args.streams.split(",")]
    names = args.workloads.split(",")
    if unknown := set(names) - {"code", "chat", "agent"}:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))} (code, chat, agent)")
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    # One engine per method, all loaded at once (the model is small), so that their steps can
    # interleave; tokens/s is the median over rounds, acceptance pools all rounds. The first
    # engine a process loads ran 1-1.5% slower than later ones doing the same work (two "none"
    # engines side by side, 6 rounds, in either load order; cause not found), which favoured
    # every method over "none", loaded first: a throwaway engine takes that place.
    throwaway = _load("none", args)
    # Engines that do the same work also differ by themselves, each by its own steady amount
    # (six engines without speculation, 8 chat streams, bf16, 2026-12-03: up to 5% apart over a
    # run, the same one ahead in every round). When every method is a plain one, every engine is
    # built with all the parts the methods need and, round by round, switched to each method in
    # turn (LLM.set_speculative_method), so that a method's rounds run on different engines and
    # no method keeps a fast or a slow one.
    rotate = all(method in SPECULATIVE_METHODS or method == CONTROL for method in methods)
    if rotate:
        built = ("hybrid" if any(m in ("draft", "hybrid") for m in methods)
                 else "suffix" if "suffix" in methods else "none")
        instances = [_load(built, args) for _ in methods]
        engines = dict(zip(methods, instances))
    else:
        engines = {method: _load("none" if method == CONTROL else method, args) for method in methods}
    del throwaway
    reference_llm = engines["none"]
    dtype = str(reference_llm.engine.runner.dtype).removeprefix("torch.")
    draft_dtypes = sorted({str(llm.engine.runner.draft_dtype).removeprefix("torch.")
                           + (f" over {llm.engine.runner.draft_held_weights}-held weights"
                              if llm.engine.runner.draft_held_weights else "")
                           for llm in engines.values() if llm.engine.runner.draft is not None})
    prompts_by_workload = workloads(reference_llm)
    samples: dict[tuple[str, str, int], list[dict]] = {}
    rotation = 0
    for round_index in range(max(args.rounds, args.batched_rounds)):
        for cell, (name, streams) in enumerate((n, st) for n in names for st in stream_counts):
            if round_index >= (args.rounds if streams == 1 else args.batched_rounds):
                continue
            prompts = prompts_by_workload[name][: args.num_prompts if streams == 1 else args.batched_prompts]
            if rotate:  # each round, every method on the next engine
                shift = round_index + cell
                engines = {method: instances[(k + shift) % len(instances)] for k, method in enumerate(methods)}
                for method, llm in engines.items():
                    llm.set_speculative_method("none" if method == CONTROL else method)
            measured = _measure_round(engines, prompts, streams, params, rotation)
            rotation += 1
            reference = measured["none"][1]
            for method, (sample, outputs) in measured.items():
                if outputs != reference and dtype == "float32":
                    raise RuntimeError(f"{method} changed the greedy output of {name} at {streams} streams")
                # In bf16 a verification forward over k + 1 tokens rounds differently from k + 1
                # one-token forwards, so a near-tie may flip the argmax: counted, not an error.
                sample["identical"] = sum(a == b for a, b in zip(outputs, reference))
                sample["num_outputs"] = len(outputs)
                samples.setdefault((method, name, streams), []).append(sample)

    lines = [
        "| workload | streams | method | output tokens/s | speedup | speedup range | wall-clock speedup | acceptance "
        "| mean accepted length | proposer share | outputs identical to none |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        for streams in stream_counts:
            base = samples[("none", name, streams)]
            for method in methods:
                runs = samples[(method, name, streams)]
                tps = statistics.median(s["tokens"] / s["seconds"] for s in runs)
                # Tokens/s ratio: in bf16 the outputs (and so their lengths) may differ from none's.
                # Round by round (each round's methods ran side by side, their steps interleaved):
                # the speedup is the median of these paired ratios, not a ratio of medians.
                ratios = [(r["tokens"] / r["seconds"]) / (b["tokens"] / b["seconds"]) for r, b in zip(runs, base)]
                # The same requests' wall-clock: none's seconds over the method's (in bf16 an output
                # whose length diverged from none's also changed the work: tokens/s prices it).
                wall = [b["seconds"] / r["seconds"] for r, b in zip(runs, base)]
                drafted = sum(s["drafted"] for s in runs)
                accepted = sum(s["accepted"] for s in runs)
                verifications = sum(s["verifications"] for s in runs)
                acc = f"{accepted / drafted:.2f}" if drafted else "-"
                mal = f"{accepted / verifications + 1:.2f}" if verifications else "-"
                share = sum(s["proposer_seconds"] for s in runs) / max(sum(s["runner_seconds"] for s in runs), 1e-9)
                identical = sum(s["identical"] for s in runs)
                total = sum(s["num_outputs"] for s in runs)
                lines.append(f"| {name} | {streams} | {method} | {tps:.1f} | {statistics.median(ratios):.2f}x | "
                             f"{min(ratios):.2f}-{max(ratios):.2f}x | {statistics.median(wall):.2f}x | "
                             f"{acc} | {mal} | {share:.0%} | "
                             f"{identical}/{total} |")
    table = "\n".join(lines)
    rotation_note = (" (each engine built with the parts every method needs and switched to another method "
                     "every round, so each method's rounds ran on different engines)" if rotate else "")
    header = (f"Greedy, max_tokens={args.max_tokens}, num_speculative_tokens={args.num_speculative_tokens} "
              f"(draft model), num_suffix_tokens={args.num_suffix_tokens} (suffix), "
              f"adaptive, {args.num_prompts} prompts per workload at 1 stream and {args.batched_prompts} at more, "
              f"{EMBEDDED_MODEL_NAME} in {dtype}; one engine per method{rotation_note}, every method running the "
              f"same prompts at once, each stream sending its next prompt as soon as its last one finished (a fixed "
              f"concurrency), the engines' steps interleaved one by one and "
              f"each method's seconds the sum of its own steps; tokens/s: the median over {args.rounds} rounds at 1 "
              f"stream and {args.batched_rounds} at more; speedup: the median of the per-round ratios to none, "
              f"with their range; wall-clock speedup: the median of none's seconds over the method's for the "
              f"same requests (acceptance over all rounds); '{CONTROL}': a second engine without speculation, "
              f"measured like the methods (its speedup is the run's noise floor); "
              f"draft: {args.draft or 'the shipped draft'}, in {' / '.join(draft_dtypes) or '-'}. In "
              f"float32 every method's outputs must equal 'none' (the run stops otherwise); in bf16 the last "
              f"column counts them (see the note below the table).")
    print(header + "\n\n" + table)
    if args.write_docs:
        _write_docs(header, table, argv, args.docs_section, dtype)


def _write_docs(header: str, table: str, argv: list[str] | None, section: str, dtype: str) -> None:
    command = "python -m engine.benchmarks.speculative " + " ".join(sys.argv[1:] if argv is None else argv)
    # The vector ISA and native bf16 decide what drafts and verification rows cost (an AVX2-only
    # EPYC runs float32 with a verified row several times dearer than an AVX512-BF16 one in bf16).
    isa = torch.backends.cpu.get_cpu_capability()
    bf16 = "native bf16" if onednn_bf16_available() else "no native bf16"
    machine = f"{platform.machine()} ({isa}, {bf16}), {os.cpu_count()} CPU threads, torch {torch.__version__}"
    if dtype == "float32":
        note = ("In float32 every method's outputs equal those of 'none' (the run checks it), so each ratio "
                "compares the time of the very same tokens.")
    else:
        note = ("Outputs that differ from 'none' in bf16 are rounding, not lost exactness: a verification "
                "forward over k + 1 tokens rounds differently from k + 1 one-token forwards, and a near-tie "
                "flips the argmax; in float32 the outputs are identical (tests/engine/spec_decode). An output "
                "that diverged may end sooner or later than none's, so the method did other work for those "
                "requests: tokens/s counts what it produced in its time, while the wall-clock speedup, the "
                "time to finish the same requests, counts it as the same work.")
    write_section(section,
                  f"## Speculative decoding: none, draft, suffix, hybrid ({dtype})\n\nCommand: `{command.strip()}`\n\n"
                  f"Machine: {machine}. Measured {time.strftime('%Y-%m-%d')}.\n\n{header}\n\n{table}\n\n{note}")


if __name__ == "__main__":
    main()
