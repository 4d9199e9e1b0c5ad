"""The aggregator's consumer gets the configured fetch wait (faust hard-codes 1500 ms)."""

from __future__ import annotations

import inspect
from typing import Any, cast

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
