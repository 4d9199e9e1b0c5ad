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
from shared.result_chunks import ChunkTally, usage_document
from shared.settings import KafkaSettings, MongoSettings, StorageSettings
from shared.storage import ObjectStore, result_chunk_prefix
from shared.stores.batch_progress import BatchProgressStore, LiveCounts

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


async def resume_in_flight(mongo: MongoSettings, storage: StorageSettings) -> list[str]:
    """Resume the batches that were running when the broker lost its data, from their stored results.

    A memory-only broker (the local stack's) forgets every request, result and offset when it
    stops, and the aggregator's state goes with it. The results already stored in a batch's chunks
    are kept: they give its counts, usage and the lines that have a result
    (``shared.result_chunks.ChunkTally``). The batch is marked ``resumed``; the api's dispatcher
    sends only its other lines, from the start of the file, and the aggregator counts on from
    the stored counts. A line in flight at the loss is sent again; nothing answered is.
    """
    db = Mongo(mongo)
    batches = BatchProgressStore(db.batches)
    store = ObjectStore(storage)
    try:
        ids = await batches.in_progress_ids()
        for batch_id in ids:
            tally = ChunkTally()
            for key in sorted(await store.list_keys(result_chunk_prefix(batch_id))):
                async for raw in store.iter_lines(key):
                    if raw.strip():
                        tally.add(raw)
            counts = LiveCounts(
                tally.completed, tally.failed, usage_document(tally.usage), tally.seen.compressed()
            )
            units = await batches.resume(batch_id, counts)
            # The dispatcher reads the input again from its start, passing over answered lines.
            await db.dispatch_positions.delete_many({"_id": {"$in": units}})
            log.info(
                "resumed a batch the broker forgot",
                extra={"batch_id": batch_id, "answered": tally.completed + tally.failed},
            )
        return ids
    finally:
        await db.close()
