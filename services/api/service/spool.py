"""The input lines as validation read them, kept on local disk for the emission that follows.

Validation must read every line before any line runs (OpenAI's rule), and emission then needs
them all again: spooling them to a temporary file while validating makes that one read of the
input object per batch instead of two. The file is unnamed (gone when closed or when the process
dies) and holds at most one batch input (``max_batch_input_bytes``) per batch being processed.
A batch resumed after a restart emits from the object instead.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from types import TracebackType

# Lines read from the spool between two yields to the event loop.
YIELD_EVERY = 1000


class LineSpool:
    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()

    def __enter__(self) -> LineSpool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()

    async def tee(self, lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Pass ``lines`` through, keeping a copy of each."""
        async for line in lines:
            self._file.write(line + b"\n")
            yield line

    async def lines(self) -> AsyncIterator[bytes]:
        """The kept lines, as they were passed through (without the newline)."""
        self._file.flush()
        self._file.seek(0)
        for count, raw in enumerate(self._file, 1):
            yield raw[:-1]
            if count % YIELD_EVERY == 0:
                await asyncio.sleep(0)
