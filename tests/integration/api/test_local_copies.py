"""The api's local copies of uploads (services/api/local_copies.py) against the real S3 stand-in.

A read through the copy must return exactly what object storage holds, whole or by range, and
when the copy is gone (evicted, another replica, a restart) the read falls back to object storage;
deleting a file removes both.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from deploy.local.stack import Stack
from services.api.local_copies import LocalCopies, LocalFirstStore
from shared.storage import ObjectNotFound, ObjectStore


class _BreaksAfterFirstRead:
    """An upload stream whose client goes away after the first part (a fake of a dropped upload)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._reads = data, 0

    def read(self, size: int = -1) -> bytes:
        self._reads += 1
        if self._reads > 1:
            raise ConnectionResetError("client went away")
        return self._data[: size if size > 0 else None]


@pytest.fixture
def copies(tmp_path: Path) -> Iterator[LocalCopies]:
    local = LocalCopies(tmp_path / "copies", max_bytes=10_000)
    yield local
    local.remove_all()


@pytest.fixture
def plain(stand_ins: Stack) -> Iterator[ObjectStore]:
    store = ObjectStore(stand_ins.storage_settings())
    yield store
    store.close()


@pytest.fixture
async def store(stand_ins: Stack, copies: LocalCopies) -> AsyncIterator[LocalFirstStore]:
    local_first = LocalFirstStore(stand_ins.storage_settings(), copies)
    await local_first.ensure_bucket()
    yield local_first
    local_first.close()


def _key() -> str:
    return f"files/file-test-{uuid.uuid4().hex}"


async def _read(store: ObjectStore, key: str, offset: int = 0, length: int = 0, chunk: int = 7) -> bytes:
    return b"".join([c async for c in store.iter_chunks(key, chunk_size=chunk, offset=offset, length=length)])


async def test_reads_from_the_copy_equal_object_storage(store: LocalFirstStore, plain: ObjectStore) -> None:
    data = b"".join(b'{"custom_id": "r%d"}\n' % i for i in range(200))
    key = _key()
    await store.put_stream(key, io.BytesIO(data), len(data))

    assert store.copies.path(key) is not None
    assert await _read(store, key) == data == await _read(plain, key)
    for offset, length in [(0, 1), (5, 100), (len(data) - 3, 3), (len(data) - 3, 0), (100, 0)]:
        assert await _read(store, key, offset, length) == await _read(plain, key, offset, length)
    assert [line async for line in store.iter_lines(key)] == data.split(b"\n")[:-1]


async def test_without_its_copy_a_file_is_read_from_object_storage(store: LocalFirstStore) -> None:
    first, second = _key(), _key()
    data_a, data_b = b"a" * 6_000 + b"\n", b"b" * 6_000 + b"\n"
    await store.put_stream(first, io.BytesIO(data_a), len(data_a))
    await store.put_stream(second, io.BytesIO(data_b), len(data_b))  # 12 kB > 10 kB: evicts first

    assert store.copies.path(first) is None and store.copies.path(second) is not None
    assert await _read(store, first, chunk=4096) == data_a
    assert await _read(store, second, chunk=4096) == data_b
    assert sum(1 for _ in store.copies.directory.iterdir()) == 1


async def test_an_upload_larger_than_the_copies_keeps_no_copy(store: LocalFirstStore) -> None:
    key, data = _key(), b"x" * 20_000
    await store.put_stream(key, io.BytesIO(data), -1)  # length unknown: found out while copying

    assert store.copies.path(key) is None
    assert list(store.copies.directory.iterdir()) == []
    assert await _read(store, key, chunk=8192) == data


async def test_a_failed_upload_leaves_no_copy(store: LocalFirstStore) -> None:
    key = _key()
    with pytest.raises(ConnectionResetError):
        await store.put_stream(key, _BreaksAfterFirstRead(b"y" * 9_000), -1)  # type: ignore[arg-type]

    assert store.copies.path(key) is None
    assert list(store.copies.directory.iterdir()) == []


async def test_deleting_a_file_removes_its_copy_and_its_object(store: LocalFirstStore) -> None:
    key, data = _key(), b"z" * 100
    await store.put_stream(key, io.BytesIO(data), len(data))
    await store.delete(key)

    assert store.copies.path(key) is None
    assert list(store.copies.directory.iterdir()) == []
    with pytest.raises(ObjectNotFound):
        await _read(store, key)


def test_a_configured_directory_keeps_what_else_it_holds(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("not ours")
    copies = LocalCopies.at(str(tmp_path), max_bytes=100)
    copies.remove_all()

    assert (tmp_path / "precious.txt").read_text() == "not ours"
    assert not copies.directory.exists()


async def test_an_upload_succeeds_when_its_copy_cannot_be_written(store: LocalFirstStore) -> None:
    store.copies.remove_all()  # the directory is gone: no copy can be written
    key, data = _key(), b"w" * 5_000
    await store.put_stream(key, io.BytesIO(data), len(data))

    assert store.copies.path(key) is None
    assert await _read(store, key, chunk=4096) == data
