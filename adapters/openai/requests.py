"""Request schemas of POST /v1/completions and /v1/chat/completions (pydantic v2).

Unknown fields are ignored, as the OpenAI API does. Fields that ARE in the OpenAI spec but that we
cannot honour yet (functions, suffix, audio ...) are rejected with a 400
naming the field rather than silently ignored: a client relying on them would get wrong output.
vLLM's sampling extras (top_k, min_p, repetition_penalty, ...) are accepted in the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.openai.response_format import ResponseFormat
from adapters.openai.tools import ToolChoice, ToolSpec, check_tools
from runtime.errors import InvalidRequestError, UnsupportedOptionError


class UnsupportedFieldError(UnsupportedOptionError):
    """An OpenAI request field that this server does not implement (yet)."""

    def __init__(self, field: str, detail: str) -> None:
        InvalidRequestError.__init__(self, f"Unsupported parameter: '{field}' {detail}.", param=field)
        self.option = field
        self.backend = "openai"


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Base):
    include_usage: bool = False
    # vLLM's extension (aiperf --per-chunk-usage): every chunk carries the usage so far
    continuous_usage_stats: bool = False


class ContentPart(_Base):
    """One part of a message's content; only {"type": "text", "text": ...} is supported."""

    # Other part types are refused by ChatMessage's validator (with a clearer message than a type error);
    # the schema extra documents the one accepted shape in /openapi.json.
    model_config = ConfigDict(extra="allow", json_schema_extra={"properties": {"type": {"enum": ["text"]},
                                                                               "text": {"type": "string"}},
                                                                "required": ["type", "text"]})
    type: str
    text: str | None = None


# Chat templates index a tool call's fields and fail on any other shape: checking them here makes that a
# 400 naming the field instead of an error from inside the template.
class ToolCallFunctionParam(_Base):
    """The function an earlier assistant turn called; `arguments` is a JSON string, as OpenAI sends it."""

    name: str
    arguments: str


class ToolCallParam(_Base):
    """One tool call of an earlier assistant turn: what OpenAI requires (id, type "function", function)."""

    id: str
    type: Literal["function"]
    function: ToolCallFunctionParam


class ChatMessage(_Base):
    """One message of the conversation."""

    # name, tool_calls, tool_call_id reach the template. The schema extra documents the validators
    # below in /openapi.json: content is required, except for assistant messages that call tools.
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": [
        {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        {"required": ["tool_calls"], "properties": {"role": {"const": "assistant"},
                                                    "tool_calls": {"type": "array", "minItems": 1}}},
    ], "if": {"properties": {"role": {"const": "tool"}}}, "then": {"required": ["tool_call_id"]}})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content: str | list[ContentPart] | None) -> str | list[ContentPart] | None:
        for part in content if isinstance(content, list) else []:
            if part.type != "text":
                raise ValueError(f"content parts of type '{part.type}' are not supported; only 'text'")
            if part.text is None:
                raise ValueError("a 'text' content part needs a 'text' string")
        return content

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a '{self.role}' message needs 'content'")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs 'tool_call_id'")
        return self

    def text(self) -> str | None:
        """The content as one string; text parts are joined with newlines."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
# A token id as a JSON object key; the pattern documents it in /openapi.json, the validator explains it.
TokenIdKey = Annotated[str, Field(json_schema_extra={"pattern": "^[0-9]+$"})]


class SamplingFields(_Base):
    """Fields shared by both endpoints (OpenAI's and vLLM's sampling extras)."""

    model: str | None = None  # None: the served model
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[TokenIdKey, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = Field(None, ge=-1)  # -1 or 0: off
    min_p: Probability | None = None
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    num_draft_tokens: int | None = Field(None, ge=0)  # speculation: 0 off, None engine default

    # Spec fields this endpoint cannot honour yet: name -> a predicate "this value is harmless".
    unsupported_fields: ClassVar[dict[str, Callable[[Any], bool]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, harmless in cls.unsupported_fields.items():
                if name in data and data[name] is not None and not harmless(data[name]):
                    raise UnsupportedFieldError(name, "is not supported by this server yet")
        return data

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"keys must be token ids (non-negative integers as strings), got {key!r}")
        return value

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage so far on every stream chunk (stream_options.continuous_usage_stats, even without
        include_usage, which still decides the closing usage-only chunk)."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


def _never(_: Any) -> bool:
    return False


# apply_chat_template's own arguments, which chat_template_kwargs must not override
_TEMPLATE_ARGUMENTS = {"messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize",
                       "chat_template", "continue_final_message", "return_dict", "return_tensors"}
_CHAT_UNSUPPORTED = {
    "functions": lambda v: v == [],
    "function_call": lambda v: v == "none",
    "audio": _never,
    "modalities": lambda v: v == ["text"],
    "prediction": _never,
    "web_search_options": _never,
}
_COMPLETION_UNSUPPORTED = {
    "suffix": lambda v: v == "",
}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # structured output and tools: adapters/openai/response_format.py, tools.py
    response_format: ResponseFormat | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" when tools are given
    parallel_tool_calls: bool | None = None  # False: at most one call returned; a forced call is always one
    # vLLM's extension: more variables for the model's chat template (Qwen3's {"enable_thinking": false})
    chat_template_kwargs: dict[str, Any] | None = None

    unsupported_fields = _CHAT_UNSUPPORTED

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(value or {}) & _TEMPLATE_ARGUMENTS)
        if taken:
            raise InvalidRequestError(f"chat_template_kwargs may not set {', '.join(taken)} (the request's own "
                                      "fields decide them)", param="chat_template_kwargs")
        return value

    @model_validator(mode="after")
    def _tools_usable(self) -> ChatCompletionRequest:
        check_tools(self.tools, self.tool_choice)
        return self

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return self

    @property
    def output_limit(self) -> int | None:
        """max_completion_tokens wins over the deprecated max_tokens; None: up to the context window."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# Lists must not be empty: CompletionRequest._checks says so; minItems documents it in /openapi.json.
_NonEmpty = Field(json_schema_extra={"minItems": 1})
Prompt = str | Annotated[list[str], _NonEmpty] | Annotated[list[int], _NonEmpty] | Annotated[list[list[int]], _NonEmpty]


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for completions is 16
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)

    unsupported_fields = _COMPLETION_UNSUPPORTED

    @model_validator(mode="after")
    def _checks(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError(f"best_of ({self.best_of}) must be at least n ({self.n})", param="best_of")
        if self.ranks_samples and self.stream:
            raise InvalidRequestError("best_of greater than n cannot be streamed: the best are known at the end",
                                      param="best_of")
        p = self.prompt
        if isinstance(p, list) and (not p or any(isinstance(x, list) and not x for x in p)):
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError("max_tokens 0 generates nothing; it is for scoring a prompt with echo: true "
                                      "and logprobs", param="max_tokens")
        return self

    @property
    def samples(self) -> int:
        """Completions generated per prompt: best_of of them, of which the n best are returned."""
        return self.best_of or self.n

    @property
    def ranks_samples(self) -> bool:
        """best_of > n: the n of highest cumulative logprob are returned (vLLM's ranking)."""
        return self.samples > self.n

    @property
    def scores_prompt(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) only, as lm-evaluation-harness scores prompts."""
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[str | list[int]]:
        """Each prompt as text or token ids; each becomes one engine request."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]
