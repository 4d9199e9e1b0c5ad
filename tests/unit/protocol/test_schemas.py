"""The checked-in JSON Schemas of the Kafka messages are what the typed models generate."""

from __future__ import annotations

import json
from pathlib import Path

from shared.protocol import schemas


def test_the_checked_in_schemas_match_the_models() -> None:
    assert schemas.stale() == [], "run `python -m shared.protocol.schemas` and commit docs/schemas/"


def test_the_request_schema_names_what_a_publisher_must_send() -> None:
    request = json.loads((schemas.DEFAULT_DIR / "request-message.json").read_text())
    assert set(request["required"]) == {"request_id", "custom_id", "url", "body"}
    assert request["properties"]["reply_topic"]["anyOf"][0] == {"type": "string"}


def test_a_stale_file_is_found_and_rewritten(tmp_path: Path) -> None:
    schemas.write(tmp_path)
    (tmp_path / "result-message.json").write_text("{}\n")
    assert schemas.stale(tmp_path) == ["result-message.json"]
    assert schemas.main(["--out", str(tmp_path), "--check"]) == 1
    assert schemas.main(["--out", str(tmp_path)]) == 0 and schemas.stale(tmp_path) == []


def test_the_hot_path_structs_have_the_models_fields() -> None:
    """The msgspec structs the worker and the aggregator read into mirror the models, which own
    the fields: a field added to a model must be added to its struct too."""
    from shared.protocol import messages

    pairs = [
        (messages.WireRequest, messages.RequestMessage),
        (messages.WireDefaults, messages.SamplingDefaults),
        (messages.WireResult, messages.ResultMessage),
        (messages.WireUsage, messages.TokenUsage),
        (messages._WireResponse, messages.ResponsePayload),
        (messages._WireError, messages.LineError),
    ]
    for struct, model in pairs:
        assert set(struct.__struct_fields__) == set(model.model_fields), struct.__name__
