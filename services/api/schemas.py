"""Request bodies the api accepts (the public response models live in shared/protocol/openai.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from shared.errors import InvalidRequest, echo
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import COMPLETION_WINDOW, COMPLETION_WINDOWS, SUPPORTED_ENDPOINTS


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreateParams(SamplingDefaults):
    """``POST /v1/batches``. The sampling defaults are batchstream's extension (docs/api.md).

    Any other field is refused (a 400 ``unknown_parameter`` naming it, services/api/errors.py), as
    OpenAI refuses it: a misspelt extension must not make a batch without it."""

    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    # Optional with these defaults, as in the batch API batchstream replaces (OpenAI requires both).
    endpoint: str = "/v1/chat/completions"
    completion_window: str = COMPLETION_WINDOW
    metadata: Any = None
    output_expires_after: ExpiresAfter | None = None
    # batchstream's extension: higher runs first among the model's queued batches (docs/dispatcher.md).
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)
    # batchstream's extension: false sends the lines in file order (docs/dispatcher.md).
    prefix_order: StrictBool | None = None
    # batchstream's extension: true lets the lines name any served model or adapter (docs/api.md).
    mixed_models: StrictBool | None = None

    def checked_window_s(self) -> int:
        """The completion window in seconds, once the endpoint and the window are ones a batch may
        name; raises ``InvalidRequest`` (a 400 naming the parameter) otherwise."""
        if self.endpoint not in SUPPORTED_ENDPOINTS:
            raise InvalidRequest(
                f"Unsupported endpoint {echo(self.endpoint)}; expected one of {list(SUPPORTED_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        window = COMPLETION_WINDOWS.get(self.completion_window)
        if window is None:
            raise InvalidRequest(
                f"completion_window must be '{COMPLETION_WINDOW}'.",
                param="completion_window",
                code="invalid_value",
            )
        return window

    def defaults(self) -> SamplingDefaults:
        return SamplingDefaults.model_validate(self.model_dump(include=set(SamplingDefaults.model_fields)))
