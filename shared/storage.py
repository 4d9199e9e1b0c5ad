"""Object storage (MinIO/S3) through the ``minio`` SDK, run in threads so the loop never blocks.

Bodies stream in both directions: uploads read from a file object in parts, downloads yield chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, cast

import urllib3
from minio import Minio
from minio.error import S3Error

from shared.input_lines import split_lines
from shared.settings import StorageSettings

PART_SIZE = 5 * 1024 * 1024
"""Multipart upload part size (S3's smallest). The minio SDK holds each part in memory, as many
as ``PARALLEL_UPLOADS`` being sent plus the one being read: at 16 MiB and its default of 3, a
large upload held ~64 MiB (the api's and the aggregator's growth between a 50,000-line and a
1,000,000-line batch)."""
PARALLEL_UPLOADS = 2
READ_CHUNK = 256 * 1024


@dataclass(frozen=True)
class StoredObject:
    """What an upload stored: its size and the checksum of its bytes (``sha256:<hex>``)."""

    size: int
    checksum: str


class HashingReader:
    """A readable file object that hashes the bytes as the uploader reads them (no second read)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._hash.update(data)
        return data

    @property
    def checksum(self) -> str:
        return f"sha256:{self._hash.hexdigest()}"


class ObjectNotFound(Exception):
    """The key does not exist in the bucket."""


class ObjectStore:
    """The bucket batchstream keeps file bytes and partial results in."""

    def __init__(self, settings: StorageSettings, *, timeout_s: float | None = None) -> None:
        """``timeout_s`` (for a caller someone waits on) bounds each connect and read and does not
        retry a read that timed out: an S3 server that stops answering fails a call in about that
        time instead of hanging it for minutes (120 s reads, retried)."""
        self.bucket = settings.bucket
        retries = urllib3.Retry(
            total=3,
            read=0 if timeout_s else None,
            backoff_factor=0.2,
            status_forcelist=[500, 502, 503, 504],
        )
        timeout = urllib3.Timeout(connect=min(5, timeout_s or 5), read=timeout_s or 120)
        http = urllib3.PoolManager(maxsize=32, timeout=timeout, retries=retries)
        self._http = http
        self.client = Minio(
            settings.endpoint,
            access_key=settings.access_key,
            secret_key=settings.secret_key,
            secure=settings.secure,
            region=settings.region,
            http_client=http,
        )

    async def ensure_bucket(self) -> None:
        def create() -> None:
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as exc:
                    if exc.code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                        raise

        await asyncio.to_thread(create)

    async def ping(self) -> None:
        await asyncio.to_thread(self.client.bucket_exists, self.bucket)

    def close(self) -> None:
        """Close the pooled connections (on stop)."""
        self._http.clear()

    def _put_parts(self, key: str, stream: IO[bytes], length: int) -> StoredObject:
        """Upload ``stream`` in parts (blocking), hashing it as it is read for the upload."""
        reader = HashingReader(stream)
        self.client.put_object(
            self.bucket,
            key,
            cast(BinaryIO, reader),
            length=length,
            part_size=PART_SIZE,
            num_parallel_uploads=PARALLEL_UPLOADS,
        )
        size = int(self.client.stat_object(self.bucket, key).size or 0)
        return StoredObject(size, reader.checksum)

    async def put_stream(self, key: str, stream: IO[bytes], length: int = -1) -> StoredObject:
        """Upload from a readable file object in parts, hashing as it goes."""
        return await asyncio.to_thread(self._put_parts, key, stream, length)

    async def put_bytes(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.client.put_object, self.bucket, key, io.BytesIO(data), len(data))

    async def put_file(self, key: str, path: str) -> StoredObject:
        """Upload a local file in parts, hashing it as it is read for the upload."""

        def put() -> StoredObject:
            with open(path, "rb") as handle:
                return self._put_parts(key, handle, os.fstat(handle.fileno()).st_size)

        return await asyncio.to_thread(put)

    async def get_file(self, key: str, path: str) -> None:
        await asyncio.to_thread(self._translate, self.client.fget_object, self.bucket, key, path)

    async def size(self, key: str) -> int:
        stat = await asyncio.to_thread(self._translate, self.client.stat_object, self.bucket, key)
        return int(stat.size or 0)

    async def iter_chunks(
        self, key: str, chunk_size: int = READ_CHUNK, offset: int = 0, length: int = 0
    ) -> AsyncGenerator[bytes]:
        """Yield the object's bytes in chunks, holding one chunk at a time.

        ``offset``/``length`` read a range (``length`` 0: to the end).
        """
        response = await asyncio.to_thread(
            self._translate, self.client.get_object, self.bucket, key, offset, length
        )
        chunks: Iterator[bytes] = response.stream(chunk_size)
        try:
            while True:
                chunk = await asyncio.to_thread(next, chunks, b"")
                if not chunk:
                    return
                yield chunk
        finally:
            response.close()
            response.release_conn()

    async def iter_lines(self, key: str) -> AsyncGenerator[bytes]:
        """Yield the object's lines (without the newline), one at a time."""
        async for line in split_lines(self.iter_chunks(key)):
            yield line

    async def list_keys(self, prefix: str) -> list[str]:
        def names() -> list[str]:
            objects = self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
            return [o.object_name for o in objects if o.object_name]

        return await asyncio.to_thread(names)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.client.remove_object, self.bucket, key)

    async def delete_prefix(self, prefix: str) -> None:
        for key in await self.list_keys(prefix):
            await self.delete(key)

    @staticmethod
    def _translate(func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except S3Error as exc:
            if exc.code in {"NoSuchKey", "NoSuchObject"}:
                raise ObjectNotFound(args[1] if len(args) > 1 else "") from exc
            raise


def file_key(file_id: str) -> str:
    return f"files/{file_id}"


def batch_prefix(batch_id: str) -> str:
    """Every object of a batch's own (its result chunks, its dispatch order)."""
    return f"batches/{batch_id}/"


def result_chunk_prefix(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}results/"


def dispatch_order_key(batch_id: str, part: int | None = None) -> str:
    """A batch's dispatch order (``services/api/service/dispatch_order.py``), written at validation; a
    mixed batch has one per part (the lines of one base model)."""
    suffix = "" if part is None else f"-{part}"
    return f"{batch_prefix(batch_id)}dispatch-order{suffix}"
