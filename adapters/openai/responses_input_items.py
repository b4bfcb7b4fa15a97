"""GET /v1/responses/{id}/input_items: the items a stored response was generated from, as OpenAI lists them.

The items are the conversation the model saw: those of the responses it continued (previous_response_id, their
input and output), then its own input. Each has an id: its own when the client sent one or it was an earlier
response's output item, else one given when the response was stored (`with_ids`), so pages stay stable.
OpenAI's list shape (`object: "list"`, `data`, `first_id`, `last_id`, `has_more`) and query parameters: `limit`
(1 to 100, default 20), `order` ("desc", the default, newest first, or "asc"), `after` (an item id: the items
after it in that order). `include` is accepted and changes nothing: these items carry nothing it could add.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from adapters.openai.responses_request import InputItem, TextPart
from runtime.errors import InvalidRequestError

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
DEFAULT_LIMIT, MAX_LIMIT = 20, 100


def with_ids(items: Sequence[InputItem]) -> list[InputItem]:
    """`items`, each with an id (a new one where it has none)."""
    return [item if item.id else item.model_copy(update={"id": f"{_ID_PREFIX[item.type]}_{uuid.uuid4().hex}"})
            for item in items]


def _parts(content: str | list[TextPart] | None, role: str | None) -> list[dict[str, Any]]:
    """Message content as OpenAI's parts: a string becomes one input_text part (output_text for the assistant)."""
    if isinstance(content, list):
        return [{**part.model_dump(exclude_none=True), **({"annotations": []} if part.type == "output_text" else {})}
                for part in content]
    if role == "assistant":
        return [{"type": "output_text", "text": content or "", "annotations": []}]
    return [{"type": "input_text", "text": content or ""}]


def item_object(item: InputItem) -> dict[str, Any]:
    """One input item as OpenAI lists it (status "completed": the response it belongs to is done)."""
    common = {"id": item.id, "type": item.type, "status": "completed"}
    if item.type == "message":
        return {**common, "role": item.role, "content": _parts(item.content, item.role)}
    if item.type == "function_call":
        return {**common, "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    output = item.output if isinstance(item.output, str) else _parts(item.output, None)
    return {**common, "call_id": item.call_id, "output": output}


def _limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequestError(f"Invalid 'limit': {raw!r}; it must be an integer from 1 to {MAX_LIMIT}.",
                                  param="limit")
    return int(raw)


def input_item_list(items: Sequence[InputItem], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of `items` (a response's input, oldest first) for the query parameters `query`."""
    limit = _limit(query)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError(f"Invalid 'order': {order!r}; it must be 'asc' or 'desc'.", param="order")
    listed = [item_object(item) for item in (items if order == "asc" else reversed(items))]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in listed]
        if after not in ids:
            raise InvalidRequestError(f"No input item with id '{after}' in this response.", param="after")
        listed = listed[ids.index(after) + 1:]
    page = listed[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(listed) > limit}
