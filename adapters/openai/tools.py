"""OpenAI tools: schemas, request checks and the decoding constraint for tool_choice.

The chat template renders `tools` into the prompt, or we do where it ignores them (adapters/openai/tool_prompt.py);
the model answers with calls in that prompt's format (adapters/openai/tool_calls.py reads them, streamed or
whole). tool_choice "required" or a named function constrains decoding (runtime/native/guided) to exactly one call whose
arguments match the function's `parameters` schema; "auto" parses whatever the model wrote (only the first call
when parallel_tool_calls is false); "none" renders no tools at all.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.openai.response_format import ResponseFormat, response_format_guided
# The output side, re-exported: callers import tools from one place.
from adapters.openai.tool_calls import HERMES, LLAMA3_JSON, MISTRAL, SMOLLM2, ToolCall, ToolCallFormat, \
    ToolCallStream, tool_call_format
from runtime.errors import InvalidRequestError
from runtime.schema_check import check_schema
from runtime.request import GuidedDecoding

class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    """One entry of `tools` (only function tools exist in the chat API)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionSpec


class _FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming one function: {"type": "function", "function": {"name": ...}}."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: _FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


# ---- requests -----------------------------------------------------------------------------------


def check_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> None:
    """400 for a tool_choice that cannot be honoured or a parameters schema the grammar cannot enforce."""
    names = [t.function.name for t in tools or []]
    if choice == "required" and not names:
        raise InvalidRequestError("tool_choice 'required' needs at least one tool", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise InvalidRequestError(f"tool_choice names function '{choice.function.name}', which is not "
                                  f"in tools ({', '.join(names) or 'none given'})", param="tool_choice")
    if len(set(names)) != len(names):
        raise InvalidRequestError("tool function names must be unique", param="tools")
    for t in tools or []:
        if t.function.parameters is not None:
            check_schema(t.function.parameters, param="tools")


def calls_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> bool:
    """Whether tools are rendered into the prompt and calls parsed from the output."""
    return bool(tools) and choice != "none"


def tool_guided(tools: list[ToolSpec], choice: ToolChoice | None, fmt: ToolCallFormat) -> GuidedDecoding | None:
    """The constraint for tool_choice: one call of the named function, or of any tool for "required"."""
    if isinstance(choice, NamedToolChoice):
        chosen = [t.function for t in tools if t.function.name == choice.function.name]
    elif choice == "required":
        chosen = [t.function for t in tools]
    else:
        return None
    options = [fmt.call_structure(fn) for fn in chosen]
    structure = options[0] if len(options) == 1 else {"type": "or", "elements": options}
    return GuidedDecoding(structural_tag={"type": "structural_tag", "format": structure}, param="tools")


# ---- output -------------------------------------------------------------------------------------


def with_tool_calls(finish_reason: str | None, made_calls: bool) -> str | None:
    """OpenAI reports "tool_calls" when the model stopped after calling tools."""
    return "tool_calls" if made_calls and finish_reason == "stop" else finish_reason


# ---- one chat request -----------------------------------------------------------------------------


def template_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> list[dict[str, Any]] | None:
    """`tools` as the chat template receives them (OpenAI's shape), or None when no tools apply."""
    return [t.model_dump(exclude_none=True) for t in tools or []] if calls_tools(tools, choice) else None


def chat_guided(tools: list[ToolSpec] | None, choice: ToolChoice | None, response_format: ResponseFormat | None,
                fmt: ToolCallFormat) -> GuidedDecoding | None:
    """The one decoding constraint of a chat request: a forced tool call (in the prompt's format `fmt`), or the
    response format."""
    from_tools = tool_guided(tools or [], choice, fmt) if tools else None
    from_format = response_format_guided(response_format)
    if from_tools is not None and from_format is not None:
        raise InvalidRequestError("response_format cannot be combined with a forced tool_choice "
                                  "('required' or a named function)", param="response_format")
    return from_tools or from_format


__all__ = ["HERMES", "LLAMA3_JSON", "MISTRAL", "SMOLLM2", "FunctionSpec", "NamedToolChoice", "ToolCall",
           "ToolCallFormat", "ToolCallStream", "ToolChoice", "ToolSpec", "calls_tools", "chat_guided", "check_tools",
           "template_tools", "tool_call_format", "tool_guided", "with_tool_calls"]
