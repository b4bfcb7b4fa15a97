"""Which JSON-schema keywords guided decoding enforces, and a check that names the ones it cannot.

xgrammar silently ignores keywords it does not implement (`not`, `if`, `patternProperties`, ...), which
would let output through that the client's validator then rejects. We refuse such schemas up front with
an InvalidRequestError (HTTP 400) naming every unsupported keyword and where it sits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.errors import InvalidRequestError

# Enforced by the grammar.
ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
    "unevaluatedProperties", "unevaluatedItems",
})
# Documentation only: nothing to enforce.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "strict", "nullable",
})
FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
    "uri-template", "uuid", "json-pointer", "relative-json-pointer",
})
# Keywords whose value is a map of name -> subschema, or a subschema / list of subschemas.
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems")


def unsupported_features(schema: Any, path: str = "#") -> list[str]:
    """Every unsupported keyword of `schema` as 'keyword at json-pointer' (empty: fully supported)."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"a non-object schema at {path}"]
    found = []
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            found.append(f"'{key}' at {path}")
        elif key == "format" and value not in FORMATS:
            found.append(f"'format: {value}' at {path}")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            found.append(f"non-local '$ref: {value}' at {path}")
    if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        found.append(f"'pattern' combined with 'minLength'/'maxLength' at {path}")
    for key, kind in [*((k, dict) for k in _SCHEMA_MAPS), *((k, list) for k in _SCHEMA_LISTS)]:
        if key in schema and not isinstance(schema[key], kind):
            found.append(f"malformed '{key}' (not {'an object' if kind is dict else 'an array'}) at {path}")
    for sub_path, sub in subschemas(schema, path):
        found += unsupported_features(sub, sub_path)
    return found


def subschemas(schema: dict[str, Any], path: str = "#") -> Iterator[tuple[str, Any]]:
    """The direct subschemas of `schema` with their json-pointers."""
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield f"{path}/{key}/{name}", sub
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield f"{path}/{key}/{i}", sub
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            yield f"{path}/{key}", schema[key]


def check_schema(schema: Any, param: str = "guided_decoding") -> None:
    """Raise InvalidRequestError (400) naming the schema features guided decoding cannot enforce."""
    found = unsupported_features(schema)
    if found:
        raise InvalidRequestError(
            "The JSON schema uses features that constrained decoding does not support: " + ", ".join(found),
            param=param,
        )
