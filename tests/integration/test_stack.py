"""The stand-in servers answer like the real ones, and the supervisor leaves nothing behind."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from minio import Minio
from minio.error import S3Error
from pymongo import AsyncMongoClient

from deploy.local import STAND_INS, Stack, free_ports
from deploy.local.processes import group_members
from shared.topics import control_topic, results_topic
from tests.support.real_servers import requested_broker


async def test_kafka_round_trip(stand_ins: Stack) -> None:
    settings = stand_ins.kafka_settings()
    topic = results_topic(settings)
    key, value = uuid.uuid4().hex.encode(), b'{"ok":true}'
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen = []
        for _ in range(20):
            batches = await consumer.getmany(timeout_ms=500)
            seen += [m for msgs in batches.values() for m in msgs if m.key == key]
            if seen:
                break
        assert [m.value for m in seen] == [value]
        assert control_topic(settings) in await consumer.topics()
    finally:
        await consumer.stop()


async def test_mongo_insert_find(stand_ins: Stack) -> None:
    env = stand_ins.env()
    client: AsyncMongoClient[dict] = AsyncMongoClient(env["BATCHSTREAM_MONGO_URI"])
    try:
        collection = client[env["BATCHSTREAM_MONGO_DATABASE"]]["stack_check"]
        doc_id = uuid.uuid4().hex
        await collection.insert_one({"_id": doc_id, "n": 1})
        found = await collection.find_one({"_id": doc_id})
        assert found == {"_id": doc_id, "n": 1}
    finally:
        await client.close()


def test_s3_put_get(stand_ins: Stack) -> None:
    settings = stand_ins.storage_settings()
    client = Minio(
        settings.endpoint,
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        secure=False,
        region=settings.region,
    )
    key, body = f"stack-check/{uuid.uuid4().hex}", b"hello\n" * 1000
    client.put_object(settings.bucket, key, io.BytesIO(body), len(body))
    response = client.get_object(settings.bucket, key)
    try:
        assert response.read() == body
    finally:
        response.close()
        response.release_conn()
    wrong = Minio(
        settings.endpoint,
        access_key=settings.access_key,
        secret_key="wrong-secret",
        secure=False,
        region=settings.region,
    )
    with pytest.raises(S3Error) as refused:
        wrong.get_object(settings.bucket, key)
    assert refused.value.code in {"SignatureDoesNotMatch", "AccessDenied", "InvalidAccessKeyId"}


def test_up_is_idempotent_and_stop_leaves_no_process(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "state", ports=free_ports(), environment="test", broker=requested_broker())
    try:
        first = stack.start(STAND_INS)
        assert [o.state for o in first] == ["started"] * 3
        pids = stack.pids()
        assert set(pids) == set(STAND_INS)
        started = [psutil.Process(pid) for pid in pids.values()]
        again = stack.start(STAND_INS)
        assert [o.state for o in again] == ["running"] * 3
        assert stack.pids() == pids
    finally:
        stack.stop()
    for proc in started:
        assert not proc.is_running(), f"pid {proc.pid} is still running"
        assert not group_members(proc.pid), f"process group {proc.pid} still has members"
    assert list((tmp_path / "state" / "run").glob("*.pid")) == []


@pytest.mark.e2e
def test_whole_stack_is_healthy(stack: Stack, model_id: str) -> None:
    status = stack.status()
    assert all(state.startswith("healthy") for state in status.values()), status
    assert any(name.startswith("inference-") for name in status), status
    assert model_id == stack.models[0].served_name
