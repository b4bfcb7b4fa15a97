"""Parse a JSON body into a request schema; turn pydantic errors into one clear message with `param`."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from runtime.errors import InvalidRequestError

M = TypeVar("M", bound=BaseModel)

MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class OpenAIValueError(InvalidRequestError):
    """A 400 carrying the `code` OpenAI answers the same mistake with (e.g. "string_above_max_length")."""

    def __init__(self, message: str, param: str, code: str) -> None:
        super().__init__(message, param=param)
        self.code = code


def check_metadata(metadata: Any) -> None:
    """OpenAI's limits on `metadata`: at most 16 pairs, keys up to 64 characters, string values up to 512, each
    refused with OpenAI's message, param and code (other types are left to the schema's own error)."""
    if not isinstance(metadata, dict):
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise OpenAIValueError(f"Invalid 'metadata': too many properties. Expected an object with at most "
                               f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} properties "
                               "instead.", "metadata", "object_above_max_properties")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise OpenAIValueError(f"Invalid 'metadata': string too long. Expected a key with maximum length "
                                   f"{MAX_METADATA_KEY}, but got a key with length {len(key)} instead.", "metadata",
                                   "string_above_max_length")
        if isinstance(value, str) and len(value) > MAX_METADATA_VALUE:
            param = f"metadata.{key}"
            raise OpenAIValueError(f"Invalid '{param}': string too long. Expected a string with maximum length "
                                   f"{MAX_METADATA_VALUE}, but got a string with length {len(value)} instead.", param,
                                   "string_above_max_length")

# Names pydantic puts into `loc` for the branches of a union (not field names).
_SCALAR_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _SCALAR_TAGS or "[" in part)


def _param(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content', union branch tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(part):
            out += ("." if out else "") + str(part)
    return out


def _union_branches(errors: list[dict[str, Any]]) -> tuple[tuple[Any, ...], list[str]] | None:
    """When every error is a failed branch of one union: (the union's loc, its branch names)."""
    first = errors[0]["loc"]
    for i, part in enumerate(first):
        if _is_tag(part):
            prefix = first[:i]
            if all(e["loc"][:i] == prefix and len(e["loc"]) > i and _is_tag(e["loc"][i]) for e in errors):
                return prefix, list(dict.fromkeys(e["loc"][i] for e in errors))
            return None
    return None


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ").rstrip(".")


def parse_request(schema: type[M], body: Any) -> M:
    """Validate `body` (decoded JSON) against `schema`; raise InvalidRequestError naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    try:
        return schema.model_validate(body)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        # Our own validators' messages are the most specific; prefer them over type mismatches.
        chosen = next((e for e in errors if e["type"] == "value_error"), None)
        union = None if chosen else _union_branches(errors)
        if union is not None:
            loc, branches = union
            param = _param(loc)
            msg = f"Invalid type for '{param}': expected one of {', '.join(branches)}."
            raise InvalidRequestError(msg, param=param) from None
        chosen = chosen or errors[0]
        param = _param(chosen["loc"])
        if chosen["type"] == "missing":
            raise InvalidRequestError(f"Missing required parameter: '{param}'.", param=param) from None
        where = f"Invalid value for '{param}': " if param else "Invalid request: "
        raise InvalidRequestError(f"{where}{_clean(chosen['msg'])}.", param=param or None) from None
