"""How a worker joins its model's consumer group: static or dynamic, and how soon a dead one is
noticed (``consumer.consumer_options``; the recovery times are measured by tests/chaos)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pydantic
import pytest
from aiokafka import AIOKafkaConsumer

from deploy.local import ModelSpec, Stack
from services.inference.consumer import consumer_options, make_consumer
from services.inference.settings import InferenceSettings
from shared.settings import KafkaSettings

KAFKA = KafkaSettings(bootstrap_servers="127.0.0.1:1")


async def test_a_worker_with_an_instance_id_joins_as_a_static_member_with_its_session() -> None:
    settings = InferenceSettings(
        engine="fake", group_instance_id="inference-m-0", session_timeout_s=6, heartbeat_interval_s=1
    )
    consumer = make_consumer(KAFKA, "g", **consumer_options(settings))
    assert consumer._group_instance_id == "inference-m-0"
    assert (consumer._session_timeout_ms, consumer._heartbeat_interval_ms) == (6000, 1000)
    # Canary: aiokafka hands these attributes to its group coordinator (which sends them on
    # JoinGroup); an upgrade that renames them must fail here.
    source = inspect.getsource(AIOKafkaConsumer.start)
    for attribute in ("_group_instance_id", "_session_timeout_ms", "_heartbeat_interval_ms"):
        assert attribute in source


async def test_without_an_instance_id_a_worker_is_a_dynamic_member_on_aiokafkas_timeouts() -> None:
    consumer = make_consumer(KAFKA, "g", **consumer_options(InferenceSettings(engine="fake")))
    assert consumer._group_instance_id is None
    assert (consumer._session_timeout_ms, consumer._heartbeat_interval_ms) == (10_000, 3000)


def test_a_heartbeat_as_slow_as_the_session_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="heartbeat_interval_s"):
        InferenceSettings(session_timeout_s=6, heartbeat_interval_s=6)


def test_the_local_stacks_workers_are_dynamic_members_on_a_short_session(tmp_path: Path) -> None:
    """Dynamic, not static, on the local broker: measured faster with two workers (catalogue.py)."""
    comps = Stack(tmp_path, models=[ModelSpec("", "m", engine="fake")]).components()
    settings = InferenceSettings.model_validate(
        {
            k.removeprefix("BATCHSTREAM_INFERENCE_").lower(): v
            for k, v in comps["inference-m"].env.items()
            if k.startswith("BATCHSTREAM_INFERENCE_")
        }
    )
    assert settings.group_instance_id == ""
    assert (settings.session_timeout_s, settings.heartbeat_interval_s) == (6, 1)


def test_the_stacks_extra_env_names_a_static_worker(tmp_path: Path) -> None:
    """Static members are opt-in (``python -m tests.chaos --static-workers``)."""
    key = "BATCHSTREAM_INFERENCE_GROUP_INSTANCE_ID"
    stack = Stack(tmp_path, models=[ModelSpec("", "m", engine="fake")], extra_env={key: "m-0"})
    assert stack.components()["inference-m"].env[key] == "m-0"
