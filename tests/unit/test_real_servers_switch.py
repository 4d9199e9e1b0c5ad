"""BATCHSTREAM_TEST_SERVERS: the suite falls back to the stand-ins where no Docker engine answers;
BATCHSTREAM_TEST_BROKER: which broker the stand-ins run.

The stack here is a recording fake (``RecordingFakeStack``): these tests check which servers get
started, not the servers. The first one asks the machine's real Docker client, and is skipped
where an engine does answer (there the integration suite itself exercises the containers).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest

from deploy.local import STAND_INS
from tests.support import real_servers
from tests.support.real_servers import (
    BROKER_SWITCH,
    REQUIRED_SWITCH,
    SWITCH,
    RealServersUnavailable,
    docker_engine_problem,
    on_real_servers,
    requested,
    requested_broker,
    runs_on_tansu,
    servers_for_tests,
)


class RecordingFakeStack:
    def __init__(self) -> None:
        self.started: list[tuple[str, ...]] = []

    def start(self, names: Any) -> None:
        self.started.append(tuple(names))


def test_without_a_docker_engine_the_switch_falls_back_to_the_stand_ins() -> None:
    if docker_engine_problem() is None:
        pytest.skip("a Docker engine answers here: the integration suite runs on containers")
    stack = RecordingFakeStack()
    with (
        pytest.warns(UserWarning, match="using the stand-ins"),
        servers_for_tests(stack, {SWITCH: "testcontainers"}) as servers,  # type: ignore[arg-type]
    ):
        assert servers is stack
    assert stack.started == [tuple(STAND_INS)]


def test_an_engine_that_does_not_answer_is_reported() -> None:
    def refused() -> None:
        raise ConnectionRefusedError("fake: connection refused")

    assert "does not answer" in (docker_engine_problem(refused) or "")
    assert docker_engine_problem(lambda: True) is None


def test_containers_that_fail_to_start_fall_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_servers, "docker_engine_problem", lambda: None)

    def failing_containers(stack: Any) -> Any:
        raise real_servers.FallbackToStandIns("fake: image pull refused")

    monkeypatch.setattr(real_servers, "_containers", failing_containers)
    stack = RecordingFakeStack()
    with (
        pytest.warns(UserWarning, match="image pull refused"),
        servers_for_tests(stack, {SWITCH: "testcontainers"}) as servers,  # type: ignore[arg-type]
    ):
        assert servers is stack
    assert stack.started == [tuple(STAND_INS)]


def test_a_release_check_fails_rather_than_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_servers, "docker_engine_problem", lambda: "fake: no Docker engine")
    stack = RecordingFakeStack()
    required = {SWITCH: "testcontainers", REQUIRED_SWITCH: "1"}
    with (
        pytest.raises(RealServersUnavailable, match="no Docker engine"),
        servers_for_tests(stack, required),  # type: ignore[arg-type]
    ):
        pass
    assert stack.started == []  # no stand-in started in their place


def test_the_containers_are_known_to_run_only_while_they_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_servers, "docker_engine_problem", lambda: None)
    monkeypatch.setattr(real_servers, "_containers", lambda stack: nullcontext(stack))  # fake containers
    stack = RecordingFakeStack()
    assert not on_real_servers()
    with servers_for_tests(stack, {SWITCH: "testcontainers"}):  # type: ignore[arg-type]
        assert on_real_servers()
    assert not on_real_servers() and stack.started == []


def test_by_default_the_stand_ins_run_without_asking_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_docker_please() -> None:
        raise AssertionError("the default must not touch Docker")

    monkeypatch.setattr(real_servers, "docker_engine_problem", no_docker_please)
    stack = RecordingFakeStack()
    with servers_for_tests(stack, {}) as servers:  # type: ignore[arg-type]
        assert servers is stack
    assert stack.started == [tuple(STAND_INS)]


def test_a_misspelled_switch_is_an_error() -> None:
    assert requested({}) == "stand-ins"
    assert requested({SWITCH: "testcontainers"}) == "testcontainers"
    with pytest.raises(ValueError, match=SWITCH):
        requested({SWITCH: "testcontainer"})


def test_the_broker_switch_picks_tansu_unless_noida_is_asked_for() -> None:
    assert requested_broker({}) == "tansu"
    assert requested_broker({BROKER_SWITCH: ""}) == "tansu"
    assert requested_broker({BROKER_SWITCH: "noida"}) == "noida"
    with pytest.raises(ValueError, match="tansu, noida"):
        requested_broker({BROKER_SWITCH: "kafka"})


def test_tansu_s_workarounds_apply_unless_another_kafka_is_sure() -> None:
    assert runs_on_tansu({})
    assert runs_on_tansu({SWITCH: "testcontainers"})  # it may fall back to the stand-ins
    assert not runs_on_tansu({SWITCH: "testcontainers", REQUIRED_SWITCH: "1"})  # make test-real
    assert not runs_on_tansu({BROKER_SWITCH: "noida"})
