"""The faust application, built once from the environment.

``topics.py``, ``tables.py`` and ``agents.py`` attach to ``app``; ``__main__`` imports them in
that order (no autodiscovery) and runs a worker.
"""

from __future__ import annotations

import faust
from aiokafka.helpers import create_ssl_context
from faust.auth import SASLCredentials, SSLCredentials

from services.aggregator.faust_adapter import install_transport
from services.aggregator.settings import AggregatorConfig
from shared.settings import KafkaSettings


def broker_urls(kafka: KafkaSettings) -> list[str]:
    return [f"kafka://{host.strip()}" for host in kafka.bootstrap_servers.split(",") if host.strip()]


def broker_credentials(kafka: KafkaSettings) -> faust.types.auth.CredentialsT | None:
    """The aggregator's Kafka user and TLS, as ``shared.kafka.connection`` gives the other clients."""
    context = (
        create_ssl_context(cafile=kafka.ssl_cafile or None)
        if kafka.security_protocol.endswith("SSL")
        else None
    )
    if kafka.security_protocol.startswith("SASL"):
        return SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password,
            mechanism=kafka.sasl_mechanism,
            ssl_context=context,  # SASL_SSL with one, SASL_PLAINTEXT without
        )
    return SSLCredentials(context) if context is not None else None


def create_app(config: AggregatorConfig, kafka: KafkaSettings) -> faust.App:
    """A faust app whose internal topics have as many partitions as the results topic."""
    app = faust.App(
        # The prefix keeps deployments sharing a cluster apart: group id and changelog topic.
        f"{kafka.topic_prefix}{config.app_id}",
        broker=broker_urls(kafka),
        broker_credentials=broker_credentials(kafka),
        store="memory://",
        autodiscover=False,
        datadir=config.data_dir,
        topic_partitions=kafka.results_partitions,
        topic_replication_factor=kafka.replication_factor,
        topic_disable_leader=True,
        table_standby_replicas=config.standby_replicas,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=config.heartbeat_interval_s,
        consumer_group_instance_id=config.group_instance_id or None,
        broker_rebalance_timeout=config.rebalance_timeout_s,
        broker_commit_interval=config.commit_interval_s,
        producer_max_batch_size=config.producer_max_batch_size,
        stream_buffer_maxsize=config.stream_buffer_maxsize,
        web_enabled=True,  # /livez, /readyz, /health and /metrics (web.py)
        # faust's own views list the table's keys (batch ids of every project) and the cluster's
        # layout to anyone who reaches the port: off.
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_bind=config.web_host,
        web_port=config.web_port,
        web_host=config.web_host,
    )
    install_transport(app, config.fetch_max_wait_ms)
    return app


config = AggregatorConfig()
kafka_settings = KafkaSettings()
app = create_app(config, kafka_settings)
