"""``python -m deploy.local``'s options for a second stack: its own ports, the fake engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from deploy.local.cli import build_stack, ports
from deploy.local.ports import Ports


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
