"""OpenAI `response_format` -> the runtime's GuidedDecoding.

`{"type": "text"}` (or nothing) leaves decoding free; `{"type": "json_object"}` forces one JSON object;
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` forces JSON matching the schema
(enforced whatever `strict` says: a grammar costs nothing extra once compiled). Schema features the
grammar cannot enforce are refused with a 400 naming them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.schema_check import check_schema
from runtime.request import GuidedDecoding


class JsonSchemaFormat(BaseModel):
    """The `json_schema` member of a json_schema response format."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def model_post_init(self, _: Any) -> None:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")


def response_format_guided(fmt: ResponseFormat | None) -> GuidedDecoding | None:
    """The grammar constraint for `fmt` (None: unconstrained); 400 for unsupported schema features."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GuidedDecoding(json_object=True, param="response_format")
    schema = fmt.json_schema.json_schema  # type: ignore[union-attr]
    check_schema(schema, param="response_format")
    return GuidedDecoding(json_schema=schema, param="response_format")
