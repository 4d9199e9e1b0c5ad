"""Input files this api process uploaded, kept on its local disk: validation and the dispatcher read
them from there instead of from object storage.

A batch's input used to cross the network three times (upload, validation, dispatch); the S3
server's CPU for the two reads was a quarter of the whole pipeline's (docs/benchmarks.md). A file's
bytes never change after its upload (its key is a fresh file id), so a copy written while the
upload streams to object storage, and kept only once that upload succeeded, is the same bytes.
Another replica, a restarted api or an evicted copy reads object storage as before: the copy is
an optimisation, never the record. The directory is bounded (least recently used copies go first)
and emptied when the api starts and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import IO

from shared.settings import StorageSettings
from shared.storage import READ_CHUNK, ObjectStore, StoredObject

log = logging.getLogger(__name__)

SUBDIRECTORY = "batchstream-input-copies"


class LocalCopies:
    """A bounded directory of object copies, by key; thread-safe (uploads run in threads)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory, self.max_bytes = directory, max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()  # oldest use first
        self._total = 0
        self._lock = threading.Lock()
        shutil.rmtree(directory, ignore_errors=True)  # copies of an earlier process are not known
        directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def at(cls, directory: str, max_bytes: int) -> LocalCopies:
        """In ``SUBDIRECTORY`` of ``directory`` (only that is ever emptied, never what else the
        directory holds), or in a fresh temporary directory when ``directory`` is empty."""
        if not directory:
            return cls(Path(tempfile.mkdtemp(prefix="batchstream-input-copies-")), max_bytes)
        return cls(Path(directory) / SUBDIRECTORY, max_bytes)

    def _path(self, key: str) -> Path:
        return self.directory / key.replace("/", "%2F")

    def path(self, key: str) -> Path | None:
        """The copy of ``key``, if this process holds one (it becomes the most recently used)."""
        with self._lock:
            if key not in self._sizes:
                return None
            self._sizes.move_to_end(key)
            return self._path(key)

    def part_path(self, key: str) -> Path:
        """Where a copy is written before it is kept (``keep``)."""
        return self._path(key).with_name(self._path(key).name + ".part")

    def keep(self, key: str, part: Path, size: int) -> None:
        """A complete copy: keep it, making room by dropping the least recently used. An empty
        or too large copy is not kept; nor one whose part file is gone (emptied at shutdown)."""
        with self._lock:
            if not 0 < size <= self.max_bytes:
                part.unlink(missing_ok=True)
                return
            while self._sizes and self._total + size > self.max_bytes:
                oldest, dropped = self._sizes.popitem(last=False)
                self._total -= dropped
                self._path(oldest).unlink(missing_ok=True)  # a reader's open handle stays valid
            try:
                os.replace(part, self._path(key))
            except OSError as exc:
                log.warning("could not keep a local copy: %s", exc, extra={"key": key})
                return
            self._sizes[key] = size
            self._total += size

    def drop(self, key: str) -> None:
        with self._lock:
            size = self._sizes.pop(key, None)
            if size is not None:
                self._total -= size
                self._path(key).unlink(missing_ok=True)

    def remove_all(self) -> None:
        with self._lock:
            self._sizes.clear()
            self._total = 0
            shutil.rmtree(self.directory, ignore_errors=True)


class _TeeReader:
    """Reads ``stream`` for the uploader and writes what it read to ``copy``; gives up copying
    (not uploading) past ``limit`` bytes."""

    def __init__(self, stream: IO[bytes], copy: IO[bytes], limit: int) -> None:
        self._stream, self._copy, self._limit = stream, copy, limit
        self.copied = 0
        self.complete = True

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if self.complete:
            self.copied += len(data)
            self.complete = self.copied <= self._limit and self._write(data)
        return data

    def _write(self, data: bytes) -> bool:
        """Copy ``data``; a failure (a full disk) ends the copy, never the upload."""
        try:
            self._copy.write(data)
        except OSError as exc:
            log.warning("stopped copying an upload locally: %s", exc)
            return False
        return True


class LocalFirstStore(ObjectStore):
    """Object storage that keeps a local copy of each upload and reads that copy first."""

    def __init__(
        self, settings: StorageSettings, copies: LocalCopies, *, timeout_s: float | None = None
    ) -> None:
        super().__init__(settings, timeout_s=timeout_s)
        self.copies = copies

    async def put_stream(self, key: str, stream: IO[bytes], length: int = -1) -> StoredObject:
        if self.copies.max_bytes <= 0 or length > self.copies.max_bytes:
            return await super().put_stream(key, stream, length)
        part = self.copies.part_path(key)
        try:
            copy_file = part.open("wb")
        except OSError as exc:  # the copy is an optimisation: upload without it
            log.warning("cannot copy an upload locally: %s", exc)
            return await super().put_stream(key, stream, length)
        with copy_file as copy:
            tee = _TeeReader(stream, copy, self.copies.max_bytes)
            try:
                stored = await super().put_stream(key, tee, length)  # type: ignore[arg-type]
            except BaseException:
                part.unlink(missing_ok=True)
                raise
        if tee.complete and tee.copied == stored.size:
            self.copies.keep(key, part, stored.size)
        else:
            part.unlink(missing_ok=True)
        return stored

    async def iter_chunks(
        self, key: str, chunk_size: int = READ_CHUNK, offset: int = 0, length: int = 0
    ) -> AsyncGenerator[bytes]:
        path = self.copies.path(key)
        handle = None
        if path is not None:
            with contextlib.suppress(FileNotFoundError):  # evicted since: read object storage
                handle = path.open("rb")
        if handle is None:
            async for chunk in super().iter_chunks(key, chunk_size, offset, length):
                yield chunk
            return
        # Local reads of page-cached bytes take microseconds: done on the loop, not in threads,
        # yielding after each chunk so that a long read (validating 200 MB) never holds the loop.
        with handle:
            handle.seek(offset)
            left = length or -1
            while left:
                chunk = handle.read(chunk_size if left < 0 else min(chunk_size, left))
                if not chunk:
                    return
                left = left - len(chunk) if left > 0 else left
                yield chunk
                await asyncio.sleep(0)

    async def delete(self, key: str) -> None:
        self.copies.drop(key)
        await super().delete(key)
