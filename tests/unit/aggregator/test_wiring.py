"""The faust wiring imports and registers what the worker runs (no servers needed)."""

from __future__ import annotations

from typing import Any, cast

from services.aggregator import agents
from services.aggregator.app import app
from services.aggregator.runtime import partition_for
from services.aggregator.tables import BatchStates, batch_states_table


def test_agents_timers_and_pages_register() -> None:
    assert "services.aggregator.agents.aggregate" in app.agents
    table = cast(Any, batch_states_table)
    assert table.use_partitioner and table.key_serializer == "raw"
    paths = {view.view_path for view in app.web.views.values()}
    assert {"/health", "/livez", "/readyz", "/metrics"} <= paths


def test_importing_the_wiring_builds_no_client() -> None:
    """Mongo and S3 clients are built when the worker starts, not at import."""
    assert not agents.worker.started


def test_partition_for_matches_aiokafka_default_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    for batch_id in ("batch_a", "batch_0123456789abcdef01234567", "x"):
        key = batch_id.encode()
        assert partition_for(batch_id, 4) == partitioner(key, [0, 1, 2, 3], [0, 1, 2, 3])


def test_batch_states_maps_str_ids_to_raw_keys() -> None:
    raw: dict[object, object] = {}
    states = BatchStates(raw)
    states["batch_1"] = {"completed": 1}
    assert raw == {b"batch_1": {"completed": 1}}
    assert states.get("batch_1") == {"completed": 1} and states.get("nope") is None
    assert list(states) == ["batch_1"] and "batch_1" in states
    del states["batch_1"]
    assert not raw
