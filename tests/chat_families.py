"""Tokenizers carrying each model family's published chat template (tests/unit/chat_templates/) and its marker
tokens, special or not as the family's tokenizer has them, over the tiny byte-level BPE of tests/tiny_models.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "unit" / "chat_templates"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# a conversation with an earlier call and its result
ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]

HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]

# family: (template file, special added tokens, plain added tokens)
FAMILIES: dict[str, tuple[str, list[str], list[str]]] = {
    "gpt-oss": ("openai-gpt-oss-120b.jinja", HARMONY_TOKENS, []),
    # Qwen3's tokenizer adds its tags as plain (not special) tokens
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", [], ["<think>", "</think>", "<tool_call>", "</tool_call>"]),
    "phi4-mini": ("microsoft-Phi-4-mini-instruct.jinja",
                  ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
                   "<|/tool_call|>"], []),
    "phi3": ("microsoft-Phi-3.5-mini-instruct.jinja", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], []),
    "gemma3": ("google-gemma-3-it.jinja", ["<start_of_turn>", "<end_of_turn>"], []),
    "mixtral": ("mistralai-Mixtral-8x22B-Instruct-v0.1.json",
                ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"], []),
}


def published_template(family: str) -> Any:
    """The family's template: its text, or {name: text} for a tokenizer_config's named templates."""
    path = TEMPLATES / FAMILIES[family][0]
    if path.suffix == ".json":
        return {t["name"]: t["template"] for t in json.loads(path.read_text())}
    return path.read_text()


def family_tokenizer(tokenizer_folder: str, family: str) -> Tokenizer:
    """The tiny tokenizer saved in `tokenizer_folder`, with `family`'s template and marker tokens."""
    from transformers import AutoTokenizer

    _, special, plain = FAMILIES[family]
    hf = AutoTokenizer.from_pretrained(tokenizer_folder)
    hf.add_tokens(special, special_tokens=True)
    hf.add_tokens(plain)
    hf.chat_template = published_template(family)
    return Tokenizer(hf, [hf.eos_token_id])
