"""Request schema of POST /v1/responses (OpenAI's Responses API), pydantic v2.

The Responses API is the chat API in another wire shape: `input` items instead of messages (a string is
one user message), flat function tools, `text.format` instead of `response_format`, `max_output_tokens`
instead of `max_tokens`. As on the chat route, unknown fields are ignored (the route names them), vLLM's
sampling extras (top_k, seed, ignore_eos, ...) are accepted, and known fields we cannot honour with a
non-default value (built-in tools, background runs, reasoning, conversations, prompt templates, logprobs,
truncation "auto") are a 400 naming them: a client relying on them would get wrong output.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.openai.requests import SamplingFields, UnsupportedFieldError
from adapters.openai.response_format import JsonSchemaFormat, ResponseFormat
from adapters.openai.tools import FunctionSpec, NamedToolChoice, ToolChoice, ToolSpec, check_tools
from runtime.schema_check import check_schema

_ITEM_TYPES = ("message", "function_call", "function_call_output")
_PART_TYPES = ("input_text", "output_text", "refusal")
_CHOICE_MODES = ("none", "auto", "required")


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Base):
    """A text part of a message: `input_text`, or `output_text` / `refusal` of an assistant message replayed
    from an earlier response's output."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _has_its_text(self) -> TextPart:
        key = "refusal" if self.type == "refusal" else "text"
        if getattr(self, key) is None:
            raise ValueError(f"a '{self.type}' part needs '{key}'")
        return self

    @property
    def value(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""


class InputItem(_Base):
    """One item of `input`: a message (a `type` may be left out, as OpenAI's "easy" messages do), an earlier
    response's function call, or a function call's output. One model, not a union, so a bad field is named
    `input[i].field` in the 400 rather than lost among union branches."""

    type: Literal["message", "function_call", "function_call_output"] = "message"
    id: str | None = None  # the item's id, listed by GET /v1/responses/{id}/input_items (one is given if none)
    role: Literal["user", "system", "developer", "assistant"] | None = None  # message
    content: str | list[TextPart] | None = None  # message
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call: a JSON string, as OpenAI sends it
    output: str | list[TextPart] | None = None  # function_call_output

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> InputItem:
        needs = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
                 "function_call_output": ("call_id", "output")}[self.type]
        for key in needs:
            if getattr(self, key) is None:
                raise ValueError(f"a '{self.type}' item needs '{key}'")
        return self


class FunctionTool(FunctionSpec):
    """One entry of `tools`: a function, in the Responses API's flat shape (chat nests it under `function`)."""

    type: Literal["function"]

    def chat(self) -> ToolSpec:
        return ToolSpec(function=FunctionSpec.model_validate(self.model_dump(exclude={"type"})))


class FunctionChoice(_Base):
    """tool_choice naming one function: {"type": "function", "name": ...}."""

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: text, json_object, or json_schema with `name` and `schema` beside `type`."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_usable(self) -> TextFormat:
        if self.type == "json_schema":
            if self.name is None or self.json_schema is None:
                raise ValueError("a 'json_schema' format needs 'name' and 'schema'")
            check_schema(self.json_schema, param="text.format")
        return self

    def response_format(self) -> ResponseFormat:
        """The same constraint as chat's response_format (one grammar path for both)."""
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=self.name, description=self.description, schema=self.json_schema, strict=self.strict))


class TextConfig(_Base):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


def _no_reasoning(value: Any) -> bool:
    """`reasoning` asking for nothing: no effort (or "none") and no summary."""
    return (isinstance(value, dict) and value.get("effort") in (None, "none")
            and not value.get("summary") and not value.get("generate_summary"))


# Known fields we cannot honour: name -> "this value is harmless" (SamplingFields._reject_unsupported).
_RESPONSES_UNSUPPORTED = {
    "n": lambda v: v == 1,  # a response has one output; n is only here as a SamplingFields field
    "background": lambda v: v is False,
    "reasoning": _no_reasoning,
    "conversation": lambda v: False,
    "prompt": lambda v: False,
    "truncation": lambda v: v == "disabled",
    "top_logprobs": lambda v: v == 0,
    # Other includes ask for data of built-in tools or reasoning, which this server never produces.
    "include": lambda v: not (isinstance(v, list) and "message.output_text.logprobs" in v),
}


def _input_schema(schema: dict[str, Any]) -> None:
    # `input` is parsed as a list (a string becomes one user message first); the document says both.
    schema["properties"]["input"] = {"anyOf": [{"type": "string"}, schema["properties"]["input"]]}


class ResponsesRequest(SamplingFields):
    """POST /v1/responses."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_input_schema)
    input: list[InputItem] = Field(min_length=1)
    instructions: str | None = None  # a system message before the conversation; not carried to later responses
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None  # None: "auto"
    parallel_tool_calls: bool | None = None  # False: at most one call
    text: TextConfig | None = None
    # accepted at their defaults only (_RESPONSES_UNSUPPORTED), echoed in the response object
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # accepted and echoed: they concern built-in tools or OpenAI's caching and abuse detection
    max_tool_calls: int | None = Field(None, ge=1)
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    unsupported_fields = _RESPONSES_UNSUPPORTED

    @model_validator(mode="before")
    @classmethod
    def _known_kinds(cls, data: Any) -> Any:
        """A string input as one user message; 400 naming the item, part or tool of a kind we do not serve."""
        if not isinstance(data, dict):
            return data
        if isinstance(data.get("input"), str):
            data = {**data, "input": [{"type": "message", "role": "user", "content": data["input"]}]}
        _check_kinds(data)
        return data

    @model_validator(mode="after")
    def _tools_usable(self) -> ResponsesRequest:
        check_tools(self.chat_tools(), self.chat_tool_choice())
        return self

    @property
    def forces_call(self) -> bool:
        """tool_choice "required" or a named function: the output is one function call."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, FunctionChoice)

    def chat_tools(self) -> list[ToolSpec] | None:
        return None if self.tools is None else [tool.chat() for tool in self.tools]

    def chat_tool_choice(self) -> ToolChoice | None:
        if isinstance(self.tool_choice, FunctionChoice):
            return NamedToolChoice(function={"name": self.tool_choice.name})
        return self.tool_choice

    def response_format(self) -> ResponseFormat | None:
        """text.format as chat's response_format. None under a forced call: the format is for text, and there
        is none (OpenAI takes both together, as agents with an output type and tool_choice "required" send)."""
        fmt = self.text.format if self.text else None
        return None if fmt is None or self.forces_call else fmt.response_format()


def _kind(value: Any, default: str | None = None) -> Any:
    return value.get("type", default) if isinstance(value, dict) else None


def _check_kinds(data: dict[str, Any]) -> None:
    """UnsupportedFieldError for built-in tools, non-function tool choices, input items other than messages
    and function calls, and non-text content parts; malformed shapes are left to the schema's own errors."""
    tools = data.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = _kind(tool)
        if isinstance(kind, str) and kind != "function":
            raise UnsupportedFieldError(f"tools[{i}]", f"of type '{kind}': only function tools are supported by "
                                                       "this server")
    kind = _kind(data.get("tool_choice"))
    if isinstance(kind, str) and kind != "function":
        raise UnsupportedFieldError("tool_choice", f"of type '{kind}': only {', '.join(_CHOICE_MODES)} or a "
                                                   "function are supported by this server")
    verbosity = data["text"].get("verbosity") if isinstance(data.get("text"), dict) else None
    if verbosity not in (None, "medium"):
        raise UnsupportedFieldError("text.verbosity", "is not supported by this server (only 'medium')")
    items = data.get("input") if isinstance(data.get("input"), list) else []
    for i, item in enumerate(items):
        kind = _kind(item, "message")
        if isinstance(kind, str) and kind not in _ITEM_TYPES:
            raise UnsupportedFieldError(f"input[{i}]", f"of type '{kind}': only {', '.join(_ITEM_TYPES)} items are "
                                                       "supported by this server")
        for key in ("content", "output"):
            parts = item.get(key) if isinstance(item, dict) and isinstance(item.get(key), list) else []
            for j, part in enumerate(parts):
                kind = _kind(part)
                if isinstance(kind, str) and kind not in _PART_TYPES:
                    raise UnsupportedFieldError(f"input[{i}].{key}[{j}]", f"of type '{kind}': only text parts "
                                                                          f"({', '.join(_PART_TYPES)}) are supported")
