"""Which announced models and adapters count as served."""

from __future__ import annotations

from shared.stores.models import WORKER_ALIVE_S, current


def test_an_adapter_its_model_s_workers_stopped_announcing_is_not_served() -> None:
    docs = [
        {"_id": "base", "last_seen": 1000.0},
        {"_id": "base-kept", "parent": "base", "last_seen": 1000.0},
        {"_id": "base-dropped", "parent": "base", "last_seen": 1000.0 - WORKER_ALIVE_S - 1},
        {"_id": "idle", "last_seen": 1.0},  # a base model without a worker now: its lines wait
        {"_id": "idle-a", "parent": "idle", "last_seen": 1.0},
    ]
    assert [d["_id"] for d in current(docs)] == ["base", "base-kept", "idle", "idle-a"]
