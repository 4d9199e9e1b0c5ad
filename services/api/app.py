"""The api service: ``create_app()`` builds the FastAPI app; clients live in its lifespan."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import Counter, Histogram

from services.api.announcer import ControlAnnouncer
from services.api.body_limit import BodyLimit
from services.api.deps import ApiServices
from services.api.dispatch.loop import Dispatcher
from services.api.dispatch.settings import DispatchSettings
from services.api.errors import DEPENDENCY_TIMEOUT_S, install_error_handlers
from services.api.local_copies import LocalCopies, LocalFirstStore
from services.api.openapi import install_openapi
from services.api.quotas.service import QuotaService
from services.api.quotas.settings import QuotaSettings
from services.api.routes import batches, files, health, limits, message_batches, models, partial, views
from services.api.routes.console import install_console
from services.api.routes.health import MetricsServer
from services.api.service.batches import BatchService
from services.api.service.error_lines import ErrorLinesService
from services.api.service.files import FileService
from services.api.service.keys import KeyRing
from services.api.service.message_batches import MessageBatchService
from services.api.service.overview import OverviewService
from services.api.service.partial import PartialOutputService
from services.api.service.retry import RetryService
from shared.kafka import make_producer, wait_for_kafka
from shared.logging import configure_logging
from shared.mongo import Mongo
from shared.settings import (
    ApiSettings,
    KafkaSettings,
    MediaSettings,
    MongoSettings,
    RuntimeSettings,
    StorageSettings,
    WebhookSettings,
)
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore
from shared.stores.idempotency import IdempotencyStore
from shared.stores.message_batches import MessageBatchStore
from shared.stores.models import ModelStore
from shared.stores.webhooks import WebhookEventStore
from shared.webhooks import EventRecorder

log = logging.getLogger(__name__)

REQUESTS = Counter("batchstream_api_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("batchstream_api_request_seconds", "HTTP request latency", ["method", "route"])


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    api_settings, kafka_settings = ApiSettings(), KafkaSettings()
    dispatch_settings = DispatchSettings()
    quota_settings = QuotaSettings()  # a bad limit or override stops the start here
    webhook_endpoints = WebhookSettings().endpoints  # a bad url or secret stops the start here
    mongo = Mongo(MongoSettings(), timeout_s=DEPENDENCY_TIMEOUT_S)
    copies = LocalCopies.at(api_settings.input_copy_dir, api_settings.input_copy_bytes)
    store = LocalFirstStore(StorageSettings(), copies, timeout_s=DEPENDENCY_TIMEOUT_S)
    await wait_for_kafka(kafka_settings)
    producer = make_producer(kafka_settings, request_timeout_ms=int(DEPENDENCY_TIMEOUT_S * 1000))
    # The dispatcher's lines go through a producer (a connection) of their own: a request's
    # control message (a cancel) must not queue behind megabytes of lines, nor behind the broker
    # answering slowly while it creates a model's topic (seen: a cancel stuck 8 s).
    line_producer = make_producer(kafka_settings, request_timeout_ms=int(DEPENDENCY_TIMEOUT_S * 1000))
    metrics = (
        MetricsServer(api_settings.metrics_host, api_settings.metrics_port)
        if api_settings.metrics_port
        else None
    )
    await producer.start()
    try:
        await line_producer.start()
        await mongo.ensure_indexes()
        await store.ensure_bucket()
        # The api ends a batch ``failed`` (validation); its event is recorded here, sent by the
        # aggregator (services/aggregator/webhooks.py).
        recorder = EventRecorder(WebhookEventStore(mongo.webhook_events), webhook_endpoints)
        batch_store = BatchStore(mongo.batches, recorder)
        file_store = FileStore(mongo.files)
        model_store = ModelStore(mongo.models)
        dispatcher = Dispatcher(
            mongo=mongo,
            batches=batch_store,
            files=file_store,
            store=store,
            producer=line_producer,
            kafka=kafka_settings,
            settings=dispatch_settings,
            owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        )
        quotas = QuotaService(quota_settings, batch_store, file_store, model_store)
        file_service = FileService(file_store, batch_store, store, api_settings, quotas)
        batch_service = BatchService(
            batch_store,
            model_store,
            IdempotencyStore(mongo.idempotency),
            store,
            file_service,
            ControlAnnouncer(producer, kafka_settings),
            dispatcher,
            api_settings,
            dispatch_settings,
            quotas=quotas,
            media=MediaSettings(),
        )
        partial = PartialOutputService(batch_store, file_store, store)
        app.state.services = ApiServices(
            mongo=mongo,
            store=store,
            producer=producer,
            keys=KeyRing(mongo, api_settings.project_by_key()),
            models=model_store,
            quotas=quotas,
            files=file_service,
            batches=batch_service,
            partial=partial,
            error_lines=ErrorLinesService(partial, api_settings.max_list_bytes),
            overview=OverviewService(batch_store, model_store),
            retry=RetryService(batch_service, file_service, partial),
            message_batches=MessageBatchService(
                batch_service,
                file_service,
                partial,
                MessageBatchStore(mongo.batches),
                model_store,
                api_settings,
            ),
        )
        await batch_service.recover()
        dispatcher.start()
        log.info("api ready", extra={"port": api_settings.port})
        yield
        await batch_service.shutdown()
        await dispatcher.stop()
    finally:
        await line_producer.stop()
        await producer.stop()
        await mongo.close()
        copies.remove_all()
        if metrics is not None:
            metrics.close()


async def _observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    with LATENCY.labels(request.method, _route(request)).time():
        response = await call_next(request)
    REQUESTS.labels(request.method, _route(request), response.status_code).inc()
    return response


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def create_app() -> FastAPI:
    runtime = RuntimeSettings()
    configure_logging("api", runtime.log_level)
    # /docs and /redoc with their assets served by the api itself (no CDN): they work offline.
    app = FastAPIOffline(
        title="batchstream",
        version="0.1.0",
        lifespan=lifespan,
        swagger_ui_parameters={"persistAuthorization": True},
    )
    install_error_handlers(app)
    install_openapi(app)
    app.middleware("http")(_observe)
    app.add_middleware(BodyLimit, settings=ApiSettings())  # outermost: before any body is read
    for module in (files, batches, message_batches, partial, views, limits, models, health):
        app.include_router(module.router)
    install_console(app)
    return app
