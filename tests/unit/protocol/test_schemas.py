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


def test_each_message_is_read_into_the_class_its_schema_comes_from() -> None:
    """One definition per message: the worker and the aggregator decode into the Structs the
    schemas are generated from, and the api's defaults model takes its ranges from the request
    message's part."""
    from shared.protocol.messages import (
        RequestMessage,
        ResultMessage,
        SamplingDefaults,
        read_request,
    )

    request = RequestMessage(request_id="r", custom_id="c", url="/v1/completions", body={})
    assert type(read_request(request.to_json())) is schemas.SCHEMAS["request-message.json"][0]
    result = ResultMessage(request_id="r", custom_id="c")
    assert type(ResultMessage.from_json(result.to_json())) is schemas.SCHEMAS["result-message.json"][0]
    message_part = json.loads(schemas.render("request-message.json"))["$defs"]["RequestDefaults"]
    api_model = SamplingDefaults.model_json_schema()["properties"]
    for field in ("max_decoding_length", "max_context_length", "temperature", "top_p"):
        assert message_part["properties"][field]["anyOf"][0] == api_model[field]["anyOf"][0], field
