"""faust's aiokafka transport: the consumer's fetch wait from the settings, and no commit past a hole.

faust 0.15 hard-codes ``fetch_max_wait_ms=1500`` for its worker consumer. Real Kafka answers a
fetch as soon as ``fetch_min_bytes`` (1) are there, so the wait only bounds an idle poll; Tansu
(the test and local broker) holds every fetch for the full wait even when records arrive
meanwhile (measured: a record produced mid-fetch was delivered ~0.38 s later at 1500 ms, ~0.012 s
at 100 ms), so results reached the aggregator in bursts up to 1.5 s apart. A short wait costs an
idle consumer a few empty fetches a second on either broker.

faust has no setting for it, so the transport's consumer thread sets aiokafka's attribute on the
consumer it creates, before ``start()`` reads it into the fetcher (aiokafka 0.14).
``tests/unit/aggregator/test_transport.py`` fails if an upgrade moves either.
"""

from __future__ import annotations

from typing import Any

import aiokafka
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from services.aggregator.offset_gaps import lowest_acked


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    fetch_max_wait_ms = 1500  # faust's; replaced by ``transport_for``

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer


class Consumer(faust_aiokafka.Consumer):
    thread_class: type[ConsumerThread] = ConsumerThread

    def _new_offset(self, tp: TP) -> int | None:
        """faust's, except that it never commits past an offset that was not acked.

        faust's committed offset is the next one to process, but its check for a hole below the
        acked offsets treats it as the last one processed: with offset ``c`` committed and
        ``c + 1`` the lowest acked, it commits past ``c`` although ``c`` was never acked. When
        faust has dropped ``c`` (offset_gaps.py) that result would never be counted. Here any
        hole makes it wait, and the agent fetches the hole again. The results topics have no
        broker offset gaps of their own (no transactions, no compaction), so a hole is a drop.
        """
        committed = self._committed_offset.get(tp)
        gaps = (gap.begin for gap in self._gap.get(tp) or ())
        lowest = lowest_acked(self._acked.get(tp) or (), gaps)
        if committed is not None and lowest is not None and lowest > committed:
            return None
        return super()._new_offset(tp)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)


def transport_class(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    """An aiokafka transport class whose worker consumer waits at most ``fetch_max_wait_ms``."""
    thread = type("ConsumerThread", (ConsumerThread,), {"fetch_max_wait_ms": fetch_max_wait_ms})
    consumer = type("Consumer", (Consumer,), {"thread_class": thread})
    return type("Transport", (faust_aiokafka.Transport,), {"Consumer": consumer})
