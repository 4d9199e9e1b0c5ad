"""Mixed-model batches before they run: validation splits the lines into parts by base model,
each part's order sends an adapter's lines together, and the dispatcher sees one unit per part."""

from __future__ import annotations

import io
import json
from typing import Any

from services.api.dispatch.order import read_entries
from services.api.service.dispatch_order import NO_GROUPS, PartOrders
from services.api.service.validation import InputValidator, ValidationReport
from shared.stores.dispatcher import DispatchView
from shared.stores.models import ServedModel
from tests.support.lines import file_request_lines

CHAT = "/v1/chat/completions"
KNOWN = {
    "base": ServedModel("base", 1024),
    "base-a": ServedModel("base", 1024),  # an adapter of base
    "base-b": ServedModel("base", 1024),
    "other": ServedModel("other", None),
}


def line(custom_id: str, model: str, prompt: str = "hi") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode()


async def validate(items: list[bytes], mixed: bool) -> tuple[ValidationReport, PartOrders | None]:
    validator = InputValidator(CHAT, KNOWN, 100, 100)
    if mixed:
        validator.parts = PartOrders(NO_GROUPS)
    return await validator.run(file_request_lines(items)), validator.parts


def orders(parts: PartOrders, items: list[bytes]) -> dict[str | None, list[int]]:
    """Each part's line numbers in dispatch order."""
    source = io.BytesIO(b"".join(item + b"\n" for item in items))
    found = {}
    for base, builder in parts.parts.items():
        builder.plan()
        out = io.BytesIO()
        builder.write(out, source)
        found[base] = [entry.number for entry in read_entries(out.getvalue())[0]]
    parts.close()
    return found


async def test_without_the_opt_in_a_second_model_fails_the_batch_at_its_first_line() -> None:
    report, _ = await validate([line("1", "base"), line("2", "base"), line("3", "base-a")], mixed=False)
    assert [(e.line, e.code) for e in report.errors] == [(3, "mismatched_model")]


async def test_an_adapter_batch_runs_on_its_base_model() -> None:
    report, _ = await validate([line("1", "base-a"), line("2", "base-a")], mixed=False)
    assert report.ok and (report.model, report.base) == ("base-a", "base")


async def test_a_mixed_batch_splits_by_base_model_and_groups_each_adapter() -> None:
    models = ["base-a", "other", "base", "base-b", "nobody", "base-a", "base", "base-b", "other", "nobody"]
    items = [line(str(n), model) for n, model in enumerate(models, 1)]
    report, parts = await validate(items, mixed=True)
    assert report.ok and report.lines == 10 and report.served_lines == 8
    assert report.model == "base-a"
    assert parts is not None
    # Parts by first appearance; within base, the adapter first named goes first, each together.
    assert orders(parts, items) == {"base": [1, 6, 3, 7, 4, 8], "other": [2, 9], None: [5, 10]}


async def test_a_mixed_batch_keeps_every_other_check() -> None:
    items = [line("1", "base"), line("1", "other"), b'{"custom_id": "3"}', line("4", "nobody")]
    report, parts = await validate(items, mixed=True)
    assert [(e.line, e.code) for e in report.errors] == [
        (2, "duplicate_custom_id"),
        (3, "missing_required_parameter"),
        (3, "missing_required_parameter"),
        (3, "missing_required_parameter"),
    ]
    assert parts is not None
    parts.close()


async def test_a_mixed_batch_that_names_no_served_model_fails() -> None:
    report, parts = await validate([line("1", "nobody"), line("2", "none")], mixed=True)
    assert [(e.line, e.code) for e in report.errors] == [(None, "model_not_found")]
    assert parts is not None
    parts.close()


def batch_document(**fields: Any) -> dict[str, Any]:
    return {
        "_id": "batch_1",
        "model": "base-a",
        "status": "in_progress",
        "request_counts": {"total": 10},
        **fields,
    }


def test_the_dispatcher_sees_a_mixed_batch_as_one_unit_per_part() -> None:
    parts = [{"model": "base", "lines": 6}, {"model": "other", "lines": 2}, {"model": None, "lines": 2}]
    views = DispatchView.of_document(batch_document(mixed_models=True, parts=parts, emitted_parts=[1]))
    assert [(v.unit, v.model, v.total, v.emitted) for v in views] == [
        ("batch_1#0", "base", 6, False),
        ("batch_1#1", "other", 2, True),
        ("batch_1#2", None, 2, False),
    ]
    assert all(v.batch_id == "batch_1" and v.parts == 3 for v in views)


def test_a_one_model_batch_is_one_unit_on_its_base_model() -> None:
    (view,) = DispatchView.of_document(batch_document(parts=[{"model": "base", "lines": 10}]))
    assert (view.unit, view.model, view.total, view.part) == ("batch_1", "base", 10, None)
    (old,) = DispatchView.of_document(batch_document())  # stored before parts existed
    assert (old.unit, old.model) == ("batch_1", "base-a")


async def test_the_expected_work_leaves_out_lines_naming_no_served_model() -> None:
    """They are refused (``model_not_found``) and never run: the batch's estimated completion
    must not wait for them."""

    def capped(custom_id: str, model: str, cap: int) -> bytes:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": cap}
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode()

    items = [capped("1", "base", 10), capped("2", "nowhere", 500), capped("3", "base-a", 20)]
    report, parts = await validate(items, mixed=True)
    assert parts is not None
    parts.close()
    assert report.ok and report.expected_tokens == 30
