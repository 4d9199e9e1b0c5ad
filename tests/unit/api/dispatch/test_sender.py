"""The request message the dispatcher builds for a batch line."""

from __future__ import annotations

from services.api.dispatch.sender import LineSender
from services.api.dispatch.state import QueuedState
from shared.input_lines import InputLine
from shared.protocol.messages import SamplingDefaults, read_request
from shared.stores.dispatcher import Position


def test_a_batch_lines_message_names_its_batch_and_project() -> None:
    batch = QueuedState(
        batch_id="batch_1",
        model="m",
        project="proj-a",
        status="in_progress",
        total=1,
        priority=0,
        expires_at=1_900_000_000.0,
        order=0,
        object_key="k",
        defaults=SamplingDefaults(),
        position=Position(),
    )
    raw = b'{"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}'
    message = read_request(LineSender.request(batch, InputLine(3, 0, raw)))
    assert message is not None
    assert (message.batch_id, message.line, message.project) == ("batch_1", 3, "proj-a")
