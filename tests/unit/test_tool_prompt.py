"""adapters/openai/tool_prompt.py: which templates render tools, and our prompt for those that ignore them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from adapters.openai.requests import ChatCompletionRequest
from adapters.openai.tool_prompt import TOOL_PROMPT, renders_tools, tool_format
from adapters.openai.tools import HERMES, SMOLLM2
from adapters.openai.translate import chat_request
from runtime.demo import demo_model_path
from runtime.tokenizer import Tokenizer

# SmolLM2-135M-Instruct's template as the default model's GGUF file carries it: it ignores `tools`, and
# concatenates `content`, so an assistant turn without content used to fail inside it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HERMES_TEMPLATE = (Path(demo_model_path()).parent / "chat_template.jinja").read_text()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def with_template(tokenizer: Tokenizer, template: str) -> Tokenizer:
    hf = copy.copy(tokenizer.hf)
    hf.chat_template = template
    return Tokenizer(hf, tokenizer.eos_token_ids)


@pytest.fixture(scope="module")
def smollm2(tokenizer: Tokenizer) -> Tokenizer:
    return with_template(tokenizer, SMOLLM2_TEMPLATE)


@pytest.fixture(scope="module")
def hermes(tokenizer: Tokenizer) -> Tokenizer:
    return with_template(tokenizer, HERMES_TEMPLATE)


def prompt(tok: Tokenizer, messages: list[dict], **fields) -> str:
    req = ChatCompletionRequest.model_validate({"messages": messages, **fields})
    return chat_request(req, "r", tok).prompt or ""


def test_templates_that_render_tools_are_told_apart(smollm2: Tokenizer, hermes: Tokenizer) -> None:
    assert not renders_tools(smollm2) and renders_tools(hermes)
    assert tool_format(smollm2) is SMOLLM2 and tool_format(hermes) is HERMES
    assert tool_format(smollm2, parallel=False).max_calls == 1


def test_a_template_that_ignores_tools_gets_smollm2s_prompt(smollm2: Tokenizer) -> None:
    """The caller's system text, then the documented prompt with the tools as JSON; earlier calls in the format the
    model answers in; the tool result as the template writes a `tool` turn."""
    system = "Be brief.\n\n" + TOOL_PROMPT.format(tools=json.dumps(TOOLS))
    assert prompt(smollm2, CONVERSATION, tools=TOOLS) == (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
        "<|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
    assert "<tools>" in TOOL_PROMPT and "<tool_call>[" in TOOL_PROMPT


def test_tool_choice_none_and_no_tools_leave_the_system_turn_alone(smollm2: Tokenizer) -> None:
    """Without tools in play, only earlier calls are written out (the model still sees what it called)."""
    for fields in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        text = prompt(smollm2, CONVERSATION, **fields)
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "<tools>" not in text
        assert '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>' in text


def test_an_assistant_turn_with_calls_and_no_content_renders(tokenizer: Tokenizer, smollm2: Tokenizer,
                                                             hermes: Tokenizer) -> None:
    """Regression: `content: null` (or none) beside tool_calls was a 400 from inside templates that concatenate it,
    SmolLM2's among them."""
    concatenates = with_template(tokenizer, "{{ tools | length }}{% for m in messages %}{{ m.role + ':' + m.content }}"
                                            "{% endfor %}")
    without = [{k: v for k, v in m.items() if v is not None} for m in CONVERSATION]
    for tok in (smollm2, hermes, concatenates):
        assert prompt(tok, CONVERSATION, tools=TOOLS) == prompt(tok, without, tools=TOOLS)
    assert prompt(concatenates, CONVERSATION, tools=TOOLS) == \
        "1system:Be brief.user:Weather in Paris?assistant:tool:sunny"


def test_a_template_that_renders_tools_gets_arguments_as_objects(hermes: Tokenizer) -> None:
    """As transformers documents tool calls (and vLLM passes them): arguments as an object, content as text."""
    expected = hermes.apply_chat_template(
        [*CONVERSATION[:2], {"role": "assistant", "content": "", "tool_calls": [
            {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, CONVERSATION[3]],
        tools=TOOLS)
    assert prompt(hermes, CONVERSATION, tools=TOOLS) == expected
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in expected


def test_a_forced_call_is_constrained_to_smollm2s_format(smollm2: Tokenizer) -> None:
    req = ChatCompletionRequest.model_validate({"messages": CONVERSATION[:2], "tools": TOOLS,
                                                "tool_choice": "required"})
    elements = chat_request(req, "r", smollm2).guided.structural_tag["format"]["elements"]
    assert [e.get("value") for e in elements] == ["<tool_call>[", None, "]</tool_call>"]
    assert elements[1]["json_schema"]["properties"]["arguments"] == TOOLS[0]["function"]["parameters"]
