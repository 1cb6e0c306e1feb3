"""Simulated tools for agent transcripts: plausible results for the calls the target writes.

File tools answer from the Python standard library (real file contents, real listings, real
grep hits), so tool-loop transcripts carry the long verbatim code an agent's context really
holds; the other tools answer with small JSON documents drawn from a seeded generator.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import operator
import os
import random
import re
from typing import Any

from gateway.tools import TOOL_CALL_END, TOOL_CALL_START

from drafts.data.prompts import TOOL_TASKS
from drafts.data.stdlib import SourceFile, read_source

SAFE_SNIPPETS = frozenset(value for tool, _, values in TOOL_TASKS if tool == "run_python" for value in values)

MAX_FILE_LINES = 60
MAX_GREP_HITS = 8

_CONDITIONS = ("sunny", "cloudy", "light rain", "overcast", "snow", "thunderstorms", "windy", "fog")
_BIN_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
            ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv}


def parse_tool_call(text: str) -> tuple[str, Any] | None:
    """(name, arguments) of the first <tool_call>{json}</tool_call> in text, else None."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return None
    body = text[start + len(TOOL_CALL_START):]
    end = body.find(TOOL_CALL_END)
    if end >= 0:
        body = body[:end]
    try:
        call = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    return call["name"], call.get("arguments", {})


class ToolSimulator:
    """Answers calls. files: the stdlib files of this split (read_file, list_directory, grep)."""

    def __init__(self, files: list[SourceFile], seed: int) -> None:
        self._files = {f.relative_path: f for f in files}
        self._dirs: dict[str, list[str]] = {}
        for path in self._files:
            folder = os.path.dirname(path) or "."
            self._dirs.setdefault(folder, []).append(os.path.basename(path))
        self._rng = random.Random(seed)

    @property
    def file_paths(self) -> list[str]:
        return sorted(self._files)

    @property
    def dir_paths(self) -> list[str]:
        return sorted(d for d in self._dirs if d != ".")

    def run(self, name: str, arguments: Any) -> str:
        if not isinstance(arguments, dict):
            return json.dumps({"error": "arguments must be a JSON object"})
        handler = getattr(self, f"_tool_{name}", None)
        if handler is None:
            return json.dumps({"error": f"unknown tool {name!r}"})
        try:
            return handler(arguments)
        except (KeyError, TypeError, ValueError) as error:
            return json.dumps({"error": f"bad arguments: {error}"})

    # ---- file tools: real stdlib content --------------------------------------------------------
    def _tool_read_file(self, args: dict[str, Any]) -> str:
        path = str(args["path"]).lstrip("./")
        file = self._files.get(path)
        text = read_source(file) if file is not None else None
        if text is None:
            return json.dumps({"error": f"no such file: {args['path']}"})
        return "".join(text.splitlines(keepends=True)[:MAX_FILE_LINES])

    def _tool_list_directory(self, args: dict[str, Any]) -> str:
        folder = str(args.get("path", ".")).strip("/") or "."
        names = self._dirs.get(folder)
        if names is None:
            return json.dumps({"error": f"no such directory: {folder}"})
        return "\n".join(sorted(names)[:40])

    def _tool_grep(self, args: dict[str, Any]) -> str:
        pattern = re.compile(re.escape(str(args["pattern"])))
        hits: list[str] = []
        paths = sorted(self._files)
        self._rng.shuffle(paths)
        for path in paths[:200]:
            text = read_source(self._files[path]) or ""
            for number, line in enumerate(text.splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path}:{number}: {line.strip()}")
                    if len(hits) >= MAX_GREP_HITS:
                        return "\n".join(hits)
        return "\n".join(hits) if hits else "no matches"

    # ---- everything else: small seeded JSON documents ------------------------------------------------
    def _tool_get_weather(self, args: dict[str, Any]) -> str:
        unit = args.get("unit", "celsius")
        temperature = self._rng.randint(-5, 35)
        if unit == "fahrenheit":
            temperature = round(temperature * 9 / 5 + 32)
        return json.dumps({"city": args["city"], "temperature": temperature, "unit": unit,
                           "condition": self._rng.choice(_CONDITIONS), "humidity": self._rng.randint(20, 95)})

    def _tool_search_web(self, args: dict[str, Any]) -> str:
        query = str(args["query"])
        count = min(int(args.get("num_results", 3) or 3), 5)
        sites = ("wikipedia.org", "example.com", "docs.python.org", "news.example.net", "blog.example.org")
        results = [{"title": f"{query.title()} - {site.split('.')[0].title()}",
                    "url": f"https://{site}/{re.sub(r'[^a-z0-9]+', '-', query.lower()).strip('-')}",
                    "snippet": f"An overview of {query}, with details and examples."}
                   for site in self._rng.sample(sites, count)]
        return json.dumps({"results": results})

    def _tool_run_python(self, args: dict[str, Any]) -> str:
        code = str(args["code"]).strip()
        # Only the snippets our own prompts ask for run (model-written code could loop forever
        # or touch the machine); anything else gets a sandbox refusal, which agents also see.
        if code not in SAFE_SNIPPETS:
            return json.dumps({"error": "this sandbox only runs approved snippets"})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, {})  # noqa: S102 - one of SAFE_SNIPPETS, all written in prompts.py
        return out.getvalue() or "(no output)"

    def _tool_calculator(self, args: dict[str, Any]) -> str:
        expression = str(args["expression"])
        return json.dumps({"expression": expression, "result": _arithmetic(expression)})

    def _tool_send_email(self, args: dict[str, Any]) -> str:
        return json.dumps({"status": "sent", "to": args["to"], "message_id": f"msg_{self._rng.randrange(16**8):08x}"})

    def _tool_get_stock_price(self, args: dict[str, Any]) -> str:
        return json.dumps({"symbol": str(args["symbol"]).upper(), "price": round(self._rng.uniform(20, 900), 2),
                           "currency": "USD", "change_percent": round(self._rng.uniform(-4, 4), 2)})

    def _tool_create_event(self, args: dict[str, Any]) -> str:
        return json.dumps({"status": "created", "title": args["title"], "date": args["date"],
                           "time": args.get("time", "all day"), "event_id": self._rng.randrange(10**6)})


def _arithmetic(expression: str) -> float | int | str:
    """+ - * / % // ** (small operands only) and parentheses over numbers, nothing else."""
    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            return _BIN_OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base, exponent = evaluate(node.left), evaluate(node.right)
            if abs(base) > 1e6 or abs(exponent) > 64:
                raise ValueError("power too large")
            return base ** exponent
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -evaluate(node.operand)
        raise ValueError("unsupported expression")

    try:
        value = evaluate(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return "error: could not evaluate"
    return int(value) if float(value).is_integer() else round(value, 6)
