"""JSON Schema files for the public Kafka messages, generated from their msgspec Structs.

    python -m shared.protocol.schemas            # rewrite docs/schemas/*.json
    python -m shared.protocol.schemas --check    # exit 1 when a checked-in file is stale

The request schema is what a publisher may send (a field with a default may be left out); the
result schema is what a reader receives (every field is present: all are required). A unit test
fails when the checked-in files differ from what the Structs generate, so a change to a message
(shared/protocol/messages.py lists them) is one command away from its published schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec

from shared.protocol.messages import DeadLetter, RequestMessage, ResultGroup, ResultMessage

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_REF = "#/$defs/{name}"

# file name -> (message, the side of the wire it describes)
SCHEMAS: dict[str, tuple[type[msgspec.Struct], Literal["validation", "serialization"]]] = {
    "request-message.json": (RequestMessage, "validation"),
    "result-message.json": (ResultMessage, "serialization"),
    "result-group.json": (ResultGroup, "serialization"),
    "dead-letter.json": (DeadLetter, "serialization"),
}


def schema_of(message: type[msgspec.Struct], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    """The message's schema, its parts in ``$defs``; on the serialization side every field of
    every part is required (a reader receives them all, null or not)."""
    (top,), parts = msgspec.json.schema_components([message], ref_template=_REF)
    parts = dict(parts)
    if mode == "serialization":
        for part in parts.values():
            if "properties" in part:
                part["required"] = list(part["properties"])
    schema = parts.pop(message.__name__)
    assert top == {"$ref": _REF.format(name=message.__name__)}
    return {"$schema": JSON_SCHEMA_DIALECT, **schema, **({"$defs": parts} if parts else {})}


def render(name: str) -> str:
    """The file's text: stable key order, two-space indents, one trailing newline."""
    message, mode = SCHEMAS[name]
    return json.dumps(schema_of(message, mode), indent=2, ensure_ascii=False) + "\n"


def stale(directory: Path = DEFAULT_DIR) -> list[str]:
    """The schema files in ``directory`` that are missing or differ from the messages."""
    return [
        name
        for name in SCHEMAS
        if not (directory / name).exists() or (directory / name).read_text() != render(name)
    ]


def write(directory: Path = DEFAULT_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in SCHEMAS:
        (directory / name).write_text(render(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.protocol.schemas", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="default: docs/schemas")
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    args = parser.parse_args(argv)
    if args.check:
        names = stale(args.out)
        for name in names:
            print(f"{args.out / name} is stale: run python -m shared.protocol.schemas", file=sys.stderr)
        return 1 if names else 0
    write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
