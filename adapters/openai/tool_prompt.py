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

Templates that read tools from the system message (Phi-4-mini's: `<|tool|>{tools}<|/tool|>` from the system
turn's `tools` string, its model card's format) get them there, as a JSON list of the functions, and its call
format (`<|tool_call|>[...]<|/tool_call|>`).

Whatever renders the tools, a conversation's earlier calls and tool results must reach the model:
- a template that does not write an assistant turn's `tool_calls` (Phi, Gemma 3, Mixtral-8x22B's tool_use
  template, SmolLM2) gets them as text after the turn's content, in the format it answers in;
- a template that drops `tool` turns or refuses them (Phi-3.5: dropped; Gemma 3: roles must alternate) gets
  the results as one user turn, each in `<tool_response>` tags (Qwen's and Hermes' layout), merged with
  the user turn that follows, if any.
Each is decided once per template, by rendering a probe conversation.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from adapters.openai.harmony import HARMONY, is_harmony
from adapters.openai.tool_calls import PHI4_MINI, SMOLLM2, ToolCallFormat, tool_call_format
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

_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe_tool", "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]
_PROBE_CALL = {"id": "call_probe", "type": "function",
               "function": {"name": "probe_tool", "arguments": '{"probe": "probe-call-5c1e"}'}}
_PROBE_RESULT = "probe-result-7f3a"  # the probes look for these strings in the rendered prompt


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template does with tools, earlier calls and tool results."""

    renders_tools: bool  # writes `tools` into the prompt
    tools_in_system: bool  # reads tools from the system message (Phi-4-mini)
    renders_calls: bool  # writes an assistant turn's tool_calls
    renders_results: bool  # writes `tool` turns' content


def _renders(tokenizer: Tokenizer, messages: list[dict[str, Any]], needle: str, **kwargs: Any) -> bool:
    try:
        return needle in tokenizer.apply_chat_template(messages, **kwargs)
    except Exception:  # a template that refuses the conversation does not render it
        return False


@functools.lru_cache(maxsize=16)
def template_traits(tokenizer: Tokenizer) -> TemplateTraits:
    """The chat template's traits, probed once (all False for no template)."""
    template = getattr(tokenizer.hf, "chat_template", None)
    if not template:
        return TemplateTraits(False, False, False, False)
    user = {"role": "user", "content": "?"}
    try:
        renders_tools = (tokenizer.apply_chat_template([user], tools=_PROBE_TOOLS)
                         != tokenizer.apply_chat_template([user]))
    except Exception:  # a template that fails on the probe: it is not ours to rewrite
        renders_tools = True
    text = json.dumps(template) if not isinstance(template, str) else template
    call = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
    result = {"role": "tool", "tool_call_id": "call_probe", "content": _PROBE_RESULT}
    return TemplateTraits(
        renders_tools=renders_tools,
        tools_in_system="message['tools']" in text or 'message["tools"]' in text,
        renders_calls=_renders(tokenizer, [user, call], "probe-call-5c1e", tools=_PROBE_TOOLS),
        renders_results=_renders(tokenizer, [user, call, result], _PROBE_RESULT, tools=_PROBE_TOOLS),
    )


def renders_tools(tokenizer: Tokenizer) -> bool:
    """Whether the model's chat template writes `tools` into the prompt (False also for no template)."""
    return template_traits(tokenizer).renders_tools


def tool_format(tokenizer: Tokenizer, parallel: bool = True) -> ToolCallFormat:
    """The call format of the model's prompt: the template's, or ours (SmolLM2's); `parallel` False: one call."""
    template = getattr(tokenizer.hf, "chat_template", None)
    traits = template_traits(tokenizer)
    if is_harmony(template):
        fmt = HARMONY
    elif traits.renders_tools:
        fmt = tool_call_format(template)
    else:
        fmt = PHI4_MINI if traits.tools_in_system else SMOLLM2
    return fmt if parallel else fmt.single()


def prompt_conversation(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        tokenizer: Tokenizer) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to hand to the chat template: the conversation as the template can render it, and the
    tools for a template that renders them (else they are written into the system turn here)."""
    traits = template_traits(tokenizer)
    fmt = tool_format(tokenizer)
    out = [_arguments_as_objects(m) if traits.renders_calls else _with_calls_as_text(m, fmt) for m in messages]
    if not traits.renders_results:
        out = _results_as_user_turns(out)
    if is_harmony(getattr(tokenizer.hf, "chat_template", None)):
        out = [_reasoning_as_thinking(m) for m in out]
        # gpt-oss's template writes "// " + description: OpenAI's optional field, absent, fails inside it
        tools = [{**t, "function": {"description": "", **t["function"]}} for t in tools or []] or None
    if traits.renders_tools:
        return out, tools
    if tools:
        if traits.tools_in_system:
            system = {"role": "system", "content": "", "tools": json.dumps([t["function"] for t in tools],
                                                                           ensure_ascii=False)}
        else:
            system = {"role": "system", "content": TOOL_PROMPT.format(tools=json.dumps(tools, ensure_ascii=False))}
        if out and out[0]["role"] == "system":
            text = f"{out[0]['content']}\n\n{system['content']}" if system["content"] else out[0]["content"]
            out[0] = {**out[0], **system, "content": text}
        else:
            out.insert(0, system)
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


def _with_calls_as_text(message: dict[str, Any], fmt: ToolCallFormat) -> dict[str, Any]:
    """An assistant turn's calls after its text, as the model writes them in `fmt` (compact, as the forced-call
    grammar writes them); other turns as they are."""
    if not message.get("tool_calls"):
        return message
    calls = [json.dumps({"name": c["function"]["name"], fmt.args_key: _arguments(c["function"]["arguments"])},
                        ensure_ascii=False) for c in message["tool_calls"]]
    if fmt.layout == "list":
        written = f"{fmt.begin}[{', '.join(calls)}]{fmt.end}"
    elif fmt.layout == "tags":
        written = "\n".join(f"{fmt.begin}\n{c}\n{fmt.end}" for c in calls)
    else:
        written = "; ".join(calls)
    text = message.get("content") or ""
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "role": "assistant", "content": (text + "\n" if text else "") + written}


def _results_as_user_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results as one user turn per run of them, merged with a user turn that follows."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            text = f"<tool_response>\n{message['content']}\n</tool_response>"
        elif message["role"] == "user" and out and out[-1].get("from_tools"):
            text = message["content"]
        else:
            out.append(message)
            continue
        if out and out[-1].get("from_tools"):
            out[-1]["content"] += "\n" + text
        else:
            out.append({"role": "user", "content": text, "from_tools": True})
    return [{k: v for k, v in m.items() if k != "from_tools"} for m in out]


def _reasoning_as_thinking(message: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's template reads an assistant turn's reasoning from `thinking`; OpenAI clients send it back
    as `reasoning_content` (vLLM's name)."""
    if message["role"] != "assistant" or "reasoning_content" not in message or "thinking" in message:
        return message
    rest = {k: v for k, v in message.items() if k != "reasoning_content"}
    return {**rest, "thinking": message["reasoning_content"]}
