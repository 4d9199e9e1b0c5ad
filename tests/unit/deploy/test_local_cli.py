"""``python -m deploy.local``'s options for a second stack: its own ports, the fake engine, the broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from deploy.local import brokers, catalogue, free_port, processes
from deploy.local.cli import build_stack, ports
from deploy.local.ports import Ports
from deploy.local.stack import Stack
from services.inference.settings import InferenceSettings
from tests.support.waiting import wait_until


def test_port_options_replace_only_the_ports_they_name() -> None:
    chosen = ports(["kafka=29092", "s3_master=29333", "inference=29920"])
    assert (chosen.kafka, chosen.s3_master, chosen.inference) == (29092, 29333, 29920)
    assert chosen.mongo == Ports.from_settings().mongo


@pytest.mark.parametrize("bad", ["kafka", "kafka=", "kafka=x", "nope=1"])
def test_a_malformed_port_option_is_refused(bad: str) -> None:
    with pytest.raises(typer.BadParameter):
        ports([bad])


def test_the_fake_engine_serves_a_model_without_a_directory(tmp_path: Path) -> None:
    stack = build_stack(tmp_path, ["=fake-model"], engine="fake", port=["inference=29920"])
    (model,) = stack.models
    assert (model.path, model.served_name, model.engine) == ("", "fake-model", "fake")
    assert stack.ports.inference == 29920


def test_make_up_s_adapter_is_served_by_the_first_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make up` passes `--adapter NAME=DIR`; the worker's settings read it from the environment."""
    (tmp_path / "demo").mkdir()
    stack = build_stack(tmp_path, ["=m"], engine="fake", adapters=[f"m-demo={tmp_path / 'demo'}"])
    for key, value in stack.components()["inference-m"].env.items():
        if key.startswith("BATCHSTREAM_INFERENCE_"):
            monkeypatch.setenv(key, value)
    settings = InferenceSettings()
    assert settings.lora_adapters == {"m-demo": str(tmp_path / "demo")}
    with pytest.raises(typer.BadParameter, match="NAME=DIR"):
        build_stack(tmp_path, ["=m"], engine="fake", adapters=["m-demo"])


def test_a_noida_stack_keeps_its_broker_data_in_its_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_binary = tmp_path / "fake-noida-db"
    monkeypatch.setattr(brokers, "noida_binary", lambda: fake_binary)
    stack = Stack(tmp_path / "state", ports=ports(["kafka=29092"]), broker="noida")
    kafka = stack.components()["kafka"]
    assert kafka.argv[:4] == [str(fake_binary), "start", "--only", "kafka"]
    assert kafka.argv[kafka.argv.index("--kafka-port") + 1] == "29092"
    data = Path(kafka.argv[kafka.argv.index("--data-dir") + 1])
    assert data == stack.data_dir / "kafka"
    assert kafka.prepare is not None
    kafka.prepare()
    assert data.is_dir()


def test_a_tansu_stack_keeps_its_broker_in_memory(tmp_path: Path) -> None:
    kafka = Stack(tmp_path, ports=ports(["kafka=29092"])).components()["kafka"]
    assert kafka.argv[-2:] == ["--storage-engine", "memory://tansu/"]
    assert "tcp://127.0.0.1:29092" in kafka.argv
    assert kafka.prepare is None


def test_make_up_s_broker_option_picks_the_broker_and_refuses_others(tmp_path: Path) -> None:
    assert build_stack(tmp_path).broker == "tansu"
    assert build_stack(tmp_path, broker="noida").broker == "noida"
    with pytest.raises(typer.BadParameter, match="tansu, noida"):
        build_stack(tmp_path, broker="kafka")


def test_each_broker_s_command_line_names_its_broker(tmp_path: Path) -> None:
    for broker in brokers.BROKERS:
        argv = brokers.broker_command(broker, 29092, tmp_path)
        assert brokers.broker_of(argv) == broker
    assert brokers.broker_of(["/usr/bin/kafka-server-start.sh"]) is None
    assert brokers.broker_of([]) is None


def test_status_and_down_describe_the_broker_that_runs_with_a_fake_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = Stack(tmp_path, ports=ports(["kafka=29092"]), broker="noida")
    running.run_dir.mkdir(parents=True)
    running.pid_file("kafka").write_text("4242\n")
    noida_argv = running.components()["kafka"].argv
    monkeypatch.setattr(processes, "command_line", lambda ref: noida_argv if ref.pid == 4242 else [])
    stack = build_stack(tmp_path)  # as `make status` and `make down` build it: no --broker
    assert stack.broker == "noida"
    assert "noida-db" in stack.components()["kafka"].description
    monkeypatch.setattr(processes, "command_line", lambda ref: [])  # it stopped
    assert build_stack(tmp_path).broker == brokers.DEFAULT_BROKER


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_status_asks_a_worker_it_was_not_told_about_on_the_health_port_it_runs_with(
    tmp_path: Path,
) -> None:
    """``make status`` builds its stack without the models: a worker's health port comes from the
    worker's own environment; a process without one is only said to run."""
    stack = build_stack(tmp_path)
    stack.run_dir.mkdir(parents=True)
    port = free_port()
    env = {**os.environ, catalogue.WORKER_HEALTH_PORT_ENV: str(port)}
    worker = subprocess.Popen([sys.executable, "-c", HEALTH_SERVER, str(port)], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name, proc in (("inference-some-model", worker), ("inference-other", other)):
            stack.pid_file(name).write_text(processes.ProcessRef(proc.pid).dumps())
        wait_until(lambda: stack.status()["inference-some-model"].startswith("healthy"), 10, "the worker")
        assert stack.status()["inference-some-model"] == f"healthy (pid {worker.pid})"
        assert stack.status()["inference-other"] == f"running (pid {other.pid})"
        worker.kill()
        worker.wait()
        assert stack.status()["inference-some-model"] == "stopped"
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait()
