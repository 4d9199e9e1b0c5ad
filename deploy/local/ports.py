"""Every TCP port a local stack listens on: the fixed ones of ``make up`` and free ones for tests."""

from __future__ import annotations

import random
import socket
import urllib.parse
from dataclasses import dataclass, fields, replace

from deploy.local.errors import StackError
from shared.settings import AggregatorSettings, ApiSettings, KafkaSettings, MongoSettings, StorageSettings

WORKER_PORTS = 4  # free_ports keeps inference .. inference + 3 free for up to four workers
GRPC_OFFSET = 10_000  # SeaweedFS also listens on each of its ports + 10000 (gRPC)


@dataclass(frozen=True)
class Ports:
    """Every TCP port the stack listens on (SeaweedFS also uses each of its ports + 10000)."""

    kafka: int = 19092
    mongo: int = 27117
    s3: int = 18333
    s3_master: int = 19333
    s3_volume: int = 18080
    s3_filer: int = 18888
    s3_admin: int = 19646
    s3_metrics: int = 19327  # SeaweedFS's Prometheus metrics (no gRPC twin)
    api: int = 10900
    api_metrics: int = 10901  # the api's Prometheus /metrics (a port of its own)
    aggregator: int = 10910
    inference: int = 10920  # the n-th model's worker uses inference + n

    @classmethod
    def from_settings(cls) -> Ports:
        """The local stack's ports: the defaults, or what BATCHSTREAM_* settings point at."""
        base = cls()
        return replace(
            base,
            kafka=_port(KafkaSettings().bootstrap_servers.split(",")[0], base.kafka),
            mongo=urllib.parse.urlsplit(MongoSettings().uri).port or base.mongo,
            s3=_port(StorageSettings().endpoint, base.s3),
            api=ApiSettings().port,
            api_metrics=ApiSettings().metrics_port,
            aggregator=AggregatorSettings().web_port,
        )


def _port(address: str, default: int) -> int:
    _, _, port = address.rpartition(":")
    return int(port) if port.isdigit() else default


def bindable(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """One port free now on 127.0.0.1, chosen by the OS (for a test's private server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(low: int = 20_000, high: int = 30_000) -> Ports:
    """Random free ports below the ephemeral range, each with port + 10000 free as well."""
    chosen: set[int] = set()
    values: dict[str, int] = {}
    rng = random.SystemRandom()
    for name in (f.name for f in fields(Ports)):
        for _ in range(1000):
            port = rng.randrange(low, high)
            # Workers use inference + n, one per model: keep a few of those free too.
            span = {port + n for n in range(WORKER_PORTS)} if name == "inference" else {port}
            wanted = span | {p + GRPC_OFFSET for p in span}
            if not wanted & (chosen | {p + GRPC_OFFSET for p in chosen}) and all(map(bindable, wanted)):
                chosen |= span
                values[name] = port
                break
        else:
            raise StackError("no free ports found")
    return Ports(**values)
