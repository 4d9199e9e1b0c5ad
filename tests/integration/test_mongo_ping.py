"""MongoDB through `shared.mongo` across a server restart: the health ping does not flap on a stale
pooled connection, and acknowledged writes survive a SIGKILL.

Seen: after a quiet spell the first ``GET /health`` answered 503 "mongodb unavailable"
("connection is already closed") while MongoDB was up. Reproduced here by restarting a private
MongoDB-wire server on the same port: every pooled connection is then dead, as after a server-side
idle close, and the first ping must still succeed (it retries once on a fresh connection).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import free_port
from shared.mongo import Mongo
from shared.settings import MongoSettings
from tests.support.private_servers import PrivateMongo


@pytest.fixture
def private_mongo(tmp_path: Path) -> Iterator[PrivateMongo]:
    server = PrivateMongo(free_port(), tmp_path / "mongo")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_the_first_ping_after_the_pool_went_stale_succeeds(private_mongo: PrivateMongo) -> None:
    mongo = Mongo(MongoSettings(uri=f"mongodb://127.0.0.1:{private_mongo.port}/?directConnection=true"))
    try:
        await mongo.ping()
        private_mongo.stop()  # every pooled connection dies with the server...
        private_mongo.start()  # ...which is up again before the next probe
        await mongo.ping()
        await mongo.ping()
    finally:
        await mongo.close()


async def test_writes_acknowledged_before_a_sigkill_are_kept(private_mongo: PrivateMongo) -> None:
    """The default write concern is journaled: without it the local server lost every write since
    its last checkpoint on a SIGKILL (a completed batch came back ``in_progress``)."""
    settings = MongoSettings(uri=f"mongodb://127.0.0.1:{private_mongo.port}/?directConnection=true")
    mongo = Mongo(settings)
    try:
        for n in range(50):
            await mongo.batches.update_one({"_id": f"b{n}"}, {"$set": {"n": n}}, upsert=True)
        private_mongo.stop()  # SIGKILL right after the last acknowledgement
        private_mongo.start()
        assert await mongo.batches.count_documents({}) == 50
    finally:
        await mongo.close()
