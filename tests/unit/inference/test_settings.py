"""The worker's settings refuse a start without a model themselves, whoever builds them."""

from __future__ import annotations

import pydantic
import pytest

from services.inference.settings import InferenceSettings


def test_a_worker_without_a_model_is_refused_unless_its_engine_is_fake() -> None:
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_INFERENCE_MODEL"):
        InferenceSettings(engine="vllm", model="")
    assert InferenceSettings(engine="fake").model_id == ""
    with pytest.raises(pydantic.ValidationError, match="engine"):
        InferenceSettings(engine="llama.cpp", model="m")  # type: ignore[arg-type]
