"""How well a served model uses tools: with tool_choice "auto", how often it calls the right tool on asks that
need one and how often it calls any on asks that need none; with "required", how often the forced call names the
right tool. Greedy (temperature 0), one request at a time, through /v1/chat/completions as any client sends it.

    python -m gateway serve &                                   # the default model, SmolLM2-135M-Instruct
    python -m benchmarks.tool_choice_auto --url http://127.0.0.1:8000 --json tool-choice.json

Four tools (weather, local time, currency conversion, e-mail), 20 asks that one of them answers (5 each) and 20
that none does (facts, writing, chat). A call counts as right when its name is the expected tool's and its
arguments are a JSON object with every required parameter (a call cut off by --max-tokens is not); an ask that needs
none counts as called when the reply holds any call. `--limit N` runs the first N asks of each list (a quick look,
or the CPU smoke test).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import openai


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in properties.items()}, "required": list(properties)}}}


TOOLS = [
    _tool("get_weather", "Get the current weather in a city", city="string"),
    _tool("get_time", "Get the current local time in a city", city="string"),
    _tool("convert_currency", "Convert an amount of money from one currency to another", amount="number",
          from_currency="string", to_currency="string"),
    _tool("send_email", "Send an email", to="string", subject="string", body="string"),
]
NEEDS_TOOL = [
    ("What is the weather in Paris?", "get_weather"), ("Is it raining in London right now?", "get_weather"),
    ("How hot is it in Tokyo today?", "get_weather"), ("Tell me the current weather in Berlin.", "get_weather"),
    ("Will I need an umbrella in Seattle today?", "get_weather"),
    ("What time is it in New York?", "get_time"), ("What is the local time in Sydney?", "get_time"),
    ("Tell me the current time in Madrid.", "get_time"), ("Is it morning or evening in Tokyo right now?", "get_time"),
    ("What's the time in Cairo?", "get_time"),
    ("Convert 100 US dollars to euros.", "convert_currency"), ("How many yen is 50 euros?", "convert_currency"),
    ("Convert 20 GBP to USD.", "convert_currency"),
    ("What is 300 Canadian dollars in Swiss francs?", "convert_currency"),
    ("Exchange 75 euros into British pounds.", "convert_currency"),
    ("Send an email to bob@example.com saying the meeting is at 3pm.", "send_email"),
    ("Email alice@example.com with the subject Lunch and ask if she is free.", "send_email"),
    ("Please send a thank-you email to my boss at boss@example.com.", "send_email"),
    ("Write and send an email to team@example.com about the release.", "send_email"),
    ("Send a message by email to carol@example.com that I will be late.", "send_email"),
]
NEEDS_NONE = [
    "Who wrote Hamlet?", "Write a haiku about the sea.", "What is the capital of Italy?",
    "Explain photosynthesis in one sentence.", "Tell me a joke.", "What is 12 times 12?",
    "Give me three tips for better sleep.", "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into French.", "Hello! How are you?", "Name three primary colours.",
    "Why is the sky blue?", "Summarise the plot of Romeo and Juliet in one sentence.", "What does a CPU do?",
    "Suggest a name for a pet cat.", "How many legs does a spider have?", "What is a prime number?",
    "Write one sentence about autumn.", "Who painted the Mona Lisa?", "What is the largest planet in the solar system?",
]
_REQUIRED = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}


def right_call(calls: Sequence[Any], expected: str) -> bool:
    """One call of `expected` whose arguments are a JSON object holding every required parameter."""
    if len(calls) != 1 or calls[0].function.name != expected:
        return False
    try:
        arguments = json.loads(calls[0].function.arguments)
    except ValueError:
        return False
    return isinstance(arguments, dict) and all(k in arguments for k in _REQUIRED[expected])


def ask(client: openai.OpenAI, model: str, question: str, choice: str, max_tokens: int) -> list[Any]:
    """The calls of the greedy reply to `question` with TOOLS and `choice`."""
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                           tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=max_tokens)
    return list(reply.choices[0].message.tool_calls or [])


def measure(client: openai.OpenAI, model: str, limit: int | None, max_tokens: int) -> dict[str, Any]:
    rows = []
    for question, expected in NEEDS_TOOL[:limit]:
        auto = ask(client, model, question, "auto", max_tokens)
        forced = ask(client, model, question, "required", max_tokens)
        rows.append({"ask": question, "expected": expected, "auto": [c.function.name for c in auto],
                     "auto_right": right_call(auto, expected), "required": [c.function.name for c in forced],
                     "required_right": right_call(forced, expected)})
    for question in NEEDS_NONE[:limit]:
        auto = ask(client, model, question, "auto", max_tokens)
        rows.append({"ask": question, "expected": None, "auto": [c.function.name for c in auto]})
    need = [r for r in rows if r["expected"]]
    none = [r for r in rows if not r["expected"]]
    return {
        "asks_needing_a_tool": len(need), "asks_needing_none": len(none),
        "auto_right_call": sum(r["auto_right"] for r in need), "auto_any_call": sum(bool(r["auto"]) for r in need),
        "auto_call_when_none_needed": sum(bool(r["auto"]) for r in none),
        "required_right_call": sum(r["required_right"] for r in need),
        "required_right_name": sum(r["required"] == [r["expected"]] for r in need), "rows": rows,
    }


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running gateway")
    parser.add_argument("--model", default=None, help="model name (default: the first GET /v1/models lists)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N asks of each list")
    parser.add_argument("--max-tokens", type=int, default=64, help="per reply (a call takes 30 to 100)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = args.model or client.models.list().data[0].id
    started = time.perf_counter()
    result = measure(client, model, args.limit, args.max_tokens)
    result.update(model=model, max_tokens=args.max_tokens, seconds=round(time.perf_counter() - started, 1),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=_commit(),
                  machine=platform.machine(), processor=platform.processor() or platform.machine())
    need, none = result["asks_needing_a_tool"], result["asks_needing_none"]
    print(f"{model}: auto called the right tool on {result['auto_right_call']}/{need} asks that need one "
          f"(any tool: {result['auto_any_call']}/{need}), a tool on {result['auto_call_when_none_needed']}/{none} "
          f"asks that need none; required called the right tool on {result['required_right_call']}/{need} (named it: "
          f"{result['required_right_name']}/{need})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
