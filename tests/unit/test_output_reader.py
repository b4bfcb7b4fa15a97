"""adapters/openai/output_reader.py (with harmony.py and reasoning.py): the families' outputs, fixed strings in each
family's format, read into reasoning, answer and tool calls; streamed in any chunking they read the same, and
the chat and Responses endpoints carry them as vLLM does (`reasoning_content`, `delta.reasoning_content`) and as
OpenAI does (a reasoning item)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from adapters.openai.chat import ChatOutput
from adapters.openai.output_reader import Whole, output_reader
from adapters.openai.requests import ChatCompletionRequest
from adapters.openai.responses_output import ResponsesOutput
from adapters.openai.responses_request import ResponsesRequest
from runtime.request import OutputDelta, Usage
from runtime.tokenizer import Tokenizer
from tests.chat_families import family_tokenizer

ARGS = '{"city": "Paris"}'
# (family, model output, tools in play, expected reasoning, content, calls)
CASES: list[tuple[str, str, bool, str | None, str | None, list[tuple[str, str]]]] = [
    ("gpt-oss", "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>"
                "Hello! How can I help?", False, "The user greets.", "Hello! How can I help?", []),
    ("gpt-oss", "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                f"to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>", True,
     "Need the weather.", None, [("get_weather", ARGS)]),
    # the recipient after the role, as the template writes earlier calls
    ("gpt-oss", " to=functions.get_weather<|channel|>commentary json<|message|>" + ARGS, True, None, None,
     [("get_weather", ARGS)]),
    # a preamble to the user, then the call; the <|return|> of an answer kept (include_stop_str_in_output)
    ("gpt-oss", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather"
                f"<|channel|>commentary json<|message|>{ARGS}<|call|>", True, None, "Checking.", [("get_weather", ARGS)]),
    ("gpt-oss", "<|channel|>final<|message|>Done.<|return|>", True, None, "Done.", []),
    # a built-in tool's message is the model's own business; cut off inside the analysis: all reasoning
    ("gpt-oss", "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search "
                "code<|message|>{\"query\": \"x\"}<|call|>", True, "Search.", None, []),
    ("gpt-oss", "<|channel|>analysis<|message|>Thinking about", False, "Thinking about", None, []),
    ("gpt-oss", "no harmony at all", False, None, "no harmony at all", []),
    ("qwen3", "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', True,
     "\nThe user wants the weather.\n", None, [("get_weather", ARGS)]),
    ("qwen3", "<think>\nA greeting.\n</think>\n\nHello!", False, "\nA greeting.\n", "Hello!", []),
    ("qwen3", "Hello!", True, None, "Hello!", []),  # enable_thinking false: the template closed the block
    ("qwen3", "<think>\nStill thinking", True, "\nStill thinking", None, []),
    ("phi4-mini", f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGS}}}]<|/tool_call|>', True, None, None,
     [("get_weather", ARGS)]),
    ("phi4-mini", "It is sunny.", True, None, "It is sunny.", []),
    ("mixtral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]', True, None, None,
     [("get_weather", ARGS), ("get_weather", '{"city": "Rome"}')]),
    ("gemma3", f'<tool_call>[{{"name": "get_weather", "arguments": {ARGS}}}]</tool_call>', True, None, None,
     [("get_weather", ARGS)]),
    ("phi3", "Sunny, 21 degrees.", True, None, "Sunny, 21 degrees.", []),
]


@pytest.fixture(scope="module")
def family(tokenizer: Tokenizer) -> dict[str, Tokenizer]:
    return {name: family_tokenizer(tokenizer.hf.name_or_path, name)
            for name in ("gpt-oss", "qwen3", "phi4-mini", "phi3", "gemma3", "mixtral")}


def summary(whole: Whole) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    return whole.reasoning, whole.content, [(c.name, c.arguments) for c in whole.calls]


def streamed(tok: Tokenizer, text: str, tools: bool, cuts: list[int]) -> tuple[str | None, str | None, list]:
    """The same output fed in pieces cut at `cuts`, assembled as a client assembles stream deltas."""
    reader = output_reader(tok, tools)
    reasoning, content, calls = "", "", {}
    bounds = [0, *cuts, len(text)]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        piece = reader.feed(text[a:b], final=i == len(bounds) - 2)
        reasoning, content = reasoning + piece.reasoning, content + piece.content
        for event in piece.events:
            name, args = calls.get(event.index, ("", ""))
            calls[event.index] = (event.name or name, args + event.text)
    return reasoning or None, content or None, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("name, text, tools, reasoning, content, calls", CASES)
def test_outputs_read_whole_and_in_any_chunking(family: dict[str, Tokenizer], name: str, text: str, tools: bool,
                                                reasoning: str | None, content: str | None, calls: list) -> None:
    tok = family[name]
    assert summary(output_reader(tok, tools).whole(text)) == (reasoning, content, calls)
    rng = random.Random(len(text))
    chunkings = [list(range(step, len(text), step)) for step in range(1, 9)]
    chunkings += [sorted(rng.sample(range(1, len(text)), min(k, len(text) - 1))) for k in (2, 5, 11)]
    for cuts in chunkings:
        assert streamed(tok, text, tools, cuts) == (reasoning, content or None, calls), cuts


def test_parallel_tool_calls_false_keeps_the_first_harmony_call(family: dict[str, Tokenizer]) -> None:
    call = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>"
    text = call + "<|start|>assistant" + call.replace("Paris", "Rome")
    assert len(output_reader(family["gpt-oss"], True).whole(text).calls) == 2
    assert summary(output_reader(family["gpt-oss"], True, parallel=False).whole(text)) == \
        (None, None, [("get_weather", ARGS)])


# ---- through the endpoints --------------------------------------------------------------------------------------

def deltas(text: str, step: int) -> list[tuple[int, OutputDelta]]:
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    out = [(0, OutputDelta("r", text=p, token_ids=[1])) for p in pieces]
    last = out[-1][1]
    last.finish_reason, last.usage = "stop", Usage(prompt_tokens=3, completion_tokens=len(pieces))
    return out


@pytest.mark.parametrize("name, text, tools", [(CASES[0][0], CASES[0][1], False), (CASES[1][0], CASES[1][1], True),
                                               (CASES[8][0], CASES[8][1], True), (CASES[9][0], CASES[9][1], False)])
def test_chat_completions_carry_reasoning_content_streamed_and_whole(family: dict[str, Tokenizer], name: str,
                                                                     text: str, tools: bool) -> None:
    tok = family[name]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Weather in Paris?"}]}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "get_weather"}}]
    req = ChatCompletionRequest.model_validate(body)
    whole = ChatOutput(req, "c", "m", tok, created=1)
    for item in deltas(text, 5):
        whole.add(item)
    message = ChatCompletion.model_validate(whole.response()).choices[0]
    expected = output_reader(tok, tools).whole(text)
    assert message.message.model_extra["reasoning_content"] == expected.reasoning
    assert message.message.content == expected.content
    assert [(c.function.name, c.function.arguments) for c in message.message.tool_calls or []] == \
        [(c.name, c.arguments) for c in expected.calls]
    assert message.finish_reason == ("tool_calls" if expected.calls else "stop")

    stream = ChatOutput(req, "c", "m", tok, created=1)
    chunks = [ChatCompletionChunk.model_validate(c) for item in deltas(text, 3) for c in stream.chunks(item)]
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    arguments = "".join(t.function.arguments or "" for c in chunks for t in c.choices[0].delta.tool_calls or [])
    assert (reasoning or None, content or None) == (expected.reasoning, expected.content)
    assert arguments == "".join(c.arguments for c in expected.calls)
    assert chunks[-1].choices[0].finish_reason == message.finish_reason


def test_responses_give_reasoning_items_before_the_answer_and_the_call(family: dict[str, Tokenizer]) -> None:
    tok = family["gpt-oss"]
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    for text, kinds in [(CASES[0][1], ["reasoning", "message"]), (CASES[1][1], ["reasoning", "function_call"])]:
        req = ResponsesRequest.model_validate({"input": "Weather in Paris?", "tools": [weather]})
        whole = ResponsesOutput(req, "resp_1", "m", tok, created=1)
        for item in deltas(text, 4):
            whole.add(item)
        response = Response.model_validate(whole.response())
        assert [item.type for item in response.output] == kinds
        assert response.output[0].content[0].text == output_reader(tok, True).whole(text).reasoning
        stream = ResponsesOutput(req, "resp_1", "m", tok, created=1)
        events = [e for item in deltas(text, 3) for e in stream.chunks(item)] + stream.final_chunks()
        thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        assert thought == response.output[0].content[0].text
        done = [e for e in events if e["type"] == "response.reasoning_text.done"]
        assert [e["text"] for e in done] == [thought] and done[0]["output_index"] == 0
        assert without_ids(events[-1]["response"]["output"]) == without_ids(whole.response()["output"])


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]
