"""Session fixtures shared by every test: the stand-in servers, isolated per test session.

``stand_ins`` starts Kafka (Tansu, or noida-db with ``BATCHSTREAM_TEST_BROKER=noida``), MongoDB
(SecantusDB) and S3 (SeaweedFS) on free ports in a tmp dir, creates the bucket and the base topics
(results, control) under a topic prefix unique to this session, and stops every process by PID at
the end. It yields the ``deploy.local.Stack``: ``stand_ins.env()`` is the BATCHSTREAM_*
environment pointing at it, and ``stand_ins.kafka_settings()`` / ``stand_ins.storage_settings()``
build settings objects directly.
The code behind the fixtures, and every helper tests share, lives in ``tests.support``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from deploy.local import Stack, free_ports
from tests.support.real_servers import requested_broker, servers_for_tests

SESSION_ID = uuid.uuid4().hex[:8]  # names this session's topics, database and bucket


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("stack"),
        ports=free_ports(),
        topic_prefix=f"t{SESSION_ID}.",
        mongo_database=f"batchstream_t{SESSION_ID}",
        bucket=f"batchstream-t{SESSION_ID}",
        environment="test",
        broker=requested_broker(),
    )
    try:
        with servers_for_tests(stack) as servers:  # BATCHSTREAM_TEST_SERVERS=testcontainers: real ones
            servers.provision(models=[])
            yield servers
    finally:
        stack.stop()
