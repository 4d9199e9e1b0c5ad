"""The batch-level sampling defaults: one definition, its types and ranges checked once."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import Batch


@pytest.mark.parametrize(
    "fields",
    [
        {"max_decoding_length": 1, "max_context_length": 1},
        {"temperature": 0, "top_p": 1, "top_k": -1},
        {"temperature": 2.0, "top_p": 0.01, "top_k": 1},
        {},
    ],
)
def test_values_in_range_are_kept(fields: dict[str, Any]) -> None:
    assert SamplingDefaults.model_validate(fields).model_dump(exclude_none=True) == fields


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_decoding_length", 0),
        ("max_decoding_length", -5),
        ("max_decoding_length", "8"),
        ("max_decoding_length", True),
        ("max_context_length", 0),
        ("temperature", -0.01),
        ("temperature", 2.01),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("top_k", -2),
        ("top_k", 2.5),
    ],
)
def test_values_out_of_range_or_of_the_wrong_type_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        SamplingDefaults.model_validate({field: value})
    assert raised.value.errors()[0]["loc"] == (field,)


def test_the_batch_object_echoes_the_same_fields() -> None:
    assert set(SamplingDefaults.model_fields) <= set(Batch.model_fields)
