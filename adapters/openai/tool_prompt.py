"""Tools in the prompt: the chat template's own rendering, or ours for templates that ignore tools.

A template renders tools when the prompt it writes for a conversation changes with `tools` (checked once per
template). Those templates get the conversation as transformers documents it (tool call arguments as
objects, as vLLM passes them) and teach their own call format (adapters/openai/tool_calls.py).

Templates that ignore tools (SmolLM2-135M-Instruct's: 34 tokens with or without them) would leave `auto`
never calling a tool, silently. For them the tools and earlier calls are written here, in SmolLM2's
function-calling format (SmolLM2-1.7B-Instruct's model card, instructions_function_calling.md: the tools as
JSON in `<tools>` in the system turn, calls as `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`):
- the system turn: the caller's system text, a blank line, then that documented prompt, with the two
  sentences that forbid plain answers ("NO other text", an empty list when no call is needed) changed to
  allow them (tool_choice "auto" lets a model answer in text);
- an earlier assistant turn's calls: its text, then the calls in that format;
- tool results: `tool` turns as the template writes them (the card documents none; on the default model a plain
  `tool` turn got answers that use the result, where Ollama's `<tool_response>` user turn got the tags echoed).
SmolLM2-135M and 360M were tuned without function-calling data (smol-smoltalk), so on the default model
`auto` rarely calls a tool: benchmarks/tool_choice_auto.py measures how rarely.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from adapters.openai.tool_calls import SMOLLM2, ToolCallFormat, tool_call_format
from runtime.tokenizer import Tokenizer

TOOL_PROMPT = """You are an expert in composing functions. You are given a question and a set of possible functions.
Based on the question, you will need to make one or more function/tool calls to achieve the purpose.
If none of the functions can be used, answer without them.
If the given question lacks the parameters required by the function, also point it out.

You have access to the following tools:
<tools>{tools}</tools>

To call tools, the output MUST strictly adhere to the following format.
The example format is as follows. Please make sure the parameter type is correct. \
If no function call is needed, answer in plain text.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
... (more tool calls as required)
]</tool_call>"""

_PROBE_MESSAGES = [{"role": "user", "content": "?"}]
_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe_tool", "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]


@functools.lru_cache(maxsize=16)
def renders_tools(tokenizer: Tokenizer) -> bool:
    """Whether the model's chat template writes `tools` into the prompt (False also for no template)."""
    if not getattr(tokenizer.hf, "chat_template", None):
        return False
    try:
        return (tokenizer.apply_chat_template(_PROBE_MESSAGES, tools=_PROBE_TOOLS)
                != tokenizer.apply_chat_template(_PROBE_MESSAGES))
    except Exception:  # a template that fails on the probe: it is not ours to rewrite
        return True


def tool_format(tokenizer: Tokenizer, parallel: bool = True) -> ToolCallFormat:
    """The call format of the model's prompt: the template's, or ours (SmolLM2's); `parallel` False: one call."""
    if renders_tools(tokenizer):
        return tool_call_format(tokenizer.hf.chat_template, parallel)
    return SMOLLM2 if parallel else SMOLLM2.single()


def prompt_conversation(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        tokenizer: Tokenizer) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to hand to the chat template: the conversation for a template that renders tools,
    or our rendering of it (and no tools) for one that does not."""
    if renders_tools(tokenizer):
        return [_arguments_as_objects(m) for m in messages], tools
    out = [_with_calls_as_text(m) for m in messages]
    if tools:
        prompt = TOOL_PROMPT.format(tools=json.dumps(tools, ensure_ascii=False))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _arguments(text: str) -> Any:
    """A call's arguments as an object when they are JSON (templates index them), else the text as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _with_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's calls after its text, as the model writes them (compact, as the forced-call grammar
    writes them); other turns as they are."""
    if not message.get("tool_calls"):
        return message
    calls = [json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])},
                        ensure_ascii=False) for c in message["tool_calls"]]
    text = message.get("content") or ""
    written = f"{SMOLLM2.begin}[{', '.join(calls)}]{SMOLLM2.end}"
    return {"role": "assistant", "content": (text + "\n" if text else "") + written}
