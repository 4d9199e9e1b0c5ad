"""``python -m services.inference``: one worker, one model, one engine.

Waits for Kafka, ensures the model's requests topic and the results topic, starts the engine,
reads the control topic (batch cancellations and deadlines) and keeps following it, heartbeats the
model document into MongoDB and writes its progress on each batch's lines there, serves /health
and /metrics, and consumes requests until SIGTERM (then drains in-flight work, commits, and exits
0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from services.inference.consumer import FatalConsumerError, RequestConsumer
from services.inference.control import BatchControl, ControlFollower
from services.inference.engine import Engine, ReportsReadiness
from services.inference.engine_factory import open_engine
from services.inference.handler import RequestHandler
from services.inference.health import HealthServer
from services.inference.heartbeat import heartbeat_forever, worker_name
from services.inference.line_progress import report, report_forever
from services.inference.settings import InferenceSettings
from shared.kafka import ensure_topics, make_producer, wait_for_kafka
from shared.logging import configure_logging
from shared.mongo import Mongo
from shared.settings import KafkaSettings, MongoSettings, RuntimeSettings

log = logging.getLogger("services.inference")


class Worker:
    """Owns the clients and the shutdown: built in ``main``, closed in ``finally``."""

    def __init__(self) -> None:
        self.inference = InferenceSettings()
        self.kafka = KafkaSettings()
        self.mongo_settings = MongoSettings()
        self.engine: Engine | None = None
        self.consumer: RequestConsumer | None = None
        self.health = HealthServer(self._ready, self.inference, checks=self._checks)

    def _ready(self) -> bool:
        return self.consumer is not None and self.consumer.running

    def _checks(self) -> dict[str, bool]:
        """What ``/readyz`` requires: the engine started, the consumer running, its group joined
        (Kafka answered the join; a member without partitions is still ready to take some), and
        the engine's own checks (the remote engine: its server answers)."""
        consumer, engine = self.consumer, self.engine
        return {
            "engine": engine is not None,
            "consumer": consumer is not None and consumer.running,
            "group_joined": consumer is not None and consumer.joined,
            **(engine.checks() if isinstance(engine, ReportsReadiness) else {}),
        }

    def request_stop(self, main: asyncio.Task[None]) -> None:
        """SIGTERM: drain a running consumer; before it runs, cancel start-up."""
        log.info("stop requested")
        if self.consumer is not None:
            self.consumer.stop()
        else:
            main.cancel()

    async def run(self) -> None:
        if self.inference.health_port:
            await self.health.start()
        try:
            await wait_for_kafka(self.kafka, timeout_s=120.0)
            await ensure_topics(self.kafka, [self.inference.model_id])
            async with open_engine(self.inference) as engine:
                self.engine = engine
                await self._serve(engine)
        finally:
            self.engine = None
            await self.health.stop()

    async def _serve(self, engine: Engine) -> None:
        mongo = Mongo(self.mongo_settings)
        producer = make_producer(self.kafka)
        await producer.start()
        control = BatchControl()
        handler = RequestHandler(engine, control=control, settings=self.inference)
        follower = ControlFollower.from_settings(self.kafka, control, on_cancel=handler.cancel_batch)
        heartbeat = asyncio.create_task(heartbeat_forever(mongo, engine))
        reporting = asyncio.create_task(report_forever(mongo, handler.progress, worker_name()))
        following: asyncio.Task[None] | None = None
        try:
            await follower.start()
            following = asyncio.create_task(follower.follow())
            self.consumer = RequestConsumer.from_settings(
                self.kafka,
                self.inference,
                producer,
                handler,
            )
            await self.consumer.run()
            await report(mongo, handler.progress, worker_name())  # the drained lines' last word
        finally:
            for task in (heartbeat, reporting, following):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await follower.stop()
            await producer.stop()
            await mongo.close()


async def main() -> int:
    runtime = RuntimeSettings()  # refuses the local secrets outside development
    configure_logging("services.inference", runtime.log_level)
    worker = Worker()
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop, task)
    try:
        await task
    except asyncio.CancelledError:
        log.info("stopped during start-up")
    except FatalConsumerError:
        log.exception("the consumer failed")
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
