"""The request message: one request line, published to ``requests.<model>``.

The dispatcher writes a batch line's message with ``RequestMessage.batch_line``: the line's
``body`` goes in as the input line holds it (raw JSON bytes, never parsed), and ``body`` is the
last member so that the message is exactly the bytes the api signs (shared/request_signing.py).
A worker reads it with ``read_request``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

import msgspec

from shared.protocol.sampling import RequestDefaults
from shared.protocol.wire import ENCODER, SCHEMA_VERSION, convert


class RequestMessage(msgspec.Struct, kw_only=True):
    """One request line, published to ``requests.<model>``.

    Pipelines may publish these directly: leave ``batch_id`` null and name a ``reply_topic``.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: Annotated[str, msgspec.Meta(description="Unique per line; becomes the output line's id.")]
    custom_id: str
    method: Literal["POST"] = "POST"
    url: str
    batch_id: Annotated[
        str | None, msgspec.Meta(description="Set by the api only (its messages are signed); leave null.")
    ] = None
    line: Annotated[int | None, msgspec.Meta(description="1-based line in the input file.")] = None
    project: Annotated[
        str | None,
        msgspec.Meta(
            description="Set by the api only, on batch lines: the batch's project (the worker shares "
            "its engine between projects); ignored on a direct request."
        ),
    ] = None
    reply_topic: Annotated[
        str | None,
        msgspec.Meta(
            description="Where the result goes; required unless the api sent the message (its batch "
            "lines go to the results topic)."
        ),
    ] = None
    defaults: RequestDefaults | None = None
    expires_at: Annotated[float | None, msgspec.Meta(description="Unix seconds; not run after.")] = None
    body: dict[str, Any]

    def to_json(self) -> bytes:
        return ENCODER.encode(self)

    @classmethod
    def batch_line(
        cls,
        *,
        request_id: str,
        custom_id: str,
        url: str,
        body: bytes,
        batch_id: str,
        line: int,
        project: str,
        defaults: RequestDefaults | None,
        expires_at: float | None,
    ) -> bytes:
        """A batch line's message as the dispatcher sends it, its ``body`` (a JSON object's raw
        bytes, as the input line holds it) written unparsed: the dispatcher's hot path."""
        message = cls(
            request_id=request_id,
            custom_id=custom_id,
            url=url,
            batch_id=batch_id,
            line=line,
            project=project,
            defaults=defaults,
            expires_at=expires_at,
            body=cast(dict[str, Any], msgspec.Raw(body)),  # msgspec writes a Raw as it is
        )
        return ENCODER.encode(message)

    @classmethod
    def from_value(cls, value: Any) -> RequestMessage:
        """A decoded message that ``read_request`` did not take: its scalar types coerced, its
        defaults still checked strictly (as at create); raises ``msgspec.ValidationError``."""
        message = convert(value, cls)
        defaults = value.get("defaults") if isinstance(value, dict) else None
        if defaults is not None:
            try:
                msgspec.convert(defaults, RequestDefaults)
            except msgspec.ValidationError as exc:
                raise msgspec.ValidationError(str(exc).replace("`$", "`$.defaults", 1)) from exc
        return message


_READ = msgspec.json.Decoder(RequestMessage)


def read_request(value: bytes) -> RequestMessage | None:
    """The request message ``value`` holds when it is as the api writes it (every type exact,
    every default in range); None for anything else, which the caller reads with
    ``RequestMessage.from_value`` (a type to coerce) or refuses with its error."""
    try:
        return _READ.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
