"""Validation of a batch input file, line by line, before any line runs.

OpenAI's rule: any invalid line fails the batch, and every bad line is reported with its 1-based
line number, code and param. The validator streams and its memory does not grow with the file:
custom_ids are checked for repeats by an external sort (``CustomIdCheck``), not held in a set.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import struct
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_core import to_json

from services.api.prompt_keys import prompt_text
from services.api.quotas.limits import ModelUse, estimate_tokens
from services.api.service.dispatch_order import RUN_BYTES, OrderBuilder, PartOrders
from services.api.sorted_runs import SortedRuns
from shared import media
from shared.errors import echo
from shared.expected_output import LONGEST, OUTPUT_CAPS, expected_length
from shared.input_lines import InputLine
from shared.protocol.batch_input import BODY_BY_ENDPOINT, UTF8_BOM
from shared.protocol.openai import BatchError
from shared.seen_lines import MAX_LINE_NUMBER
from shared.settings import ApiSettings
from shared.stores.models import MODEL_NOT_FOUND, ServedModel

LINE_TOO_LARGE = "line_too_large"
LINE_TOO_LARGE_MESSAGE = "This line is {size} bytes; the limit is {limit} bytes per line."

SLICE_BYTES = 1024 * 1024
SLICE_LINES = 4096
"""The lines checked in the worker thread at a time (whichever is reached first)."""

ID_RUN_BYTES = RUN_BYTES
"""Memory for the custom_id records sorted at a time (about 40,000 lines' worth)."""


class CustomIdCheck:
    """Finds repeated custom_ids in bounded memory: one record per line (the id behind its length,
    then the line number) in ``SortedRuns``; one merge pass at the end walks each id's lines
    together, the first in the file before its repeats."""

    def __init__(self, run_bytes: int = ID_RUN_BYTES) -> None:
        self._runs = SortedRuns(run_bytes)
        self.repeat_count = 0

    def add(self, custom_id: str, line: int) -> None:
        raw = custom_id.encode("utf-8", "surrogatepass")
        self._runs.add(_LENGTH.pack(len(raw)) + raw + _LINE.pack(line))

    def repeats(self) -> Iterator[tuple[int, str]]:
        """(line, custom_id) of each line whose id an earlier line has, grouped by id."""
        previous = b""
        for record in self._runs.sorted():
            size = _LENGTH.size + _LENGTH.unpack_from(record)[0]
            if record[:size] == previous:
                self.repeat_count += 1
                (line,) = _LINE.unpack_from(record, size)
                yield line, record[_LENGTH.size : size].decode("utf-8", "surrogatepass")
            else:
                previous = record[:size]

    def close(self) -> None:
        self._runs.close()


# Big-endian: the records of one id sort by line.
_LENGTH, _LINE = struct.Struct(">I"), struct.Struct(">Q")


@dataclass
class ValidationReport:
    """What one pass over the input file found."""

    lines: int = 0
    model: str | None = None  # the first line's
    base: str | None = None  # the base model whose workers run ``model`` (itself, or its parent)
    served_lines: int = 0  # lines naming a served model (of a mixed batch: the rest are refused)
    errors: list[BatchError] = field(default_factory=list)
    error_count: int = 0
    enqueued: dict[str, ModelUse] = field(default_factory=dict)  # lines and tokens by served model
    # The lines' expected output tokens summed (shared/expected_output.py), the basis of the
    # batch's estimated completion time; None when a line has no output cap to expect.
    expected_tokens: int | None = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0


@dataclass
class InputValidator:
    endpoint: str
    known_models: Mapping[str, ServedModel]  # the models and adapters lines may name
    max_lines: int
    max_reported_errors: int
    max_reported_error_bytes: int = ApiSettings.model_fields["max_reported_error_bytes"].default
    allowed_media_domains: frozenset[str] = frozenset()  # http(s) media URLs only there (data: always)
    max_line_bytes: int | None = None  # as read (``request_lines``): longer lines come oversize
    order: OrderBuilder | None = None  # fed each line's prompt prefix (the dispatch order)
    default_length: int | None = None  # the batch's max_decoding_length (expected line lengths)
    parts: PartOrders | None = None
    """A mixed batch's (``mixed_models``): lines may name any served model or adapter; each goes
    to its base model's part, a line naming no served model to the refused part (base None)."""
    _custom_ids: CustomIdCheck = field(default_factory=lambda: CustomIdCheck())
    _report: ValidationReport = field(default_factory=ValidationReport)

    async def run(self, lines: AsyncIterator[InputLine]) -> ValidationReport:
        """Check the file's request lines (``shared.input_lines.request_lines``).

        The lines are read on the event loop and checked in a worker thread, a slice of
        ``SLICE_BYTES`` or ``SLICE_LINES`` at a time, so the api answers other calls while a
        large file validates (the loop waits on a slice, it does not run it)."""
        try:
            pending: list[InputLine] = []
            held, stopped = 0, False
            async for line in lines:
                pending.append(line)
                held += len(line.raw)
                if held >= SLICE_BYTES or len(pending) >= SLICE_LINES:
                    stopped = await asyncio.to_thread(self._check_lines, pending)
                    pending, held = [], 0
                    if stopped:
                        break
            if pending and not stopped:
                await asyncio.to_thread(self._check_lines, pending)
            await asyncio.to_thread(self._report_repeats)
        finally:
            self._custom_ids.close()
        if self._report.lines == 0:
            self._error(None, "empty_file", "The input file has no request lines.")
        elif self._report.lines > self.max_lines:
            self._error(
                None,
                "too_many_tasks",
                f"The input file has {self._report.lines} lines; the limit is {self.max_lines}.",
            )
        elif self.parts is not None and self._report.served_lines == 0 and self._report.ok:
            self._error(None, MODEL_NOT_FOUND, "No line names a model that a worker serves.", "body.model")
        report = self._report
        report.errors = listed(
            report.errors, report.error_count, self.max_reported_errors, self.max_reported_error_bytes
        )
        return report

    def _enqueue(self, body: dict[str, Any], text: str | None, raw: bytes) -> None:
        """Count the line and its estimated prompt tokens under the served model it names (the
        quotas', services/api/quotas/limits.py): the prompt, or the whole line where the endpoint
        has none."""
        model = body.get("model")
        if isinstance(model, str) and model in self.known_models:
            use = self._report.enqueued.get(model)
            if use is None:
                use = self._report.enqueued[model] = ModelUse()
            use.lines += 1
            use.tokens += estimate_tokens(text if text is not None else raw)

    def _check_lines(self, lines: list[InputLine]) -> bool:
        """Check a slice of lines (in a worker thread); True when the file has too many lines to
        read on."""
        for line in lines:
            if line.number > MAX_LINE_NUMBER:
                self._error(None, "too_many_tasks", f"The input file has more than {MAX_LINE_NUMBER} lines.")
                return True
            self._report.lines += 1
            if self._report.lines > self.max_lines:
                continue  # the batch fails anyway: the lines are only counted
            if line.oversize:
                limit = self.max_line_bytes
                self._error(
                    line.number,
                    LINE_TOO_LARGE,
                    LINE_TOO_LARGE_MESSAGE.format(size=line.oversize, limit=limit),
                )
                continue
            body = self._check_line(line.number, line.raw)
            text = prompt_text(self.endpoint, body) if body is not None else None
            if body is not None:
                self._enqueue(body, text, line.raw)
            length = expected_length(self.endpoint, body, self.default_length)
            runs = body is not None
            if self.order is not None:
                self.order.add(line, text, length=length)
            elif self.parts is not None and body is not None:
                model = body.get("model")
                runs = False
                if isinstance(model, str) and model:
                    known = self.known_models.get(model)
                    runs = known is not None  # else refused (``model_not_found``): it never runs
                    self.parts.add(known.base if known else None, model, line, text, length)
            expected = self._report.expected_tokens
            if runs and expected is not None:
                self._report.expected_tokens = None if length == LONGEST else expected + length
        return False

    def _report_repeats(self) -> None:
        """Every line whose custom_id an earlier line has, merged into the errors in line order
        (the report keeps the first ``max_reported_errors`` of all errors, as before)."""
        found_repeats = self._custom_ids.repeats()
        repeats = heapq.nsmallest(self.max_reported_errors, found_repeats)
        collections.deque(found_repeats, maxlen=0)  # counted to the end, whatever is reported
        self._report.error_count += self._custom_ids.repeat_count
        found = [
            BatchError(
                code="duplicate_custom_id",
                message=f"custom_id {echo(custom_id)} is not unique.",
                param="custom_id",
                line=number,
            )
            for number, custom_id in repeats
        ]
        if found:
            merged = sorted([*self._report.errors, *found], key=lambda e: e.line or 0)
            self._report.errors = merged[: self.max_reported_errors]

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
        # What parses must also serialise: the request message carries the body on, and orjson
        # writes at most MAX_DEPTH levels (it reads more). A line holds no deeper nesting than it
        # has brackets, so only a line with that many is written to find out.
        if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
            try:
                orjson.dumps(item)
            except orjson.JSONEncodeError:
                message = "This line is nested too deeply to be sent on."
                self._error(number, "invalid_request", message, "body")
                return None
        if not self._check_envelope(number, item):
            return None
        self._check_body(number, item["body"])
        if media.may_name_media(raw):  # names a media URL: one the workers may fetch?
            refusal = media.first_refusal(item["body"], self.allowed_media_domains)
            if refusal is not None:
                self._error(number, "invalid_request", refusal[1], refusal[0])
        return item["body"]  # type: ignore[no-any-return]

    def _check_envelope(self, number: int, item: dict[str, Any]) -> bool:
        """Check custom_id, method, url and body; True when the body can be looked into."""
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            self._error(number, "missing_required_parameter", "Missing custom_id.", "custom_id")
        else:
            self._custom_ids.add(custom_id, number)
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
                f"The url {echo(url)} does not match the batch endpoint {self.endpoint!r}.",
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
        known = self.known_models.get(model)
        if known is not None:
            self._report.served_lines += 1
            self._check_token_limit(number, body, known.max_context_length)
        elif self.parts is None:  # in a mixed batch, the line's own error result
            self._error(number, MODEL_NOT_FOUND, f"The model {echo(model)} does not exist.", "body.model")
        if self._report.model is None:
            self._report.model = model
            self._report.base = known.base if known else None
        elif model != self._report.model and self.parts is None:
            self._error(
                number,
                "mismatched_model",
                f"Every line must use the same model; saw {echo(model)} after {echo(self._report.model)}.",
                "body.model",
            )

    def _check_body_shape(self, number: int, body: dict[str, Any]) -> None:
        """The body the endpoint needs (its typed model, chosen by the batch's url): the field it
        reads and the positive counts; one error per bad field, the field it reads first."""
        shape = BODY_BY_ENDPOINT.get(self.endpoint)  # type: ignore[call-overload]
        if shape is None:
            return
        model, required = shape
        missing = model.missing(body, required)
        if missing is not None:
            self._error(
                number,
                "invalid_request",
                f"The body must contain {missing!r} for {self.endpoint}.",
                f"body.{missing}",
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
        name = next((n for n in OUTPUT_CAPS if body.get(n)), "max_tokens")
        requested = body.get(name)
        if context and isinstance(requested, int) and requested > context:
            self._error(
                number,
                "token_limit_exceeded",
                f"{name} {requested} exceeds the model's context length of {context}.",
                f"body.{name}",
            )


ERRORS_TRUNCATED = "errors_truncated"
"""The code of the last entry of a failed batch's ``errors.data`` when errors were left out."""


def listed(errors: list[BatchError], total: int, max_entries: int, max_bytes: int) -> list[BatchError]:
    """The errors a failed batch lists: the first of ``errors`` (``total`` in all), at most
    ``max_entries`` entries and ``max_bytes`` bytes of JSON; when any is left out, the last entry
    (``ERRORS_TRUNCATED``, OpenAI's shape) says how many there were in all."""
    if max_entries <= 0:
        return []
    sizes = [len(to_json(e)) + 1 for e in errors]  # + a comma (or a bracket) each
    if total == len(errors) <= max_entries and sum(sizes) + 1 <= max_bytes:
        return errors
    room = max_bytes - len(to_json(_left_out(total, total))) - 2
    kept: list[BatchError] = []
    for error, size in zip(errors, sizes, strict=True):
        if len(kept) == max_entries - 1 or size > room:
            break
        kept.append(error)
        room -= size
    return [*kept, _left_out(total, len(kept))]


def _left_out(total: int, shown: int) -> BatchError:
    message = f"The input file has {total} errors in all; the first {shown} are listed."
    return BatchError(code=ERRORS_TRUNCATED, message=message)


MAX_DEPTH = 254
"""The deepest nesting orjson writes (orjson 3.13: 255 levels raise "Recursion limit
reached"; it reads up to 1,024)."""
