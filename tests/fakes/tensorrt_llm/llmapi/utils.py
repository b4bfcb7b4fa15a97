"""AsyncQueue and print_colored (real: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/utils.py
@ cc4777e94ddab84b0e2676f1dbcc91b86060329f).

AsyncQueue.get(timeout): None waits until an item comes; > 0 raises asyncio.TimeoutError after `timeout`
seconds without one; <= 0 raises asyncio.QueueEmpty at once. The fake's producers run on the event loop,
so `put` needs no cross-thread notification.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Any, Optional


def print_colored(message: str, color: Optional[str] = None) -> None:
    codes = {"yellow": "\033[93m", "red": "\033[91m", "green": "\033[92m"}
    sys.stderr.write(codes.get(color or "", "") + message + ("\033[0m" if color else ""))


class AsyncQueue:
    """A FIFO with an awaitable get that takes a timeout."""

    def __init__(self) -> None:
        self._q: collections.deque = collections.deque()
        self._event = asyncio.Event()

    def empty(self) -> bool:
        return not self._q

    def put(self, item: Any) -> None:
        self._q.append(item)
        self._event.set()

    def get_nowait(self) -> Any:
        if not self._q:
            raise asyncio.QueueEmpty()
        return self._pop()

    async def get(self, timeout: Optional[float] = None) -> Any:
        if timeout is None:
            while not self._q:
                await self._event.wait()
        elif timeout > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not self._q:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise asyncio.TimeoutError()
                await asyncio.wait_for(self._event.wait(), timeout=remaining)
        elif not self._q:
            raise asyncio.QueueEmpty()
        return self._pop()

    def _pop(self) -> Any:
        item = self._q.popleft()
        if not self._q:
            self._event.clear()
        return item
