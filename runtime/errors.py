"""Typed runtime errors. The gateway maps each class to one HTTP status (gateway/errors.py)."""

from __future__ import annotations


def brief(value: object, limit: int = 300) -> str:
    """`value` as text of at most `limit` characters, for log lines: a rejected request may quote a value of
    megabytes (a 4,000-digit number made a 4 KB line)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class EngineError(Exception):
    """Base of every error the engine raises to callers."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(EngineError):
    """The request is malformed or an option is out of range. `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """Prompt plus requested output does not fit the context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_window: int) -> None:
        super().__init__(
            f"This model's maximum context length is {context_window} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_window = context_window


class UnsupportedOptionError(InvalidRequestError):
    """An option this backend cannot honour (named, with the backend)."""

    def __init__(self, option: str, backend: str, detail: str = "") -> None:
        msg = f"'{option}' is not supported by the {backend} backend"
        super().__init__(msg + (f": {detail}" if detail else ""), param=option)
        self.option = option
        self.backend = backend


class UnknownAdapterError(EngineError):
    """A LoRA adapter (by name or task id) that is not loaded."""


class QueueFullError(EngineError):
    """The waiting queue is at --max-queue-size."""


class EngineNotReadyError(EngineError):
    """The engine is loading or shutting down."""


class EngineFailedError(EngineError):
    """The engine failed while serving this request (or died)."""


class UnknownLoraTaskError(InvalidRequestError):
    """A Triton lora_task_id that is neither cached nor a registered adapter, sent without weights (400)."""

    def __init__(self, task_id: int) -> None:
        super().__init__(
            f"LoRA task {task_id} not found in cache. Please send LoRA weights with request "
            "(lora_weights and lora_config) or use the id of a loaded adapter.", param="lora_task_id")
        self.task_id = task_id
