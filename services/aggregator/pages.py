"""What the aggregator's web pages answer (``agents.py`` registers them on faust's web server).

- ``/livez``: the process works (the event loop answers this page). A probe that fails restarts
  the container; a stall is not that case: the worker exits by itself (``supervisor.py``).
- ``/readyz``: MongoDB and S3 answer and the consumer is not stalled; 503 with the reason
  otherwise. ``/health`` is the same page (what it has always answered).
- ``/metrics``: Prometheus' text format from the default registry.

faust's web server runs from the start, in every phase, so these answer during table recovery too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


class Dependencies(Protocol):
    async def healthy(self) -> bool: ...


@dataclass(frozen=True)
class Page:
    status: int
    body: dict[str, Any] = field(default_factory=dict)


def livez(phase: str) -> Page:
    return Page(200, {"status": "alive", "phase": phase})


async def readyz(
    *, stalled: str | None, phase: str, dependencies: Dependencies | None, backlog: dict[str, int | None]
) -> Page:
    """``dependencies`` is ``None`` until the worker has built its clients."""
    if stalled is not None:
        return Page(503, {"status": "stalled", "reason": stalled, "phase": phase})
    if dependencies is None:
        return Page(503, {"status": "starting", "phase": phase})
    if not await dependencies.healthy():
        return Page(503, {"status": "unhealthy", "reason": "MongoDB or S3 does not answer", "phase": phase})
    return Page(200, {"status": "healthy", "phase": phase, "backlog": backlog})


def metrics() -> tuple[bytes, str]:
    """The exposition and its content type (with charset: aiohttp wants it as a header)."""
    return generate_latest(), CONTENT_TYPE_LATEST
