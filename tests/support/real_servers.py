"""The test servers: the stand-ins, or real Kafka, MongoDB and MinIO from testcontainers.

``BATCHSTREAM_TEST_SERVERS=testcontainers`` runs the integration suite against the servers
production uses (the images docker-compose.yml pins), started in Docker by testcontainers and
published on 127.0.0.1 (a local Docker engine). Where no Docker engine answers (as on the build
machines), or testcontainers cannot start them, the suite falls back to the stand-ins (Tansu,
SecantusDB, SeaweedFS) and says why once; with ``BATCHSTREAM_TEST_SERVERS_REQUIRED=1`` (``make
test-real``, a release check) it fails the run instead. Unset, or ``stand-ins``: the stand-ins, with
SeaweedFS or a JuiceFS gateway as the S3 server (``object_stores``: ``BATCHSTREAM_TEST_OBJECT_STORE``).

``BATCHSTREAM_TEST_BROKER=noida`` makes every stand-in stack of the run (the session's, and the
stacks and private brokers of modules that start their own) use noida-db as its Kafka broker
instead of Tansu (``requested_broker``). Unset, or ``tansu``: Tansu.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from deploy.local import Stack
from deploy.local.brokers import Broker, parse_broker
from tests.support.object_stores import session_object_store

SWITCH = "BATCHSTREAM_TEST_SERVERS"
TESTCONTAINERS = "testcontainers"
STAND_IN_SERVERS = "stand-ins"
REQUIRED_SWITCH = "BATCHSTREAM_TEST_SERVERS_REQUIRED"
"""``1``: real servers asked for and unavailable fail the run (no fallback to the stand-ins)."""

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"  # testcontainers' KafkaContainer needs Confluent's image
MONGO_IMAGE = "mongo:8.0.12"
MINIO_IMAGE = (
    "quay.io/minio/minio:RELEASE.2025-04-22T22-12-26Z"
    "@sha256:a1ea29fa28355559ef137d71fc570e508a214ec84ff8083e39bc5428980b015e"
)
START_TIMEOUT_S = 120.0
BROKER_SWITCH = "BATCHSTREAM_TEST_BROKER"


class FallbackToStandIns(RuntimeError):
    """Real servers were asked for and cannot run here; the message says why."""


class RealServersUnavailable(RuntimeError):
    """Real servers were required (``REQUIRED_SWITCH``) and cannot run here; the message says why."""


_containers_running = False  # set while ``servers_for_tests`` yields the containers


def on_real_servers() -> bool:
    """Whether the session's servers are the real ones (started, not fallen back from)."""
    return _containers_running


def requested(environ: dict[str, str] | None = None) -> str:
    """Which servers the run asks for: ``testcontainers`` or ``stand-ins``."""
    value = (os.environ if environ is None else environ).get(SWITCH, STAND_IN_SERVERS) or STAND_IN_SERVERS
    if value not in (TESTCONTAINERS, STAND_IN_SERVERS):
        raise ValueError(f"{SWITCH}={value!r}: use {TESTCONTAINERS} or {STAND_IN_SERVERS}")
    return value


def runs_on_tansu(environ: dict[str, str] | None = None) -> bool:
    """Whether the run's Kafka is Tansu (its workarounds then apply): the stand-in broker asked
    for is Tansu, and the real servers are not required (``make test-real``: Apache Kafka, or
    no run at all). Known before the session starts, for settings made at import."""
    return requested_broker(environ) == "tansu" and not required(environ)


def required(environ: dict[str, str] | None = None) -> bool:
    """Whether the run asks for the real servers and no fallback (``REQUIRED_SWITCH``)."""
    env = os.environ if environ is None else environ
    return requested(environ) == TESTCONTAINERS and env.get(REQUIRED_SWITCH) == "1"


def requested_broker(environ: dict[str, str] | None = None) -> Broker:
    """Which Kafka broker the run's stand-in stacks use: ``tansu`` (default) or ``noida``."""
    try:
        return parse_broker((os.environ if environ is None else environ).get(BROKER_SWITCH, ""))
    except ValueError as exc:
        raise ValueError(f"{BROKER_SWITCH}: {exc}") from None


def docker_engine_problem(ping: Callable[[], Any] | None = None) -> str | None:
    """Why no Docker engine can be used (None when one answers a ping)."""
    if ping is None:
        try:
            import docker
        except ImportError:
            return "testcontainers is not installed"
        try:
            client = docker.from_env(timeout=5)
        except Exception as exc:  # no socket, bad DOCKER_HOST, ...
            return f"no Docker engine: {exc}"
        ping = client.ping
    try:
        ping()
    except Exception as exc:
        return f"the Docker engine does not answer: {exc}"
    return None


@contextlib.contextmanager
def servers_for_tests(stack: Stack, environ: dict[str, str] | None = None) -> Iterator[Stack]:
    """Start the servers ``stack`` points at; yields the stack to use (its ports may change).

    The stand-ins are started and stopped by ``stack`` itself (by PID); containers are stopped
    here on exit.
    """
    if requested(environ) == TESTCONTAINERS:
        problem = docker_engine_problem()
        if problem is None:
            try:
                with _containers(stack) as real:
                    global _containers_running
                    _containers_running = True
                    try:
                        yield real
                    finally:
                        _containers_running = False
                return
            except FallbackToStandIns as exc:
                problem = str(exc)
        if required(environ):
            raise RealServersUnavailable(f"{SWITCH}=testcontainers ({REQUIRED_SWITCH}=1): {problem}")
        warnings.warn(f"{SWITCH}=testcontainers: {problem}; using the stand-ins", stacklevel=3)
    with session_object_store(stack, environ) as stand_ins:  # SeaweedFS, or JuiceFS (its switch)
        stack.start(stand_ins)
        yield stack


@contextlib.contextmanager
def _containers(stack: Stack) -> Iterator[Stack]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.kafka import KafkaContainer
    from testcontainers.minio import MinioContainer

    env = stack.env()
    kafka = KafkaContainer(KAFKA_IMAGE).with_kraft().with_env("KAFKA_MESSAGE_MAX_BYTES", "8388608")
    mongo = (
        DockerContainer(MONGO_IMAGE)
        .with_command("mongod --replSet rs0 --bind_ip_all")
        .with_exposed_ports(27017)
    )
    minio = (
        MinioContainer(
            MINIO_IMAGE,
            access_key=env["BATCHSTREAM_S3_ACCESS_KEY"],
            secret_key=env["BATCHSTREAM_S3_SECRET_KEY"],
        )
        .with_env("MINIO_ROOT_USER", env["BATCHSTREAM_S3_ACCESS_KEY"])
        .with_env("MINIO_ROOT_PASSWORD", env["BATCHSTREAM_S3_SECRET_KEY"])
    )
    with contextlib.ExitStack() as started:
        try:
            started.callback(kafka.stop)
            kafka.start(timeout=int(START_TIMEOUT_S))
            for container in (mongo, minio):
                started.callback(container.stop)
                container.start()
            _initiate_replica_set(mongo)
        except Exception as exc:
            raise FallbackToStandIns(f"testcontainers could not start the servers: {exc}") from exc
        host = kafka.get_container_host_ip()
        if host not in ("localhost", "127.0.0.1"):
            raise FallbackToStandIns(f"the Docker engine publishes ports on {host}, not 127.0.0.1")
        ports = replace(
            stack.ports,
            kafka=int(kafka.get_bootstrap_server().rpartition(":")[2]),
            mongo=int(mongo.get_exposed_port(27017)),
            s3=int(minio.get_exposed_port(minio.port)),
        )
        yield replace(stack, ports=ports, tuned_for_broker=False)  # Apache Kafka: its defaults


def _initiate_replica_set(mongo: Any) -> None:
    """A one-node replica set (transactions, change streams), waited on until it is PRIMARY."""
    initiate = (
        "try { rs.status() } catch (e) "
        "{ rs.initiate({_id: 'rs0', members: [{_id: 0, host: 'localhost:27017'}]}) }"
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        mongo.exec(["mongosh", "--quiet", "--eval", initiate])
        primary = mongo.exec(["mongosh", "--quiet", "--eval", "db.hello().isWritablePrimary"])
        if primary.exit_code == 0 and primary.output.strip() == b"true":
            return
        if time.monotonic() > deadline:
            raise RuntimeError("MongoDB did not become PRIMARY")
        time.sleep(0.5)
