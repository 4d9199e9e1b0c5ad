"""The bad-input corpus: malformed requests and input files, each with the answer it must get.

Two kinds of case:

- ``RequestCase``: one HTTP call that must answer at once with ``status`` and the error ``code``
  (and ``param`` when given) in OpenAI's error shape.
- ``FileCase``: an input file that uploads fine (OpenAI accepts malformed lines at upload) and makes
  the batch created from it end ``failed`` with exactly these ``(line, code)`` errors; or, when
  ``codes`` is ``None``, a file that is valid and must complete with ``completed`` lines.

Bodies are built here, in code, rather than kept as files: most of them are a few bytes that a
diff must show exactly (a BOM, a lone CR, a NUL), and the big ones (over 50,000 lines, a 3 MB
line, over the byte cap) are cheaper to make than to store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The corpus stack's caps (set through its environment), small so the "too big" cases stay cheap.
MiB = 1024 * 1024
BYTE_CAP = 12 * MiB  # any file but a batch input
BATCH_BYTE_CAP = 72 * MiB  # a batch input: room for a 64 MB line without a newline
LINE_BYTE_CAP = 4 * MiB  # one line of a batch input (the default)
MESSAGE_CAP = 3_600_000  # the producers' largest message: below the line cap, over a 3 MB line
LINE_CAP = 1000  # the corpus stack's max_batch_lines (the default, 1,000,000, is a benchmark's size)
LIST_BYTES = 8 * 1024  # the corpus stack's max_list_bytes: its lists of the corpus take pages
LONG = "y" * 15_000  # a client's value no message may echo whole
URL_LONG = LONG[:8000]  # in a path or query: the server reads at most 16 KiB of request head
ECHOED_BYTES = 2048  # the most an error answer, or one line's error entry, may take
MODEL = "corpus-fake"
OTHER_MODEL = "corpus-fake-other"
CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", **override: Any) -> dict[str, Any]:
    """A valid chat request line; ``override`` replaces top-level fields (None removes one)."""
    item: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    }
    for key, value in override.items():
        if value is None:
            item.pop(key)
        else:
            item[key] = value
    return item


def body(**override: Any) -> dict[str, Any]:
    """A valid chat body with ``override`` applied (None removes a field)."""
    return line(body={k: v for k, v in {**line()["body"], **override}.items() if v is not None})["body"]


def dump(*items: Any, sep: str = "\n") -> bytes:
    return sep.join(json.dumps(i) for i in items).encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# ----------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestCase:
    """One request. ``path`` is under the api root; ``{own_file}``, ``{other_file}``, ``{other_batch}``,
    ``{batch_file}`` and ``{own_batch}`` are filled in with ids the corpus fixture makes."""

    id: str
    method: str
    path: str
    status: int
    code: str | None
    param: str | None = None
    auth: str | None = "own"  # "own", "other" (another project's key), None, or a raw header value
    kwargs: dict[str, Any] = field(default_factory=dict)
    xfail: str | None = None  # the reason today's answer is wrong and not fixed here


def _upload(name: str = "in.jsonl", data: bytes = b"{}\n", purpose: str = "batch") -> dict[str, Any]:
    return {"files": {"file": (name, data)}, "data": {"purpose": purpose}}


def _create(**fields: Any) -> dict[str, Any]:
    return {"json": {"input_file_id": "{batch_file}", "endpoint": CHAT, "completion_window": "24h", **fields}}


_MULTIPART = "multipart/form-data; boundary=xyz"

REQUEST_CASES: list[RequestCase] = [
    # auth
    RequestCase("auth-missing", "GET", "/v1/files", 401, "invalid_api_key", auth=None),
    RequestCase("auth-wrong-scheme", "GET", "/v1/files", 401, "invalid_api_key", auth="Basic dXNlcjpwYXNz"),
    RequestCase("auth-empty-bearer", "GET", "/v1/batches", 401, "invalid_api_key", auth="Bearer"),
    RequestCase("auth-wrong-key", "GET", "/v1/batches", 401, "invalid_api_key", auth="Bearer sk-wrong"),
    RequestCase("auth-key-no-scheme", "GET", "/v1/models", 401, "invalid_api_key", auth="sk-wrong"),
    RequestCase(
        "auth-oversized-key", "GET", "/v1/files", 401, "invalid_api_key", auth="Bearer " + "k" * 8000
    ),
    RequestCase("auth-missing-on-upload", "POST", "/v1/files", 401, "invalid_api_key", None, None, _upload()),
    # uploads: fields, types, names
    RequestCase(
        "upload-no-file-field",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        "file",
        kwargs={"data": {"purpose": "batch"}},
    ),
    RequestCase(
        "upload-no-purpose",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        "purpose",
        kwargs={"files": {"file": ("in.jsonl", b"{}")}},
    ),
    RequestCase(
        "upload-unknown-purpose",
        "POST",
        "/v1/files",
        400,
        "invalid_value",
        "purpose",
        kwargs=_upload(purpose="x"),
    ),
    RequestCase(
        "upload-csv-for-batch",
        "POST",
        "/v1/files",
        400,
        "invalid_file_format",
        "file",
        kwargs=_upload(name="in.csv"),
    ),
    RequestCase(
        "upload-no-extension",
        "POST",
        "/v1/files",
        400,
        "invalid_file_format",
        "file",
        kwargs=_upload(name="input"),
    ),
    RequestCase(
        "upload-expiry-not-a-number",
        "POST",
        "/v1/files",
        400,
        "invalid_value",
        "expires_after[seconds]",
        kwargs={**_upload(), "data": {"purpose": "batch", "expires_after[seconds]": "soon"}},
    ),
    RequestCase(
        "upload-expiry-too-short",
        "POST",
        "/v1/files",
        400,
        "invalid_value",
        "expires_after[seconds]",
        kwargs={**_upload(), "data": {"purpose": "batch", "expires_after[seconds]": "59"}},
    ),
    RequestCase(
        "upload-over-the-byte-cap",
        "POST",
        "/v1/files",
        413,
        "file_too_large",
        "file",
        kwargs=_upload(data=b"x" * (BYTE_CAP + 1), purpose="user_data"),
    ),
    RequestCase(
        "create-body-over-the-json-cap",
        "POST",
        "/v1/batches",
        413,
        "request_too_large",
        kwargs=_create(metadata={"k": "v" * (2 * MiB)}),
    ),
    # uploads: headers and multipart framing
    RequestCase(
        "upload-json-instead-of-multipart",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        kwargs={"json": {"purpose": "batch", "file": "{}"}},
    ),
    RequestCase(
        "upload-no-content-type",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        kwargs={"content": b"purpose=batch"},
    ),
    RequestCase(
        "upload-multipart-without-boundary",
        "POST",
        "/v1/files",
        400,
        None,
        kwargs={"content": b"--xyz\r\n", "headers": {"content-type": "multipart/form-data"}},
    ),
    RequestCase(
        "upload-multipart-garbage",
        "POST",
        "/v1/files",
        400,
        None,
        kwargs={"content": b"\xff\xfe\x00garbage", "headers": {"content-type": _MULTIPART}},
    ),
    RequestCase(
        "upload-multipart-truncated",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        "file",
        kwargs={
            "content": b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{}',
            "headers": {"content-type": _MULTIPART},
        },
    ),
    RequestCase(
        "upload-oversized-content-type",
        "POST",
        "/v1/files",
        400,
        None,
        kwargs={"content": b"x", "headers": {"content-type": "multipart/form-data; boundary=" + "b" * 8000}},
    ),
    RequestCase(
        "upload-unknown-content-type",
        "POST",
        "/v1/files",
        400,
        "missing_required_parameter",
        kwargs={"content": b"{}", "headers": {"content-type": "application/x-nonsense"}},
    ),
    # ids and paths
    RequestCase("file-unknown-id", "GET", "/v1/files/file-doesnotexist", 404, "not_found", "file_id"),
    RequestCase("file-malformed-id", "GET", "/v1/files/%00%ff%fe", 404, "not_found", "file_id"),
    RequestCase("file-traversal-id", "GET", "/v1/files/..%2F..%2Fetc%2Fpasswd", 404, "not_found"),
    RequestCase("file-very-long-id", "GET", "/v1/files/" + "f" * 4000, 404, "not_found", "file_id"),
    RequestCase("file-another-projects", "GET", "/v1/files/{own_file}", 404, "not_found", "file_id", "other"),
    RequestCase(
        "file-content-another-projects",
        "GET",
        "/v1/files/{own_file}/content",
        404,
        "not_found",
        "file_id",
        "other",
    ),
    RequestCase(
        "file-delete-another-projects", "DELETE", "/v1/files/{own_file}", 404, "not_found", "file_id", "other"
    ),
    RequestCase("file-delete-unknown", "DELETE", "/v1/files/file-nope", 404, "not_found", "file_id"),
    RequestCase("files-after-unknown", "GET", "/v1/files?after=file-nope", 404, "not_found", "file_id"),
    RequestCase("files-limit-zero", "GET", "/v1/files?limit=0", 400, "invalid_value", "limit"),
    RequestCase("files-limit-too-big", "GET", "/v1/files?limit=10001", 400, "invalid_value", "limit"),
    RequestCase("files-limit-not-int", "GET", "/v1/files?limit=many", 400, "invalid_value", "limit"),
    RequestCase("files-order-sideways", "GET", "/v1/files?order=sideways", 400, "invalid_value", "order"),
    RequestCase("batch-unknown-id", "GET", "/v1/batches/batch_doesnotexist", 404, "not_found", "batch_id"),
    RequestCase("batch-malformed-id", "GET", "/v1/batches/%00", 404, "not_found", "batch_id"),
    RequestCase(
        "batch-another-projects", "GET", "/v1/batches/{own_batch}", 404, "not_found", "batch_id", "other"
    ),
    RequestCase(
        "batch-cancel-another-projects",
        "POST",
        "/v1/batches/{own_batch}/cancel",
        404,
        "not_found",
        "batch_id",
        "other",
    ),
    RequestCase(
        "batch-cancel-unknown", "POST", "/v1/batches/batch_nope/cancel", 404, "not_found", "batch_id"
    ),
    RequestCase("batches-after-unknown", "GET", "/v1/batches?after=batch_nope", 404, "not_found", "batch_id"),
    RequestCase("batches-limit-too-big", "GET", "/v1/batches?limit=101", 400, "invalid_value", "limit"),
    RequestCase("batches-limit-negative", "GET", "/v1/batches?limit=-1", 400, "invalid_value", "limit"),
    RequestCase(
        "partial-output-bad-kind",
        "GET",
        "/v1/batches/{own_batch}/partial_output?kind=x",
        400,
        "invalid_value",
        "kind",
    ),
    RequestCase("model-unknown", "GET", "/v1/models/no-such-model", 404, "model_not_found", "model"),
    RequestCase("route-unknown", "GET", "/v1/nothing-here", 404, "not_found"),
    RequestCase("route-wrong-method", "PUT", "/v1/files", 405, None, auth="own"),
    # batch create: body shape, types, ids
    RequestCase(
        "create-not-json",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        kwargs={"content": b"{not json", "headers": {"content-type": "application/json"}},
    ),
    RequestCase("create-a-list", "POST", "/v1/batches", 400, "invalid_value", kwargs={"json": ["a", "list"]}),
    RequestCase(
        "create-empty-body",
        "POST",
        "/v1/batches",
        400,
        "missing_required_parameter",
        kwargs={"content": b"", "headers": {"content-type": "application/json"}},
    ),
    RequestCase(
        "create-text-content-type",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        kwargs={"content": b'{"input_file_id": "x"}', "headers": {"content-type": "text/plain"}},
    ),
    RequestCase(
        "create-deeply-nested",
        "POST",
        "/v1/batches",
        400,
        None,
        kwargs={"content": nested(100_000).encode(), "headers": {"content-type": "application/json"}},
    ),
    RequestCase(
        "create-utf16-body",  # RFC 8259 allows a UTF-16 body; it reads, and names an unknown file
        "POST",
        "/v1/batches",
        404,
        "not_found",
        "file_id",
        kwargs={
            "content": json.dumps(
                {"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "24h"}
            ).encode("utf-16"),
            "headers": {"content-type": "application/json"},
        },
    ),
    RequestCase(
        "create-no-input-file",
        "POST",
        "/v1/batches",
        400,
        "missing_required_parameter",
        "input_file_id",
        kwargs={"json": {"endpoint": CHAT, "completion_window": "24h"}},
    ),
    RequestCase(
        "create-input-file-int",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "input_file_id",
        kwargs=_create(input_file_id=5),
    ),
    RequestCase(
        "create-unknown-input-file",
        "POST",
        "/v1/batches",
        404,
        "not_found",
        "file_id",
        kwargs=_create(input_file_id="file-nope"),
    ),
    RequestCase(
        "create-huge-input-file-id",
        "POST",
        "/v1/batches",
        404,
        "not_found",
        "file_id",
        kwargs=_create(input_file_id="f" * 1_000_000),
    ),
    RequestCase(
        "create-another-projects-file", "POST", "/v1/batches", 404, "not_found", "file_id", "other", _create()
    ),
    RequestCase(
        "create-user-data-file",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "input_file_id",
        kwargs=_create(input_file_id="{own_file}"),
    ),
    RequestCase(
        "create-bad-endpoint",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "endpoint",
        kwargs=_create(endpoint="/v1/x"),
    ),
    RequestCase(
        "create-endpoint-int",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "endpoint",
        kwargs=_create(endpoint=1),
    ),
    RequestCase(
        "create-bad-window",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "completion_window",
        kwargs=_create(completion_window="1h"),
    ),
    RequestCase(
        "create-metadata-list",
        "POST",
        "/v1/batches",
        400,
        "invalid_type",
        "metadata",
        kwargs=_create(metadata=[1]),
    ),
    RequestCase(
        "create-metadata-too-many",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "metadata",
        kwargs=_create(metadata={f"k{i}": "v" for i in range(17)}),
    ),
    RequestCase("file-huge-id", "GET", "/v1/files/" + URL_LONG, 404, "not_found", "file_id"),
    RequestCase("model-huge-id", "GET", "/v1/models/" + URL_LONG, 404, "model_not_found", "model"),
    RequestCase("batches-status-huge", "GET", "/v1/batches?status=" + URL_LONG, 400, None, "status"),
    RequestCase(
        "create-unknown-parameter",
        "POST",
        "/v1/batches",
        400,
        "unknown_parameter",
        "mixed_modles",
        kwargs=_create(mixed_modles=True),
    ),
    RequestCase(
        "create-unknown-nested-parameter",
        "POST",
        "/v1/batches",
        400,
        "unknown_parameter",
        "output_expires_after.secs",
        kwargs=_create(output_expires_after={"anchor": "created_at", "secs": 3600}),
    ),
    RequestCase(
        "create-huge-unknown-parameter",
        "POST",
        "/v1/batches",
        400,
        "unknown_parameter",
        kwargs=_create(**{LONG: 1}),
    ),
    RequestCase(
        "create-huge-endpoint",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "endpoint",
        kwargs=_create(endpoint=LONG),
    ),
    RequestCase(
        "retry-unknown-parameter",
        "POST",
        "/v1/batches/{own_batch}/retry",
        400,
        "unknown_parameter",
        "code",
        kwargs={"json": {"code": ["400"]}},
    ),
    RequestCase(
        "create-output-expiry-too-short",
        "POST",
        "/v1/batches",
        400,
        "invalid_value",
        "output_expires_after.seconds",
        kwargs=_create(output_expires_after={"anchor": "created_at", "seconds": 1}),
    ),
]


# -------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class FileCase:
    """An input file; ``codes`` are the ``(line, code)`` errors its batch must fail with, in order
    (the first ones when there are many), or None when the batch must complete ``completed`` lines."""

    id: str
    make: Callable[[], bytes]
    codes: list[tuple[int | None, str]] | None
    completed: int = 1
    xfail: str | None = None
    timeout_s: float = 30.0
    message: str | None = None  # in the first error's message
    beside: bool = False  # another project's small batch, created right after, must complete


def _many_lines(count: int) -> bytes:
    return dump(*(line(f"c{i}") for i in range(count)))


FILE_CASES: list[FileCase] = [
    # sizes
    FileCase("empty-file", lambda: b"", [(None, "empty_file")]),
    FileCase("only-blank-lines", lambda: b"\n\n  \n\t\n", [(None, "empty_file")]),
    FileCase("over-the-line-limit", lambda: _many_lines(LINE_CAP + 1), [(None, "too_many_tasks")]),
    FileCase(
        "huge-invalid-line",
        lambda: b'{"custom_id": "a", "x": "' + b"y" * 3_000_000,
        [(1, "invalid_json_line")],
    ),
    FileCase(
        "line-over-the-line-byte-cap",
        lambda: dump(line(body=body(messages=[{"role": "user", "content": "z" * 10_000_000}]))),
        [(1, "line_too_large")],
        message=f"the limit is {LINE_BYTE_CAP} bytes per line",
        beside=True,
    ),
    FileCase(
        "64-mb-line-without-newline",
        lambda: dump(line("a")) + b"\n" + b"x" * (64 * MiB),
        [(2, "line_too_large")],
        message=f"This line is {64 * MiB} bytes",
        beside=True,
    ),
    FileCase(
        "huge-valid-line",
        lambda: dump(line(body=body(messages=[{"role": "user", "content": "z" * 3_000_000}]))),
        None,
        timeout_s=60,
    ),
    # encodings
    FileCase(
        "utf16-le-with-bom",
        lambda: dump(line("a"), line("b")).decode().encode("utf-16"),
        [(1, "invalid_json_line"), (2, "invalid_json_line")],
    ),
    FileCase(
        "utf16-be",
        lambda: dump(line("a"), line("b")).decode().encode("utf-16-be"),
        [(1, "invalid_json_line"), (2, "invalid_json_line")],
    ),
    FileCase("utf8-bom", lambda: b"\xef\xbb\xbf" + dump(line()), None),
    FileCase(
        "invalid-utf8", lambda: b'{"custom_id": "a\xff\xfe", "method": "POST"}', [(1, "invalid_json_line")]
    ),
    FileCase(
        "latin1",
        lambda: (
            dump(line(body=body(messages=[{"role": "user", "content": "é"}])))
            .decode()
            .encode("latin-1")
            .replace(b"\\u00e9", b"\xe9")
        ),
        [(1, "invalid_json_line")],
    ),
    FileCase("nul-byte-in-line", lambda: dump(line()) + b"\x00", [(1, "invalid_json_line")]),
    FileCase("nul-bytes-only", lambda: b"\x00" * 64, [(1, "invalid_json_line")]),
    FileCase(
        "escaped-nul-in-content",
        lambda: dump(line(body=body(messages=[{"role": "user", "content": "a\u0000b"}]))),
        None,
    ),
    FileCase(
        "lone-surrogate",
        lambda: dump(line()).replace(b'"hi"', b'"\\ud800"'),
        [(1, "invalid_json_line")],
    ),
    # line endings
    FileCase("crlf", lambda: dump(line("a"), line("b"), sep="\r\n"), None, completed=2),
    FileCase("cr-only", lambda: dump(line("a"), line("b"), sep="\r"), [(1, "invalid_json_line")]),
    FileCase("trailing-newlines", lambda: dump(line("a"), line("b")) + b"\n\n\n", None, completed=2),
    # nesting
    FileCase(
        "nesting-100000",
        lambda: nested(100_000).encode(),
        [(1, "invalid_json_line")],
    ),
    FileCase(
        "nesting-in-body-300",
        lambda: dump(line(body=body(deep=json.loads(nested(300))))),
        [(1, "invalid_request")],
    ),
    # types: not an object, broken JSON
    FileCase("array-line", lambda: b"[1, 2]", [(1, "invalid_json_line")]),
    FileCase(
        "scalar-lines",
        lambda: b'"a"\n1\nnull\ntrue',
        [
            (1, "invalid_json_line"),
            (2, "invalid_json_line"),
            (3, "invalid_json_line"),
            (4, "invalid_json_line"),
        ],
    ),
    FileCase(
        "truncated-last-line",
        lambda: dump(line("a")) + b'\n{"custom_id": "b", "met',
        [(2, "invalid_json_line")],
    ),
    FileCase("trailing-garbage", lambda: dump(line()) + b" }", [(1, "invalid_json_line")]),
    FileCase(
        "csv-content",
        lambda: b"custom_id,method\na,POST\n",
        [(1, "invalid_json_line"), (2, "invalid_json_line")],
    ),
    # the envelope
    FileCase("no-custom-id", lambda: dump(line(custom_id=None)), [(1, "missing_required_parameter")]),
    FileCase("custom-id-int", lambda: dump(line(custom_id=7)), [(1, "missing_required_parameter")]),
    FileCase("custom-id-empty", lambda: dump(line("")), [(1, "missing_required_parameter")]),
    FileCase("duplicate-custom-id", lambda: dump(line("a"), line("a")), [(2, "duplicate_custom_id")]),
    FileCase("method-get", lambda: dump(line(method="GET")), [(1, "invalid_request")]),
    FileCase("no-method", lambda: dump(line(method=None)), [(1, "missing_required_parameter")]),
    FileCase("url-mismatch", lambda: dump(line(url="/v1/embeddings")), [(1, "invalid_url")]),
    FileCase("url-list", lambda: dump(line(url=[CHAT])), [(1, "invalid_url")]),
    FileCase("no-body", lambda: dump(line(body=None)), [(1, "missing_required_parameter")]),
    FileCase("body-string", lambda: dump(line(body="{}")), [(1, "invalid_request")]),
    # the body
    FileCase("stream-true", lambda: dump(line(body=body(stream=True))), [(1, "streaming_unsupported")]),
    FileCase("unknown-model", lambda: dump(line(body=body(model="nope"))), [(1, "model_not_found")]),
    FileCase(
        "model-object",
        lambda: dump(line(body=body(model={"id": MODEL}))),
        [(1, "missing_required_parameter")],
    ),
    FileCase(
        "two-models",
        lambda: dump(line("a"), line("b", body=body(model="other"))),
        [(2, "model_not_found"), (2, "mismatched_model")],
    ),
    FileCase("no-messages", lambda: dump(line(body=body(messages=None))), [(1, "invalid_request")]),
    FileCase("messages-string", lambda: dump(line(body=body(messages="hi"))), [(1, "invalid_request")]),
    FileCase("max-tokens-negative", lambda: dump(line(body=body(max_tokens=-1))), [(1, "invalid_request")]),
    FileCase("max-tokens-string", lambda: dump(line(body=body(max_tokens="4"))), [(1, "invalid_request")]),
    FileCase(
        "max-tokens-over-context",
        lambda: dump(line(body=body(max_tokens=10**9))),
        [(1, "token_limit_exceeded")],
    ),
    FileCase(
        "huge-integer",
        lambda: dump(line()).replace(b'"max_tokens": 4', b'"max_tokens": ' + b"9" * 5000),
        [(1, "invalid_json_line")],
    ),
    # echoes: a client's long value is quoted cut short (``ECHOED_BYTES``)
    FileCase("huge-model-name", lambda: dump(line(body=body(model=LONG))), [(1, "model_not_found")]),
    FileCase(
        "huge-model-name-after-another",
        lambda: dump(line("a"), line("b", body=body(model=LONG))),
        [(2, "model_not_found"), (2, "mismatched_model")],
    ),
    FileCase("huge-custom-id-repeated", lambda: dump(line(LONG), line(LONG)), [(2, "duplicate_custom_id")]),
    FileCase("huge-url", lambda: dump(line(url=LONG)), [(1, "invalid_url")]),
    FileCase(
        "every-line-bad-reports-each",
        lambda: b"x\n" * 5,
        [(n, "invalid_json_line") for n in range(1, 6)],
    ),
]
