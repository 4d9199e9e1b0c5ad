"""Create what the services expect to exist: the bucket and the topics.

Idempotent; used by the local stack (``deploy.local``) and by docker compose's ``init``
service. Reads every address from the BATCHSTREAM_* environment::

    python -m deploy.provision --model gemma-3-270m [--model other] [--timeout 60]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tenacity import AsyncRetrying, stop_after_delay, wait_random_exponential

from shared.kafka import ensure_topics, wait_for_kafka
from shared.mongo import Mongo
from shared.settings import KafkaSettings, MongoSettings, StorageSettings
from shared.storage import ObjectStore, result_chunk_prefix
from shared.stores.batches import BatchStore

log = logging.getLogger(__name__)

READY_PROBE_KEY = ".batchstream/ready"


async def _retry(make: Callable[[], Awaitable[Any]], timeout_s: float) -> Any:
    """``make()`` until it succeeds, with jittered backoff (0.1 s to 2 s); after ``timeout_s``, its error."""
    async for attempt in AsyncRetrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_random_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    ):
        with attempt:
            return await make()
    raise AssertionError("unreachable: tenacity returns or raises")


async def provision(
    kafka: KafkaSettings,
    storage: StorageSettings,
    models: Sequence[str],
    timeout_s: float = 60.0,
) -> None:
    """Topics (results, control, requests.<model> per model) and the bucket, once each."""
    await wait_for_kafka(kafka, timeout_s=timeout_s)
    await ensure_topics(kafka, list(models))
    store = ObjectStore(storage)
    await _retry(store.ensure_bucket, timeout_s)
    # An object written and read back: S3 servers can answer GETs with 500 just after a start.
    await _retry(lambda: store.put_bytes(READY_PROBE_KEY, b"ok"), timeout_s)
    await _retry(lambda: store.size(READY_PROBE_KEY), timeout_s)
    log.info("provisioned bucket %s and topics for %s", storage.bucket, list(models))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy.provision", description=__doc__)
    parser.add_argument("--model", action="append", default=[], help="a served model id")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(provision(KafkaSettings(), StorageSettings(), args.model, args.timeout))


if __name__ == "__main__":
    main()


async def requeue_in_flight(mongo: MongoSettings, storage: StorageSettings) -> list[str]:
    """Make batches that were running when the broker lost its data run again from the start.

    A memory-only broker (the local stack's) forgets every request, result and offset when it
    stops. Batches still ``in_progress`` in MongoDB are marked not yet emitted, their partial
    results and counts dropped, so the api publishes all their lines again on start; the
    aggregator's state went with the broker, so every line is counted once from scratch.
    """
    db = Mongo(mongo)
    batches = BatchStore(db.batches)
    store = ObjectStore(storage)
    try:
        ids = await batches.in_progress_ids()
        for batch_id in ids:
            await store.delete_prefix(result_chunk_prefix(batch_id))
            await batches.requeue(batch_id)
            # The dispatcher sends every line again from the start of the input file.
            await db.dispatch_positions.delete_one({"_id": batch_id})
        if ids:
            log.info("requeued batches the broker forgot", extra={"batches": ids})
        return ids
    finally:
        await db.close()
