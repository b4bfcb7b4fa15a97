"""Deltas -> the Responses API's stream events, or its response object.

One builder for both: a non-streamed response runs the same steps and keeps only the end result, so
both carry the same output items. Text goes to a message item (output_item.added, content_part.added,
output_text.delta ..., then output_text.done, content_part.done, output_item.done); with tools in play,
calls are read out of the text by the chat route's reader (adapters/openai/tool_calls.py), each a
function_call item announced once its name is read, its arguments streamed as the model writes them
(function_call_arguments.delta ..., then .done). An item is done when the next one starts or the output
ends; cut off by max_output_tokens (or the context window) it is "incomplete", and so is the response
(response.incomplete instead of response.completed). The stream opens with response.created and
response.in_progress; a failure after that ends it with error and response.failed. `on_done` receives the
final response object (to store it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from adapters.openai.choices import ChoiceTracker
from adapters.openai.responses_objects import (
    FunctionToolCall,
    IncompleteDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)
from adapters.openai.responses_request import ResponsesRequest
from adapters.openai.tool_prompt import tool_format
from adapters.openai.tools import ToolCallStream, calls_tools
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer

Event = dict[str, Any]


def _echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request fields a response object repeats, with the defaults that applied."""
    fmt = req.text.format if req.text and req.text.format else None
    choice = req.tool_choice or "auto"
    return dict(
        instructions=req.instructions, max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
        parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
        prompt_cache_key=req.prompt_cache_key, safety_identifier=req.safety_identifier, store=req.store,
        temperature=1.0 if req.temperature is None else req.temperature, top_p=1.0 if req.top_p is None else req.top_p,
        text={"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"},
              "verbosity": "medium"},
        tool_choice=choice if isinstance(choice, str) else choice.model_dump(),
        tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
        user=req.user, metadata=req.metadata or {},
    )


class ResponsesOutput:
    """Turns `(prompt_index, delta)` items of one engine request into events (`chunks`, `final_chunks`,
    `error_chunks`) or one response object (`add`, then `response`)."""

    def __init__(self, req: ResponsesRequest, response_id: str, model: str, tokenizer: Tokenizer,
                 created: int | None = None, on_done: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.id = response_id
        self._base = dict(id=response_id, model=model, created_at=int(time.time()) if created is None else created,
                          **_echo(req))
        self._on_done = on_done
        self._tracker = ChoiceTracker(1)
        parallel = req.parallel_tool_calls is not False
        self._tools = (ToolCallStream(tool_format(tokenizer, parallel))
                       if calls_tools(req.chat_tools(), req.chat_tool_choice()) else None)
        self._items: list[OutputItem] = []
        self._parts: list[str] | None = None  # the open (last) item's text or arguments so far; None: none open
        self._sequence = 0
        self._started = False
        self._finish_reason: str | None = None
        self._final: dict[str, Any] | None = None
        self._final_events: list[Event] = []

    # -- streaming --

    def chunks(self, item: tuple[int, OutputDelta]) -> list[Event]:
        """The events for one delta (the lifecycle's opening two before the first)."""
        events = self._opening()
        self._tracker.see(*item)
        delta = item[1]
        final = delta.finish_reason is not None
        text, calls = (delta.text, []) if self._tools is None else self._tools.feed(delta.text, final=final)
        if text:  # within one delta, text comes before calls (a call is the end of a turn)
            events += self._text_delta(text)
        for call in calls:
            if call.kind == "start":
                events += self._call_start(call.call_id, call.name)
            else:
                events += self._arguments(call.text)
        if final:
            self._finish_reason = delta.finish_reason
        return events

    def final_chunks(self) -> list[Event]:
        """The open item's closing events, then response.completed or response.incomplete."""
        if self._final is None:
            events = self._opening()
            incomplete = self._finish_reason == "length"
            events += self._close("incomplete" if incomplete else "completed")
            if incomplete:
                details = IncompleteDetails(reason="max_output_tokens")
                response = self._response("incomplete", incomplete_details=details)
            else:
                response = self._response("completed", completed_at=int(time.time()))
            events.append(self._event("response.incomplete" if incomplete else "response.completed", response=response))
            self._done(response)
            self._final_events = events
        return self._final_events

    def error_chunks(self, error: dict[str, Any]) -> list[Event]:
        """After a failure mid-stream (`error`: OpenAI's error body): the open item closed as incomplete (the
        failed response shows the output so far), the error event, then response.failed."""
        events = self._opening() + self._close("incomplete")
        info = error["error"]
        events.append(self._event("error", code=info["code"], message=info["message"], param=info["param"]))
        response = self._response("failed", error=ResponseError(code="server_error", message=info["message"]))
        events.append(self._event("response.failed", response=response))
        self._done(response)
        return events

    # -- whole response --

    def add(self, item: tuple[int, OutputDelta]) -> None:
        self.chunks(item)  # the same steps as a stream, so both give the same items

    def response(self) -> dict[str, Any]:
        self.final_chunks()
        assert self._final is not None
        return self._final

    # -- building --

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str, **fields: Any) -> dict[str, Any]:
        usage = ResponseUsage.of(self._tracker.usage) if status != "in_progress" else None
        return ResponseObject(status=status, output=list(self._items), usage=usage, **self._base,
                              **fields).model_dump()

    def _done(self, response: dict[str, Any]) -> None:
        self._final = response
        if self._on_done is not None:
            self._on_done(response)

    def _opening(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        response = self._response("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def _start(self, item: OutputItem) -> list[Event]:
        """Close the open item and open `item` (in progress, empty)."""
        events = self._close("completed")
        self._items.append(item)
        self._parts = []
        events.append(self._event("response.output_item.added", output_index=len(self._items) - 1,
                                  item=item.model_dump()))
        return events

    def _current(self) -> tuple[OutputItem | None, int]:
        """(the open item or None, its output_index)."""
        return (self._items[-1] if self._parts is not None else None), len(self._items) - 1

    def _text_delta(self, text: str) -> list[Event]:
        events = []
        if not isinstance(self._current()[0], OutputMessage):
            message = OutputMessage(id=f"msg_{uuid.uuid4().hex}", status="in_progress", content=[])
            events += self._start(message)
            events.append(self._part_event("response.content_part.added", OutputText(text="")))
        assert self._parts is not None
        self._parts.append(text)
        events.append(self._event("response.output_text.delta", item_id=self._items[-1].id,
                                  output_index=len(self._items) - 1, content_index=0, delta=text, logprobs=[]))
        return events

    def _call_start(self, call_id: str, name: str) -> list[Event]:
        return self._start(FunctionToolCall(id=f"fc_{uuid.uuid4().hex}", status="in_progress", call_id=call_id,
                                            name=name, arguments=""))

    def _arguments(self, text: str) -> list[Event]:
        call, index = self._current()
        assert isinstance(call, FunctionToolCall) and self._parts is not None
        self._parts.append(text)
        return [self._event("response.function_call_arguments.delta", item_id=call.id, output_index=index,
                            delta=text)]

    def _part_event(self, kind: str, part: OutputText) -> Event:
        return self._event(kind, item_id=self._items[-1].id, output_index=len(self._items) - 1, content_index=0,
                           part=part.model_dump())

    def _close(self, status: str) -> list[Event]:
        """Finish the open item (if any) with its whole text or arguments and `status`."""
        item, index = self._current()
        if item is None:
            return []
        whole = "".join(self._parts or [])
        self._parts = None
        item.status = status
        if isinstance(item, FunctionToolCall):
            item.arguments = whole
            return [self._event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                                arguments=whole),
                    self._event("response.output_item.done", output_index=index, item=item.model_dump())]
        part = OutputText(text=whole)
        item.content = [part]
        return [self._event("response.output_text.done", item_id=item.id, output_index=index, content_index=0,
                            text=whole, logprobs=[]),
                self._part_event("response.content_part.done", part),
                self._event("response.output_item.done", output_index=index, item=item.model_dump())]
