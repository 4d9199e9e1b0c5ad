"""The cancellation rule of ``engine.py``, enforced once, for every engine.

An engine runs each request through ``RunRegistry.run``: the request becomes a task it can abort,
and whatever the work returns after an abort or a cancellation is thrown away. vLLM's serving
code catches a cancellation and returns a "client disconnected" error body instead of raising, so
without this a stopped request would come back as a failed line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from services.inference.engine import Answer, RequestAborted


class RunRegistry:
    """The requests an engine is running, by request id."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[Answer]] = {}
        self._aborted: set[str] = set()

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, request_id: str, work: Coroutine[Any, Any, Answer]) -> Answer:
        """``work``'s answer, or ``RequestAborted`` / ``CancelledError`` if it was stopped."""
        task = asyncio.ensure_future(work)
        self._running[request_id] = task
        try:
            answer = await task
        except asyncio.CancelledError:
            if self._take_aborted(request_id) and not _cancelling():
                raise RequestAborted(request_id) from None
            raise
        finally:
            self._running.pop(request_id, None)
        aborted = self._take_aborted(request_id)
        if _cancelling():
            raise asyncio.CancelledError(f"request {request_id} cancelled")
        if aborted:
            raise RequestAborted(request_id)
        return answer

    def abort(self, request_id: str) -> None:
        """Stop a running request; no-op when it is unknown or finished."""
        task = self._running.get(request_id)
        if task is not None and not task.done():  # a finished request keeps its answer
            self._aborted.add(request_id)
            task.cancel()

    def _take_aborted(self, request_id: str) -> bool:
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return True
        return False

    def cancel_all(self) -> None:
        """Stop every running request (engine shutdown): each ``run`` raises CancelledError."""
        for task in list(self._running.values()):
            task.cancel()


def _cancelling() -> bool:
    """Whether the current task was asked to cancel (even if an awaited task swallowed it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
