"""The aggregator's consumer: the configured fetch wait (faust hard-codes 1500 ms), no commit past a hole."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, cast

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from services.aggregator.app import app, config


def test_the_app_uses_the_transport_with_the_configured_fetch_wait() -> None:
    consumer_class = cast(Any, app.transport).Consumer
    assert consumer_class.thread_class.fetch_max_wait_ms == config.fetch_max_wait_ms


async def test_the_worker_consumer_is_created_with_the_wait() -> None:
    thread = cast(Any, app.consumer)._new_consumer_thread()
    assert thread.fetch_max_wait_ms == config.fetch_max_wait_ms
    consumer = thread._create_worker_consumer(app.transport)
    # aiokafka reads this attribute into its fetcher at start(); an upgrade that renames it
    # must fail here rather than silently bring back faust's 1500 ms.
    assert consumer._fetch_max_wait_ms == config.fetch_max_wait_ms
    assert "_fetch_max_wait_ms" in inspect.getsource(type(consumer).start)


@pytest.fixture
def consumer() -> Iterator[Any]:
    """The app's consumer with one partition's commit bookkeeping set by the test, then removed."""
    consumer = cast(Any, app.consumer)
    yield consumer
    for bookkeeping in (consumer._committed_offset, consumer._acked, consumer._acked_index):
        bookkeeping.pop(TP_UNDER_TEST, None)


TP_UNDER_TEST = TP("new-offset-test", 0)


def acked_after(consumer: Any, committed: int, acked: list[int]) -> None:
    consumer._committed_offset[TP_UNDER_TEST] = committed
    consumer._acked[TP_UNDER_TEST] = list(acked)
    consumer._acked_index[TP_UNDER_TEST] = set(acked)


def test_faust_alone_commits_past_an_offset_that_was_never_acked(consumer: Any) -> None:
    """Why the transport's consumer overrides ``_new_offset`` (fails once faust fixes it)."""
    acked_after(consumer, 100, [101, 102])
    assert faust_aiokafka.Consumer._new_offset(consumer, TP_UNDER_TEST) == 103


def test_the_consumer_does_not_commit_past_an_offset_that_was_never_acked(consumer: Any) -> None:
    acked_after(consumer, 100, [101, 102])
    assert consumer._new_offset(TP_UNDER_TEST) is None
    consumer._acked[TP_UNDER_TEST].append(100)
    assert consumer._new_offset(TP_UNDER_TEST) == 103
