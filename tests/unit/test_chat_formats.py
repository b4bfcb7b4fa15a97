"""The families' published chat templates (tests/unit/chat_templates/) through our chat path: tools, an earlier
call and its result reach the prompt in each family's own format, and the request keeps the special tokens its
output markers are made of."""

from __future__ import annotations

import pytest

from adapters.openai.requests import ChatCompletionRequest
from adapters.openai.tool_prompt import template_traits, tool_format
from adapters.openai.translate import chat_request
from runtime.request import GenerationRequest
from runtime.tokenizer import Tokenizer
from tests.chat_families import ROUND_TRIP, TOOLS, family_tokenizer



@pytest.fixture(scope="module")
def family(tokenizer: Tokenizer) -> dict[str, Tokenizer]:
    folder = tokenizer.hf.name_or_path
    return {name: family_tokenizer(folder, name)
            for name in ("gpt-oss", "qwen3", "phi4-mini", "phi3", "gemma3", "mixtral")}


def request(tok: Tokenizer, messages: list[dict], **fields) -> GenerationRequest:
    return chat_request(ChatCompletionRequest.model_validate({"messages": messages, **fields}), "r", tok)


def test_gpt_oss_renders_tools_calls_and_results_in_harmony(family: dict[str, Tokenizer]) -> None:
    tok = family["gpt-oss"]
    thought = {**ROUND_TRIP[2], "reasoning_content": "Need the weather."}  # sent back as vLLM returns it
    out = request(tok, [*ROUND_TRIP[:2], thought, ROUND_TRIP[3]], tools=TOOLS,
                  chat_template_kwargs={"reasoning_effort": "high"})
    prompt = out.prompt or ""
    assert prompt.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "Reasoning: high\n\n" in prompt
    assert ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {"
            "\n\n// The weather of a city\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n} // namespace functions"
            "<|end|>") in prompt
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant")
    assert out.sampling.skip_special_tokens is False  # harmony's markers are special tokens
    assert request(tok, ROUND_TRIP[:2]).sampling.skip_special_tokens is False  # reasoning is read without tools too
    assert tool_format(tok).name == "harmony"


def test_qwen3_renders_hermes_tools_and_thinking_switch(family: dict[str, Tokenizer]) -> None:
    tok = family["qwen3"]
    prompt = request(tok, ROUND_TRIP, tools=TOOLS).prompt or ""
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    off = request(tok, ROUND_TRIP[:2], chat_template_kwargs={"enable_thinking": False})
    assert (off.prompt or "").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.sampling.skip_special_tokens is True  # Qwen3's tags are plain tokens
    assert tool_format(tok).name == "hermes"


def test_phi4_mini_gets_tools_in_its_system_turn_and_calls_in_its_format(family: dict[str, Tokenizer]) -> None:
    tok = family["phi4-mini"]
    out = request(tok, ROUND_TRIP, tools=TOOLS)
    assert out.prompt == (
        '<|system|>Be brief.<|tool|>[{"name": "get_weather", "description": "The weather of a city", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]<|/tool|><|end|>'
        "<|user|>Weather in Paris?<|end|>"
        '<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|><|end|>'
        "<|tool|>sunny<|end|><|assistant|>")
    assert out.sampling.skip_special_tokens is False  # <|tool_call|> is a special token
    assert request(tok, ROUND_TRIP[1:2]).sampling.skip_special_tokens is True  # no tools: nothing to keep
    no_system = request(tok, ROUND_TRIP[1:2], tools=TOOLS).prompt or ""
    assert no_system.startswith('<|system|><|tool|>[{"name": "get_weather"')
    assert tool_format(tok).name == "phi4_mini"


@pytest.mark.parametrize("name, user, model", [("phi3", "<|user|>\n", "<|assistant|>\n"),
                                                ("gemma3", "<start_of_turn>user\n", "<start_of_turn>model\n")])
def test_templates_without_tool_turns_get_results_as_a_user_turn(family: dict[str, Tokenizer], name: str, user: str,
                                                                  model: str) -> None:
    """Phi-3.5's template drops `tool` turns and Gemma 3's refuses them (roles must alternate): the results
    reach the model as one user turn, merged with a user turn that follows."""
    tok = family[name]
    traits = template_traits(tok)
    assert not traits.renders_tools and not traits.renders_calls and not traits.renders_results
    prompt = request(tok, [*ROUND_TRIP, {"role": "user", "content": "And Rome?"}], tools=TOOLS).prompt or ""
    assert "You have access to the following tools:\n<tools>" in prompt  # our tool prompt
    assert (f'{model}<tool_call>[{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}]</tool_call>' in prompt)
    assert f"{user}<tool_response>\nsunny\n</tool_response>\nAnd Rome?" in prompt
    assert prompt.endswith(model)
    assert tool_format(tok).name == "smollm2"


def test_mixtral_gets_its_tool_use_template_and_calls_as_tool_calls_text(family: dict[str, Tokenizer]) -> None:
    tok = family["mixtral"]
    out = request(tok, ROUND_TRIP, tools=TOOLS)
    prompt = out.prompt or ""
    assert "[AVAILABLE_TOOLS][{'type': 'function', 'function': {'name': 'get_weather'" in prompt
    assert '[INST]Weather in Paris?[/INST] [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}] ' in prompt
    assert prompt.endswith("[INST]<tool_response>\nsunny\n</tool_response>[/INST]")
    assert out.sampling.skip_special_tokens is False  # [TOOL_CALLS] is a special token
    assert tool_format(tok).name == "mistral"


def test_gpt_oss_forced_call_is_a_harmony_call_and_tools_may_lack_a_description(family: dict[str, Tokenizer]) -> None:
    """tool_choice "required": the grammar admits exactly gpt-oss's call message (its special tokens included);
    a tool without the optional description renders (the template writes "// " + description)."""
    from runtime.native.guided.compiler import GuidedCompiler

    tok = family["gpt-oss"]
    bare = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}}]
    out = request(tok, ROUND_TRIP[1:2], tools=bare, tool_choice="required")
    assert "// \ntype get_weather = (_: {\ncity: string,\n}) => any;" in (out.prompt or "")
    assert out.guided is not None
    compiler = GuidedCompiler(tok.hf, tok.vocab_size, tok.eos_token_ids)
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    ids = tok.encode(call, add_special_tokens=False)
    assert tok.hf.convert_ids_to_tokens(ids[0]) == "<|channel|>"
    guide = compiler.new_guide(compiler.compile(out.guided))
    assert guide.accept_tokens([*ids, *tok.eos_token_ids[:1]]) == len(ids) + 1 and guide.complete
    other = compiler.new_guide(compiler.compile(out.guided))
    assert other.accept_tokens(tok.encode("<|channel|>final<|message|>Hi", add_special_tokens=False)) < 3
