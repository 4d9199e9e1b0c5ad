"""How the ``batchstream`` command prints: the api's JSON for scripts (``--json``), tables and
one-line summaries for people; a batch's progress on stderr while it waits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import openai
import typer
from openai import OpenAI
from openai.types import Batch
from rich.console import Console
from rich.table import Table

from services.client.batches import EXIT_CODES, EXIT_INTERRUPTED, wait
from services.client.progress import BatchProgress

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the api's JSON (for scripts).")]
PollFlag = Annotated[float, typer.Option("--poll", help="Seconds between status checks.", min=0.05)]
InputFile = Annotated[Path, typer.Argument(metavar="FILE", exists=True, dir_okay=False, readable=True)]
WaitFlag = Annotated[
    bool, typer.Option("--wait/--no-wait", help="--no-wait: print the new batch and exit 0.")
]


def beside(input_path: Path, suffix: str) -> Path:
    """FILE.<suffix>.jsonl next to FILE (its ``.jsonl`` dropped first): where a command writes."""
    stem = input_path.with_suffix("") if input_path.suffix == ".jsonl" else input_path
    return stem.with_name(f"{stem.name}.{suffix}.jsonl")


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def as_dict(obj: Any) -> dict[str, Any]:
    """An SDK object as the api sent it, extension fields included."""
    return obj.to_dict(mode="json")  # type: ignore[no-any-return]


def page_json(items: Iterable[Any], has_more: bool) -> dict[str, Any]:
    data = [as_dict(item) for item in items]
    return {"object": "list", "data": data, "has_more": has_more}


def when(ts: int | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def counts(batch: Batch) -> str:
    c = batch.request_counts
    if c is None:
        return ""
    return f"{c.completed + c.failed}/{c.total}" + (f" ({c.failed} failed)" if c.failed else "")


def new_table(*columns: str) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column)
    return table


def show_batch(batch: Batch) -> None:
    out.print(f"[bold]{batch.id}[/]  {batch.status}  {counts(batch)}")
    for label, value in (
        ("endpoint", batch.endpoint),
        ("model", getattr(batch, "model", None)),
        ("input", batch.input_file_id),
        ("output", batch.output_file_id),
        ("errors", batch.error_file_id),
        ("created", when(batch.created_at)),
        ("metadata", json.dumps(batch.metadata) if batch.metadata else None),
    ):
        if value:
            out.print(f"  {label:<9} {value}", markup=False, soft_wrap=True)
    show_errors(batch, out)


def show_errors(batch: Batch, console: Console) -> None:
    """Every bad input line of a failed batch, one per line."""
    for error in (batch.errors.data or []) if batch.errors else []:
        where = f"line {error.line}: " if error.line else ""
        console.print(f"{where}{error.code}: {error.message}", markup=False, soft_wrap=True)


def wait_with_progress(client: OpenAI, batch: Batch | str, poll_s: float) -> Batch:
    """Wait for the batch, drawing its progress on stderr; Ctrl-C leaves the batch running."""
    batch_id = batch if isinstance(batch, str) else batch.id
    try:
        with BatchProgress(err) as progress:
            return wait(client, batch, poll_s=poll_s, on_progress=progress)
    except KeyboardInterrupt:
        err.print(
            f"\ninterrupted: {batch_id} keeps running; follow it with `batchstream batches wait {batch_id}`"
            f" or stop it with `batchstream batches cancel {batch_id}`",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None


def finish(batch: Batch, as_json: bool) -> NoReturn:
    if as_json:
        print_json(as_dict(batch))
    show_errors(batch, err)
    raise typer.Exit(EXIT_CODES.get(batch.status, 1))


def error_message(error: openai.APIStatusError) -> str:
    """The message of an api error's body (OpenAI's envelope), else the SDK's own."""
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return error.message
