"""Versioned Kafka messages: the public request schema and the internal result/control facts.

A message is one JSON object with ``schema_version``. Consumers accept the versions they know and
reject others with a clear error; fields are only ever added within a version.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION: Literal[1] = 1


class SamplingDefaults(BaseModel):
    """Batch-level defaults; a field set in a request body wins over these.

    The one definition of these five fields: the create parameters, the Batch object and the
    request message all use it, so their types and ranges are checked once (a 400 at create).
    """

    max_decoding_length: int | None = Field(default=None, ge=1, strict=True)
    max_context_length: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    top_k: int | None = Field(default=None, strict=True, description="-1 (no limit) or >= 1.")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (no limit) or at least 1")
        return value


class RequestMessage(BaseModel):
    """One request line, published to ``requests.<model>``.

    Pipelines may publish these directly: leave ``batch_id`` null and name a ``reply_topic``.
    """

    model_config = ConfigDict(extra="ignore")
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str = Field(description="Unique per line; becomes the output line's id.")
    custom_id: str
    method: Literal["POST"] = "POST"
    url: str
    body: dict[str, Any]
    batch_id: str | None = None
    line: int | None = Field(default=None, description="1-based line in the input file.")
    reply_topic: str | None = Field(default=None, description="Default: the results topic.")
    defaults: SamplingDefaults | None = None
    expires_at: float | None = Field(default=None, description="Unix seconds; not run after.")


class ResponsePayload(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class ResultMessage(BaseModel):
    """One finished line, keyed by batch id on the results topic (or a pipeline's reply topic)."""

    model_config = ConfigDict(extra="ignore")
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    custom_id: str
    batch_id: str | None = None
    line: int | None = None
    response: ResponsePayload | None = None
    error: LineError | None = None

    @property
    def succeeded(self) -> bool:
        return self.response is not None and self.response.status_code == 200

    def output_line(self) -> dict[str, Any]:
        """The line as written to the batch's output or error file."""
        return {
            "id": self.request_id,
            "custom_id": self.custom_id,
            "response": self.response.model_dump() if self.response else None,
            "error": self.error.model_dump() if self.error else None,
        }


class ControlMessage(BaseModel):
    """Batch facts workers need without a database call, on the compacted control topic."""

    schema_version: Literal[1] = SCHEMA_VERSION
    batch_id: str
    model: str | None = None
    total: int | None = None
    expires_at: float | None = None
    cancelled: bool = False
