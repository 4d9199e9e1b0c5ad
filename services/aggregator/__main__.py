"""``python -m services.aggregator``: prepare topics and bucket, then run one faust worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from services.aggregator.app import app, config, kafka_settings
from shared.kafka import ensure_topics, wait_for_kafka
from shared.logging import configure_logging
from shared.settings import RuntimeSettings, StorageSettings, WebhookSettings
from shared.storage import ObjectStore

log = logging.getLogger("services.aggregator")


def logging_config(level: str) -> dict[str, Any]:
    """JSON lines on stderr (shared.logging's formatter), installed by faust's worker."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "shared.logging.JsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "aiokafka": {"level": "WARNING"},
            "faust": {"level": "WARNING"},
            "mode": {"level": "WARNING"},
        },
    }


async def prepare() -> None:
    """Results and control topics with their partition counts, and the bucket, before joining."""
    await wait_for_kafka(kafka_settings)
    await ensure_topics(kafka_settings, [])
    store = ObjectStore(StorageSettings())
    try:
        await store.ensure_bucket()
    finally:
        store.close()


def main() -> None:
    runtime_settings = RuntimeSettings()
    configure_logging("services.aggregator", runtime_settings.log_level)  # until faust's own
    WebhookSettings()  # a bad webhook url or secret stops the start here, before joining the group
    asyncio.run(prepare())
    log.info("aggregator starting", extra={"web_port": config.web_port, "app_id": app.conf.id})
    import services.aggregator.agents  # noqa: F401  (registers agents, timers, pages)

    worker = faust.Worker(
        app,
        loglevel=runtime_settings.log_level,
        logging_config=logging_config(runtime_settings.log_level),
    )
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
