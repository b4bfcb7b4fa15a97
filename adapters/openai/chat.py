"""Deltas -> /v1/chat/completions responses and stream chunks."""

from __future__ import annotations

from typing import Any

from adapters.openai.choices import EndpointOutput
from adapters.openai.logprobs import chat_logprobs
from adapters.openai.requests import ChatCompletionRequest
from adapters.openai.tool_prompt import tool_format
from adapters.openai.tools import ToolCallStream, calls_tools, with_tool_calls
from adapters.openai.responses import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletion,
    ChatCompletionChunk,
    ChatResponseMessage,
    ChatTokenLogprob,
    chat_chunk_choice,
    stream_chunk,
)
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer


class ChatOutput(EndpointOutput):
    """Turns `(prompt_index, delta)` items into chat chunks (`chunks`) or one response (`add`, then
    `response`). Each choice's stream opens with a `{"role": "assistant", "content": ""}` chunk."""

    req: ChatCompletionRequest
    _chunk_type = ChatCompletionChunk

    def __init__(self, req: ChatCompletionRequest, response_id: str, model: str, tokenizer: Tokenizer,
                 created: int | None = None) -> None:
        super().__init__(req, response_id, model, tokenizer, created)
        # tool calls are parsed out of the text when tools are in play (adapters/openai/tools.py)
        parallel = req.parallel_tool_calls is not False
        self._tool_format = tool_format(tokenizer, parallel) if calls_tools(req.tools, req.tool_choice) else None
        self._tool_streams: dict[int, ToolCallStream] = {}
        self._logprobs: dict[int, list[ChatTokenLogprob]] = {}

    def _logprob_entries(self, delta: OutputDelta) -> list[ChatTokenLogprob] | None:
        """The delta's logprobs, without the stop token that ended it where the backend delivers it (OpenAI's content
        has no `<|im_end|>`), unless its text is in the output (include_stop_str_in_output with a stop token id)."""
        if not self.req.logprobs or delta.logprobs is None:
            return None
        ids, entries = delta.token_ids, delta.logprobs
        if delta.finish_reason == "stop" and ids and not isinstance(delta.stop_reason, str):
            ended_by = ids[-1] in self._tok.eos_token_ids if delta.stop_reason is None else ids[-1] == delta.stop_reason
            if ended_by and not (self.req.include_stop_str_in_output and delta.stop_reason is not None):
                ids, entries = ids[:-1], entries[:-1]
        return chat_logprobs(self._tok, self.req.top_logprobs or 0, ids, entries)

    def _chunk(self, choice: dict[str, Any], not_yet: int = 0) -> dict[str, Any]:
        # OpenAI: every chunk has usage null when usage is requested; vLLM's continuous usage: the counts so far
        return stream_chunk("chat.completion.chunk", self.id, self.created, self.model, choice, self.req.include_usage,
                            self._running_usage(not_yet))

    # -- streaming --

    def chunks(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        """The chunks for one delta: the role chunk before a choice's first output, then its content."""
        choice, first = self._tracker.see(*item)
        delta = item[1]
        out = []
        if first:
            out.append(self._chunk(chat_chunk_choice(choice, role="assistant", content=""),
                                   not_yet=len(delta.token_ids)))
        entries = self._logprob_entries(delta)
        text, calls, finish = delta.text, None, delta.finish_reason
        if self._tool_format is not None:
            stream = self._tool_streams.setdefault(choice, ToolCallStream(self._tool_format))
            text, calls = stream.push_deltas(delta.text, final=finish is not None)
            finish = with_tool_calls(finish, stream.num_calls > 0)
        if text or calls or finish is not None or entries:
            logprobs = ChatChoiceLogprobs(content=entries) if entries is not None else None
            out.append(self._chunk(chat_chunk_choice(choice, content=text or None, tool_calls=calls or None,
                                                     logprobs=logprobs, finish_reason=finish)))
        return out

    # -- whole response --

    def add(self, item: tuple[int, OutputDelta]) -> None:
        choice, _ = self._tracker.see(*item)
        delta = item[1]
        self._text.setdefault(choice, []).append(delta.text)
        entries = self._logprob_entries(delta)
        if entries is not None:
            self._logprobs.setdefault(choice, []).extend(entries)

    def response(self) -> dict[str, Any]:
        choices = [
            ChatChoice(
                index=i,
                message=(message := self._message("".join(self._text[i]))),
                logprobs=ChatChoiceLogprobs(content=self._logprobs.get(i, [])) if self.req.logprobs else None,
                finish_reason=with_tool_calls(self._tracker.finish_reasons.get(i), bool(message.tool_calls)),
            )
            for i in sorted(self._text)
        ]
        return self._with_usage(ChatCompletion, choices)

    def _message(self, text: str) -> ChatResponseMessage:
        """The assistant message; with tools in play, calls are parsed out of the text."""
        if self._tool_format is None:
            return ChatResponseMessage(content=text)
        content, calls = self._tool_format.parse(text)
        return ChatResponseMessage(content=content, tool_calls=[c.wire() for c in calls] or None)
