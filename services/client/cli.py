"""The ``batchstream`` command: submit a JSONL file and watch it run; manage batches, files, keys.

Every read takes ``--json`` (the api's objects, for scripts); without it, tables and one-line
summaries for people. ``--base-url`` / ``--api-key`` default to ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``, then to the local stack. Exit status: see ``batches.EXIT_CODES``; 5 when the
api answers an error or cannot be reached; 130 when interrupted while waiting (the batch goes on).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import openai
import typer
from openai import OpenAI

from services.client import admin
from services.client.batches import (
    EXIT_API_ERROR,
    EXIT_CODES,
    download,
    download_results,
    retry,
    submit,
)
from services.client.connection import connect
from services.client.message_batches import messages_command
from services.client.output import (
    InputFile,
    JsonFlag,
    PollFlag,
    WaitFlag,
    as_dict,
    beside,
    counts,
    err,
    error_message,
    finish,
    new_table,
    out,
    page_json,
    print_json,
    show_batch,
    wait_with_progress,
    when,
)
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import COMPLETION_WINDOW

app = typer.Typer(
    name="batchstream",
    help="Run and manage batches on a batchstream (or any OpenAI-compatible Batch) API.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",
)
batches_app = typer.Typer(help="List, show, cancel and wait for batches.", no_args_is_help=True)
files_app = typer.Typer(help="List, upload, download and delete files.", no_args_is_help=True)
keys_app = typer.Typer(help="Create, list and revoke API keys (MongoDB; needs the api extra).")
app.add_typer(batches_app, name="batches")
app.add_typer(files_app, name="files")
app.add_typer(keys_app, name="keys", no_args_is_help=True)


@dataclass
class Connection:
    base_url: str | None
    api_key: str | None

    def client(self) -> OpenAI:
        return connect(self.base_url, self.api_key)


@app.callback()
def connection(
    ctx: typer.Context,
    base_url: Annotated[
        str | None,
        typer.Option(
            envvar="OPENAI_BASE_URL",
            help="The api's base URL, ending in /v1 (default: the local stack, http://127.0.0.1:10900/v1).",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="OPENAI_API_KEY", help="The API key (default: the local stack's)."),
    ] = None,
) -> None:
    ctx.obj = Connection(base_url, api_key)


def _client(ctx: typer.Context) -> OpenAI:
    return ctx.find_object(Connection).client()  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------- submit


@app.command("submit")
def submit_command(
    ctx: typer.Context,
    input_path: InputFile,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where the output lines go (default: FILE.output.jsonl)."),
    ] = None,
    errors: Annotated[
        Path | None,
        typer.Option("--errors", "-e", help="Where the error lines go (default: FILE.errors.jsonl)."),
    ] = None,
    endpoint: Annotated[str, typer.Option(help="The batch's endpoint.")] = "/v1/chat/completions",
    completion_window: Annotated[
        str, typer.Option(help="The batch's completion window.")
    ] = COMPLETION_WINDOW,
    metadata: Annotated[
        list[str] | None, typer.Option("--metadata", "-m", help="KEY=VALUE; repeat for more.")
    ] = None,
    max_decoding_length: Annotated[
        int | None, typer.Option(help="Batch default for max_tokens (batchstream).")
    ] = None,
    max_context_length: Annotated[
        int | None, typer.Option(help="Batch cap on prompt + output tokens (batchstream).")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="Batch default (batchstream).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Batch default (batchstream).")] = None,
    top_k: Annotated[int | None, typer.Option(help="Batch default (batchstream).")] = None,
    mixed_models: Annotated[
        bool, typer.Option(help="Lines may name several models and LoRA adapters (batchstream).")
    ] = False,
    poll: PollFlag = 1.0,
    wait_for_it: WaitFlag = True,
    as_json: JsonFlag = False,
) -> None:
    """Upload FILE, create a batch, show its progress, download its output and error lines.

    Exits 0 when the batch completed (lines the model rejected are in the error file), 1 when it
    failed (every bad input line is listed), 3 expired, 4 cancelled, 5 api error, 130 interrupted.
    """
    client = _client(ctx)
    output = output or beside(input_path, "output")
    errors = errors or beside(input_path, "errors")
    defaults = SamplingDefaults(
        max_decoding_length=max_decoding_length,
        max_context_length=max_context_length,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
    )
    created = submit(
        client,
        input_path,
        endpoint=endpoint,
        completion_window=completion_window,
        metadata=_pairs(metadata or []),
        defaults=defaults,
        mixed_models=mixed_models,
    )
    if not wait_for_it:
        print_json(as_dict(created)) if as_json else out.print(created.id)
        return
    batch = wait_with_progress(client, created, poll)
    download_results(client, batch, output, errors)
    if not as_json:
        c = batch.request_counts
        ok, bad = (c.completed, c.failed) if c else (0, 0)
        err.print(
            f"{batch.id} {batch.status}: {ok} lines to {output}, {bad} to {errors}",
            markup=False,
            soft_wrap=True,
        )
    finish(batch, as_json)


app.command("messages")(messages_command)


@app.command("retry")
def retry_command(
    ctx: typer.Context,
    batch_id: str,
    code: Annotated[
        list[str] | None,
        typer.Option("--code", "-c", help="Only error lines with this code or HTTP status; repeat for more."),
    ] = None,
    poll: PollFlag = 1.0,
    wait_for_it: Annotated[
        bool, typer.Option("--wait/--no-wait", help="--wait: show the new batch's progress until it ends.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create a new batch from a finished batch's failed lines (all, or those with --code).

    The new batch has the same endpoint, window, priority and defaults, and metadata retry_of=BATCH_ID.
    Prints its id; with --wait, exits as `batches wait` does.
    """
    client = _client(ctx)
    created = retry(client, batch_id, code or None)
    if not wait_for_it:
        print_json(as_dict(created)) if as_json else out.print(created.id)
        return
    batch = wait_with_progress(client, created, poll)
    print_json(as_dict(batch)) if as_json else show_batch(batch)
    raise typer.Exit(EXIT_CODES.get(batch.status, 1))


def _pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--metadata")
        pairs[key] = value
    return pairs


# ------------------------------------------------------------------------------------ batches


@batches_app.command("list")
def batches_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    after: Annotated[str | None, typer.Option(help="Start after this batch id.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """The newest batches first."""
    page = _client(ctx).batches.list(limit=limit, after=after or openai.omit)
    if as_json:
        print_json(page_json(page.data, bool(page.has_more)))
        return
    table = new_table("id", "status", "lines", "endpoint", "created")
    for batch in page.data:
        table.add_row(batch.id, batch.status, counts(batch), batch.endpoint, when(batch.created_at))
    out.print(table)


@batches_app.command("get")
def batches_get(ctx: typer.Context, batch_id: str, as_json: JsonFlag = False) -> None:
    """One batch with its live request counts."""
    batch = _client(ctx).batches.retrieve(batch_id)
    print_json(as_dict(batch)) if as_json else show_batch(batch)


@batches_app.command("cancel")
def batches_cancel(ctx: typer.Context, batch_id: str, as_json: JsonFlag = False) -> None:
    """Cancel a batch (cancelling, then cancelled with the partial output kept)."""
    batch = _client(ctx).batches.cancel(batch_id)
    print_json(as_dict(batch)) if as_json else show_batch(batch)


@batches_app.command("wait")
def batches_wait(ctx: typer.Context, batch_id: str, poll: PollFlag = 1.0, as_json: JsonFlag = False) -> None:
    """Wait for a batch to end, showing its progress; the exit status tells the outcome (as submit's)."""
    batch = wait_with_progress(_client(ctx), batch_id, poll)
    print_json(as_dict(batch)) if as_json else show_batch(batch)
    raise typer.Exit(EXIT_CODES.get(batch.status, 1))


# -------------------------------------------------------------------------------------- files


@files_app.command("list")
def files_list(
    ctx: typer.Context,
    purpose: Annotated[str | None, typer.Option(help="Only files of this purpose.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    order: Annotated[str, typer.Option(help="asc or desc (by creation).")] = "desc",
    after: Annotated[str | None, typer.Option(help="Start after this file id.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Files, newest first."""
    page = _client(ctx).files.list(
        limit=limit,
        order=order,  # type: ignore[arg-type]
        purpose=purpose or openai.omit,
        after=after or openai.omit,
    )
    if as_json:
        print_json(page_json(page.data, bool(page.has_more)))
        return
    table = new_table("id", "purpose", "bytes", "filename", "created")
    for f in page.data:
        table.add_row(f.id, f.purpose, str(f.bytes), f.filename, when(f.created_at))
    out.print(table)


@files_app.command("upload")
def files_upload(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    purpose: Annotated[str, typer.Option(help="batch, user_data, ...")] = "batch",
    as_json: JsonFlag = False,
) -> None:
    """Upload a file; prints its id."""
    with path.open("rb") as handle:
        uploaded = _client(ctx).files.create(file=handle, purpose=purpose)  # type: ignore[arg-type]
    print_json(as_dict(uploaded)) if as_json else out.print(uploaded.id)


@files_app.command("download")
def files_download(
    ctx: typer.Context,
    file_id: str,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="A path (default: stdout).")] = None,
) -> None:
    """Stream a file's content to a path or to stdout."""
    client = _client(ctx)
    if output is not None:
        download(client, file_id, output)
        return
    with client.files.with_streaming_response.content(file_id) as response:
        for chunk in response.iter_bytes():
            sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


@files_app.command("delete")
def files_delete(ctx: typer.Context, file_id: str, as_json: JsonFlag = False) -> None:
    """Delete a file."""
    deleted = _client(ctx).files.delete(file_id)
    print_json(as_dict(deleted)) if as_json else out.print(f"deleted {deleted.id}")


# ------------------------------------------------------------------------------------- models


@app.command("models")
def models(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """The models the inference workers serve."""
    page = _client(ctx).models.list()
    if as_json:
        print_json(page_json(page.data, False))
        return
    table = new_table("id", "max_context_length", "owned_by")
    for model in page.data:
        table.add_row(model.id, str(getattr(model, "max_context_length", "") or ""), model.owned_by)
    out.print(table)


# ------------------------------------------------------------------------------------- limits


def _use(quota: dict[str, Any]) -> str:
    limit = quota.get("limit")
    return f"{quota.get('used', 0)} / {limit if limit is not None else 'unlimited'}"


@app.command("limits")
def limits(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """The project's quotas and its use of each (batchstream's `GET /v1/limits`)."""
    view: dict[str, Any] = _client(ctx).get("/limits", cast_to=object)  # type: ignore[arg-type]
    if as_json:
        print_json(view)
        return
    out.print(f"[bold]project[/] {view.get('project', '')}", soft_wrap=True)
    table = new_table("quota", "used / limit")
    for name in ("stored_bytes", "batches_in_progress", "concurrent_validations"):
        table.add_row(name, _use(view.get(name) or {}))
    out.print(table)
    per_model = new_table("model", "queued_lines", "enqueued_tokens (estimated)")
    for row in view.get("models") or []:
        per_model.add_row(row["model"], _use(row["queued_lines"]), _use(row["enqueued_tokens"]))
    out.print(per_model)


# --------------------------------------------------------------------------------------- keys

MongoUri = Annotated[
    str | None, typer.Option(help="MongoDB URI (default: BATCHSTREAM_MONGO_URI, as the services read it).")
]
MongoDatabase = Annotated[
    str | None, typer.Option(help="Database (default: BATCHSTREAM_MONGO_DATABASE, as the services read it).")
]


@keys_app.command("create")
def keys_create(
    project: Annotated[str, typer.Option(help="The project the key's files and batches belong to.")],
    mongo_uri: MongoUri = None,
    mongo_database: MongoDatabase = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a key and print it (shown once; only its hash is stored) on stdout, its id on stderr."""
    key_id, key = admin.create_key(project, mongo_uri, mongo_database)
    if as_json:
        print_json({"id": key_id, "key": key, "project": project})
        return
    out.print(key, markup=False, soft_wrap=True)
    err.print(f"id: {key_id} (revoke with: batchstream keys revoke {key_id})", markup=False)


@keys_app.command("list")
def keys_list(
    project: Annotated[str | None, typer.Option(help="Only this project's keys.")] = None,
    mongo_uri: MongoUri = None,
    mongo_database: MongoDatabase = None,
    as_json: JsonFlag = False,
) -> None:
    """The keys made with ``keys create``: id, project, created, revoked (never a key itself)."""
    keys = admin.list_keys(project, mongo_uri, mongo_database)
    if as_json:
        print_json({"object": "list", "data": [dataclasses.asdict(k) for k in keys]})
        return
    table = new_table("id", "project", "created", "revoked")
    for k in keys:
        table.add_row(k.id, k.project, when(k.created_at), when(k.revoked_at))
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key's id (key_..., from keys list) or the key itself.")],
    mongo_uri: MongoUri = None,
    mongo_database: MongoDatabase = None,
    as_json: JsonFlag = False,
) -> None:
    """Revoke a key (every api replica refuses it within a second). Exits 1 for an unknown key."""
    revoked = admin.revoke_key(key, mongo_uri, mongo_database)
    if as_json:
        print_json({"revoked": revoked})
    elif revoked:
        out.print("revoked")
    else:
        err.print("no such key")
    if not revoked:
        raise typer.Exit(1)


# --------------------------------------------------------------------------------------- main


def main() -> None:
    """The console script: the api's errors become one line on stderr and exit status 5."""
    try:
        app()
    except openai.APIStatusError as error:
        err.print(f"error: {error.status_code} {error_message(error)}", markup=False, soft_wrap=True)
        sys.exit(EXIT_API_ERROR)
    except openai.APIConnectionError as error:
        err.print(f"error: cannot reach the api: {error}", markup=False, soft_wrap=True)
        sys.exit(EXIT_API_ERROR)
    except admin.MissingApiExtra as error:
        err.print(f"error: {error}", markup=False, soft_wrap=True)
        sys.exit(1)
