"""A batch's live ``request_counts`` as a rich progress bar, with the rate and the time left.

The time left is the batch's own estimate while it has one (``estimated_completion_at``, by its
work left or its lines left: docs/api.md, "Estimated completion"), shown as ``ends in H:MM:SS``;
before that, rich's estimate from the counts this display has seen.

On a terminal the bar is redrawn in place; written to a file or a pipe (CI logs, tests) it prints
the same columns as one line each time the status or the counts change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from openai.types import Batch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class LinesPerSecondColumn(ProgressColumn):
    """Finished lines per second, over rich's recent samples (blank until there are two)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.1f} lines/s" if speed else "", style="progress.data.speed")


class TimeLeftColumn(TimeRemainingColumn):
    """The batch's estimated end (the api's ``estimated_completion_at``) as the time left from now;
    rich's own estimate while the batch has none."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._clock = clock

    def render(self, task: Task) -> Text:
        end = task.fields.get("estimated_end")
        if not isinstance(end, int | float) or task.finished:
            return super().render(task)
        left = max(0, int(end - self._clock()))
        hours, rest = divmod(left, 3600)
        return Text(f"ends in {hours}:{rest // 60:02d}:{rest % 60:02d}", style="progress.remaining")


class BatchProgress:
    """Call with each batch state read (``wait(on_progress=...)``); use as a context manager."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal and not console.is_dumb_terminal
        self._progress = Progress(
            TextColumn("{task.fields[batch_id]}"),
            TextColumn("[bold]{task.fields[status]:<11}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            LinesPerSecondColumn(),
            TimeLeftColumn(),
            TextColumn("{task.fields[failed]}", style="red"),
            console=console,
            auto_refresh=self.live,
        )
        # A file or a pipe has no width (rich assumes 80): too narrow for the bar, rate and ETA.
        self._lines = Console(file=console.file, width=max(console.width, 140), no_color=console.no_color)
        self._task: TaskID | None = None
        self._last: tuple[str, int, int, int] | None = None

    def __enter__(self) -> BatchProgress:
        if self.live:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live:
            self._progress.stop()

    def __call__(self, batch: Batch) -> None:
        counts = batch.request_counts
        total = counts.total if counts else 0
        failed = counts.failed if counts else 0
        done = (counts.completed if counts else 0) + failed
        failures = f"{failed} failed" if failed else ""
        if self._task is None:
            self._task = self._progress.add_task(
                "batch", total=None, batch_id="", status="", failed="", estimated_end=None
            )
        self._progress.update(
            self._task,
            total=total or None,
            completed=done,
            batch_id=batch.id,
            status=batch.status,
            failed=failures,
            estimated_end=(batch.model_extra or {}).get("estimated_completion_at"),
        )
        state = (batch.status, done, total, failed)
        if not self.live and state != self._last:
            self._lines.print(self._progress.get_renderable())
        self._last = state
