"""Validation of a batch input file, line by line, before any line runs.

OpenAI's rule: any invalid line fails the batch, and every bad line is reported with its 1-based
line number, code and param. The validator streams: it holds the set of custom_ids, not the lines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from services.api.dispatch.order import OrderBuilder, prompt_text
from shared.input_lines import InputLine
from shared.protocol.batch_input import BODY_BY_ENDPOINT, UTF8_BOM
from shared.protocol.openai import BatchError


@dataclass
class ValidationReport:
    """What one pass over the input file found."""

    lines: int = 0
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0


@dataclass
class InputValidator:
    endpoint: str
    known_models: Mapping[str, int | None]  # model id -> its max context length, if known
    max_lines: int
    max_reported_errors: int
    order: OrderBuilder | None = None  # fed each line's prompt prefix (the dispatch order)
    _custom_ids: set[str] = field(default_factory=set)
    _report: ValidationReport = field(default_factory=ValidationReport)

    async def run(self, lines: AsyncIterator[InputLine]) -> ValidationReport:
        """Check the file's request lines (``shared.input_lines.request_lines``)."""
        async for line in lines:
            self._report.lines += 1
            body = self._check_line(line.number, line.raw)
            if self.order is not None:
                self.order.add(line, prompt_text(self.endpoint, body) if body is not None else None)
        if self._report.lines == 0:
            self._error(None, "empty_file", "The input file has no request lines.")
        elif self._report.lines > self.max_lines:
            self._error(
                None,
                "too_many_tasks",
                f"The input file has {self._report.lines} lines; the limit is {self.max_lines}.",
            )
        return self._report

    def _error(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        self._report.error_count += 1
        if len(self._report.errors) < self.max_reported_errors:
            self._report.errors.append(BatchError(code=code, message=message, param=param, line=line))

    def _check_line(self, number: int, raw: bytes) -> dict[str, Any] | None:
        """Check one line; returns its body when it has one (valid or not)."""
        # orjson, strict where json.loads is lenient: UTF-8 only (json.loads guesses UTF-16 from the
        # bytes), no lone surrogate escapes (valid to json.loads, not encodable for Kafka).
        try:
            item = orjson.loads(raw.removeprefix(UTF8_BOM) if number == 1 else raw)
        except Exception:  # not only decoding errors: any line the parser refuses is this line's
            self._error(number, "invalid_json_line", "This line is not valid UTF-8 JSON.")
            return None
        if not isinstance(item, dict):
            self._error(number, "invalid_json_line", "Each line must be a JSON object.")
            return None
        try:  # what parses must also serialise: the request message carries the body on
            orjson.dumps(item)
        except orjson.JSONEncodeError:
            self._error(number, "invalid_request", "This line is nested too deeply to be sent on.", "body")
            return None
        if not self._check_envelope(number, item):
            return None
        self._check_body(number, item["body"])
        return item["body"]  # type: ignore[no-any-return]

    def _check_envelope(self, number: int, item: dict[str, Any]) -> bool:
        """Check custom_id, method, url and body; True when the body can be looked into."""
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            self._error(number, "missing_required_parameter", "Missing custom_id.", "custom_id")
        elif custom_id in self._custom_ids:
            self._error(
                number,
                "duplicate_custom_id",
                f"custom_id {custom_id!r} is not unique.",
                "custom_id",
            )
        else:
            self._custom_ids.add(custom_id)
        if item.get("method") is None:
            self._error(number, "missing_required_parameter", "Missing method.", "method")
        elif item["method"] != "POST":
            self._error(number, "invalid_request", "Only the POST method is supported.", "method")
        url = item.get("url")
        if url is None:
            self._error(number, "missing_required_parameter", "Missing url.", "url")
        elif url != self.endpoint:
            self._error(
                number,
                "invalid_url",
                f"The url {url!r} does not match the batch endpoint {self.endpoint!r}.",
                "url",
            )
        body = item.get("body")
        if body is None:
            self._error(number, "missing_required_parameter", "Missing body.", "body")
            return False
        if not isinstance(body, dict):
            self._error(number, "invalid_request", "body must be a JSON object.", "body")
            return False
        return True

    def _check_body(self, number: int, body: dict[str, Any]) -> None:
        if body.get("stream") is True:
            self._error(
                number,
                "streaming_unsupported",
                "Streaming is not supported in batches.",
                "body.stream",
            )
        self._check_body_shape(number, body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            self._error(number, "missing_required_parameter", "Missing body.model.", "body.model")
            return
        if model not in self.known_models:
            self._error(number, "model_not_found", f"The model {model!r} does not exist.", "body.model")
        else:
            self._check_token_limit(number, body, self.known_models[model])
        if self._report.model is None:
            self._report.model = model
        elif model != self._report.model:
            self._error(
                number,
                "mismatched_model",
                f"Every line must use the same model; saw {model!r} after {self._report.model!r}.",
                "body.model",
            )

    def _check_body_shape(self, number: int, body: dict[str, Any]) -> None:
        """The body the endpoint needs (its typed model, chosen by the batch's url): the field it
        reads and the positive counts; one error per bad field, the field it reads first."""
        shape = BODY_BY_ENDPOINT.get(self.endpoint)  # type: ignore[call-overload]
        if shape is None:
            return
        model, required = shape
        if body.get(required) is None:
            self._error(
                number,
                "invalid_request",
                f"The body must contain {required!r} for {self.endpoint}.",
                f"body.{required}",
            )
            return
        try:
            model.model_validate(body)
        except ValidationError as exc:
            fields: dict[str, str] = {}
            for error in exc.errors():
                fields.setdefault(str(error["loc"][0]), error["msg"])
            for name in sorted(fields, key=lambda n: n != required):
                self._error(number, "invalid_request", f"body.{name}: {fields[name]}.", f"body.{name}")

    def _check_token_limit(self, number: int, body: dict[str, Any], context: int | None) -> None:
        name = next((n for n in _OUTPUT_CAPS if body.get(n)), "max_tokens")
        requested = body.get(name)
        if context and isinstance(requested, int) and requested > context:
            self._error(
                number,
                "token_limit_exceeded",
                f"{name} {requested} exceeds the model's context length of {context}.",
                f"body.{name}",
            )


# A body's output cap, by the names the endpoints give it (Responses: max_output_tokens).
_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
