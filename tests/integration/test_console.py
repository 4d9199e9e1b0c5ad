"""The web console in a real browser: Debian's Chromium driven by Playwright, against the stack.

One browser serves the module; each test opens its own context (its own storage, so its own
login). Every request a page makes is recorded and must stay on the api's origin: the console
works offline. Screenshots of each page go to ``test-artifacts/console/`` (or
``$BATCHSTREAM_TEST_ARTIFACTS/console``), which git ignores, for a reviewer to look at.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from deploy.local import Stack
from tests.support.http_batches import create_batch, upload
from tests.support.lines import chat_line, parse_jsonl
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("BATCHSTREAM_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def artifacts() -> Path:
    root = Path(os.environ.get("BATCHSTREAM_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts"))
    folder = root / "console"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium (apt-get)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(base_url=origin(stack), headers=headers, timeout=30) as client:
        yield client


def origin(stack: Stack) -> str:
    """The api's root URL (``stack.base_url`` ends in ``/v1``)."""
    return stack.base_url.removesuffix("/v1")


class Console:
    """One browser context logged in (or not) to the console, with the requests it made."""

    def __init__(self, context: BrowserContext, stack: Stack, artifacts: Path) -> None:
        self.context, self.stack, self.artifacts = context, stack, artifacts
        self.url = f"{origin(stack)}/console/"
        self.page: Page = context.new_page()
        self.requests: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))

    def open(self, fragment: str = "") -> Page:
        self.page.goto(f"{self.url}{fragment}")
        return self.page

    def login(self, key: str | None = None) -> Page:
        page = self.open()
        page.get_by_label("API key").fill(key or self.stack.api_key)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="Batches")).to_be_visible()
        return page

    def shot(self, name: str, full_page: bool = True) -> None:
        self.page.screenshot(path=str(self.artifacts / f"{name}.png"), full_page=full_page)

    def foreign_requests(self) -> list[str]:
        own = origin(self.stack)
        return [u for u in self.requests if not (u.startswith(own + "/") or u.startswith(("blob:", "data:")))]


@pytest.fixture
def console(browser: Browser, stack: Stack, artifacts: Path) -> Iterator[Console]:
    context = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    opened = Console(context, stack, artifacts)
    yield opened
    context.close()
    assert opened.foreign_requests() == [], "the console fetched from outside the api"
    assert opened.errors == [], "a page raised a script error"


def chat_lines(model: str, prefix: str, count: int, **body: Any) -> bytes:
    return "\n".join(chat_line(f"{prefix}-{i}", model, f"Say {i}", **body) for i in range(count)).encode()


def test_login_refuses_a_wrong_key_and_keeps_a_good_one(console: Console) -> None:
    page = console.open()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    console.shot("login")
    page.get_by_label("API key").fill("sk-not-a-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Incorrect API key")
    console.login()
    page.reload()  # the key is kept: no second login
    expect(page.get_by_role("heading", name="Batches")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()


def test_a_batch_created_in_the_browser_runs_to_completed_with_a_moving_bar(
    console: Console, model_id: str, tmp_path: Path, http: httpx.Client
) -> None:
    # Half the lines end at once, half run for seconds (exactly max_tokens each): the bar has a
    # value between 0 and the end to show for a while, whatever the machine's speed.
    count = 24
    lines = [
        chat_line(f"web-{i}", model_id, f"Say {i}", max_tokens=4 if i % 2 else 600, ignore_eos=True)
        for i in range(count)
    ]
    source = tmp_path / "browser.jsonl"
    source.write_text("\n".join(lines))
    page = console.login()
    page.get_by_role("link", name="New batch").first.click()
    expect(page.get_by_role("heading", name="New batch")).to_be_visible()
    page.locator("#file").set_input_files(str(source))
    expect(page.locator("#chosen")).to_contain_text("browser.jsonl")
    page.get_by_label("Metadata (key=value per line)").fill("team=console")
    console.shot("new-batch")
    page.get_by_role("button", name="Upload and create").click()
    page.wait_for_url("**/console/#/batches/batch_*")
    batch_id = page.url.rsplit("/", 1)[-1]
    # Every value the bar shows is recorded in the page, so a bar that jumps from 0 to the end
    # (no live updates) is told apart from one that moves.
    page.evaluate(
        """() => { window.__seen = new Set();
          new MutationObserver(() => { const bar = document.querySelector('.bar.big');
            if (bar) window.__seen.add(bar.getAttribute('aria-valuenow')); })
          .observe(document.getElementById('main'), {subtree: true, childList: true, attributes: true}); }"""
    )
    expect(page.locator("h1 .badge")).to_have_text("completed", timeout=240_000)
    seen = {int(v) for v in page.evaluate("() => [...window.__seen]")}
    assert count in seen
    assert any(0 < v < count for v in seen), f"the bar never showed a value between 0 and {count}: {seen}"
    expect(page.locator("#counts")).to_contain_text(f"{count} done")
    expect(page.locator("#timeline")).to_contain_text("completed")
    expect(page.locator("#plot polyline.completed")).to_have_count(1)
    bar, done = page.locator(".bar.big"), page.locator(".bar.big .done")
    assert (done.bounding_box() or {})["width"] >= 0.99 * (bar.bounding_box() or {})["width"]
    usage = http.get(f"/v1/batches/{batch_id}").json()["usage"]
    expect(page.locator("main")).to_contain_text(f"{usage['output_tokens']:,}")
    expect(page.locator("main")).not_to_contain_text("[object")
    console.shot("batch-completed")

    with page.expect_download() as download:
        page.get_by_role("button", name="Download output").click()
    downloaded = parse_jsonl(Path(download.value.path()).read_text())
    batch = http.get(f"/v1/batches/{batch_id}").json()
    assert batch["metadata"] == {"team": "console"}
    served = parse_jsonl(http.get(f"/v1/files/{batch['output_file_id']}/content").text)
    assert downloaded == served
    assert [line["custom_id"] for line in downloaded] == [f"web-{i}" for i in range(count)]

    page.get_by_role("link", name="Batches").first.click()
    row = page.locator(f"tr[data-id='{batch_id}']")
    expect(row).to_contain_text("completed")
    expect(row).to_contain_text("team=console")
    console.shot("batches")
    page.set_viewport_size(PHONE)
    expect(row.get_by_role("link", name=batch_id)).to_be_visible()
    console.shot("batches-390px")


def test_error_lines_show_their_code_and_are_searchable(
    console: Console, model_id: str, http: httpx.Client
) -> None:
    lines = [chat_line("fine", model_id, "hello", max_tokens=4)]
    lines += [chat_line(f"too-long-{i}", model_id, "hello " * 5000, max_tokens=4) for i in range(3)]
    batch_id = create_batch(http, "\n".join(lines).encode())
    page = console.login()
    page.goto(f"{console.url}#/batches/{batch_id}")
    expect(page.locator("h1 .badge")).to_have_text("completed", timeout=120_000)
    errors = page.locator("#error-lines tbody tr")
    expect(errors).to_have_count(3)
    expect(errors.first).to_contain_text("400")
    code = errors.first.locator("code").inner_text()
    assert code and code != "error"
    errors.first.locator("summary").click()  # open the line: its raw JSON
    raw = json.loads(errors.first.locator("pre").inner_text())
    assert raw["custom_id"].startswith("too-long-") and raw["response"]["status_code"] == 400
    console.shot("batch-error-lines")

    page.get_by_label("custom_id").fill("too-long-2")
    page.get_by_role("button", name="Search").click()
    expect(errors).to_have_count(1)
    expect(errors.first).to_contain_text("too-long-2")
    page.get_by_label("custom_id").fill("")
    page.get_by_label("Error code").fill("batch_cancelled")
    page.get_by_role("button", name="Search").click()
    expect(errors).to_have_count(0)
    expect(page.locator("#error-lines")).to_contain_text("No error lines match")
    page.get_by_label("Error code").fill(code)
    page.get_by_role("button", name="Search").click()
    expect(errors).to_have_count(3)
    with page.expect_download() as download:
        page.get_by_role("button", name="Download errors").click()
    assert len(parse_jsonl(Path(download.value.path()).read_text())) == 3


def test_validation_errors_are_listed_per_line(console: Console, model_id: str, http: httpx.Client) -> None:
    content = "\n".join([chat_line("ok", model_id, "hi"), "{not json", chat_line("ok", model_id, "dup")])
    batch_id = create_batch(http, content.encode())
    page = console.login()
    page.goto(f"{console.url}#/batches/{batch_id}")
    expect(page.locator("h1 .badge")).to_have_text("failed", timeout=60_000)
    table = page.locator("#validation-errors")
    api_errors = http.get(f"/v1/batches/{batch_id}").json()["errors"]["data"]
    assert len(api_errors) >= 2
    for error in api_errors:
        expect(table).to_contain_text(error["code"])
    expect(table.locator("tbody tr")).to_have_count(len(api_errors))
    console.shot("batch-validation-errors")


def test_cancel_asks_first_then_cancels_a_running_batch(
    console: Console, model_id: str, http: httpx.Client
) -> None:
    batch_id = create_batch(http, chat_lines(model_id, "slow", 64, max_tokens=2000))
    wait_until(
        lambda: http.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress", 60, "in_progress"
    )
    page = console.login()
    page.goto(f"{console.url}#/batches/{batch_id}")
    expect(page.locator("h1 .badge")).to_have_text("in progress")
    page.get_by_role("button", name="Cancel batch").click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    console.shot("cancel-confirmation", full_page=False)
    dialog.get_by_role("button", name="Keep").click()
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Cancel batch").click()
    page.keyboard.press("Escape")  # the keyboard's way out: nothing happens either
    expect(dialog).to_be_hidden()
    assert http.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress"
    page.get_by_role("button", name="Cancel batch").click()
    dialog.get_by_role("button", name="Cancel batch").click()
    expect(page.locator("h1 .badge")).to_have_text("cancelled", timeout=120_000)
    batch = http.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "cancelled"
    assert batch["request_counts"]["completed"] < 64
    console.shot("batch-cancelled")


def test_another_projects_batches_are_not_listed(
    console: Console, stack: Stack, model_id: str, http: httpx.Client
) -> None:
    page = console.login()
    page.evaluate("() => { window.__sameDocument = true; }")  # gone if the page reloads
    # Batches created while the list is open appear and finish there by themselves.
    mine = create_batch(http, chat_lines(model_id, "mine", 1, max_tokens=2))
    other_key = stack.create_key("console-other-team")
    with httpx.Client(base_url=origin(stack), headers={"Authorization": f"Bearer {other_key}"}) as other:
        theirs = create_batch(other, chat_lines(model_id, "theirs", 1, max_tokens=2))
        wait_until(lambda: other.get(f"/v1/batches/{theirs}").json()["status"] == "completed", 120, "theirs")
    expect(page.locator(f"tr[data-id='{mine}']")).to_contain_text("completed", timeout=120_000)
    expect(page.locator(f"tr[data-id='{theirs}']")).to_have_count(0)
    assert page.evaluate("() => window.__sameDocument === true")
    page.goto(f"{console.url}#/batches/{theirs}")
    expect(page.get_by_role("alert")).to_contain_text("No batch")
    # The other project's key sees its own batch and not ours.
    page.get_by_role("button", name="Log out").click()
    console.login(other_key)
    expect(page.locator(f"tr[data-id='{theirs}']")).to_be_visible()
    expect(page.locator(f"tr[data-id='{mine}']")).to_have_count(0)


def test_status_filter_files_models_and_usage_pages(
    console: Console, model_id: str, http: httpx.Client, tmp_path: Path
) -> None:
    batch_id = create_batch(http, chat_lines(model_id, "pages", 2, max_tokens=2))
    wait_until(lambda: http.get(f"/v1/batches/{batch_id}").json()["status"] == "completed", 120, "completed")
    page = console.login()
    page.get_by_label("Status").select_option("failed")
    expect(page).to_have_url(f"{console.url}#/batches?status=failed&size=100")
    expect(page.locator("main p.muted").first).not_to_have_text("Loading…")  # the list has loaded
    assert page.locator("#batches tbody tr").count() >= 1  # the validation test's failed batch
    statuses = page.locator("#batches tbody tr").evaluate_all("rows => rows.map(r => r.dataset.status)")
    assert set(statuses) <= {"failed"}
    expect(page.locator(f"tr[data-id='{batch_id}']")).to_have_count(0)
    page.get_by_label("Status").select_option("completed")
    expect(page.locator(f"tr[data-id='{batch_id}']")).to_be_visible()

    # Files: the input is listed; a deleted upload disappears after the confirmation.
    spare = upload(http, chat_lines(model_id, "spare", 1), name="spare.jsonl")
    page.get_by_role("link", name="Files").click()
    row = page.locator(f"tr[data-id='{spare['id']}']")
    expect(row).to_contain_text("spare.jsonl")
    console.shot("files")
    with page.expect_download() as download:
        row.get_by_role("button", name="Download").click()
    assert Path(download.value.path()).read_bytes() == chat_lines(model_id, "spare", 1)
    row.get_by_role("button", name="Delete").click()
    page.locator("dialog#confirm").get_by_role("button", name="Delete file").click()
    expect(row).to_have_count(0)
    assert http.get(f"/v1/files/{spare['id']}").status_code == 404

    page.get_by_role("link", name="Models").click()
    model_row = page.locator(f"#models tr[data-id='{model_id}']")
    expect(model_row).to_contain_text("1 alive of 1")
    console.shot("models")

    page.get_by_role("link", name="Usage").click()
    usage = http.get("/v1/usage").json()["data"]
    mine = next(r for r in usage if r["model"] == model_id)
    assert mine["completed"] >= 2 and mine["output_tokens"] > 0
    expect(page.locator("#usage tbody")).to_contain_text(model_id)
    expect(page.locator("#usage tbody")).to_contain_text(f"{mine['output_tokens']:,}")
    expect(page.locator("#limits")).to_contain_text(
        f"{http.get('/v1/limits').json()['batches_in_progress']['limit']:,}"
    )
    console.shot("usage")


def test_every_page_is_usable_by_keyboard(console: Console) -> None:
    page = console.open()
    expect(page.get_by_label("API key")).to_be_focused()
    page.keyboard.type(console.stack.api_key)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Batches")).to_be_visible()
    for name in ("Files", "Models", "Usage", "New batch"):
        link = page.locator("#nav").get_by_role("link", name=name)
        link.focus()
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name=name)).to_be_visible()
    # The skip link: first in the tab order, it moves focus to the content and keeps the page.
    page.locator("#nav").get_by_role("link", name="Files").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Files")).to_be_visible()
    page.reload()  # a page just opened: the first Tab
    expect(page.get_by_role("heading", name="Files")).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    expect(page.get_by_role("heading", name="Files")).to_be_visible()
    page.set_viewport_size(PHONE)
    page.locator("#nav").get_by_role("link", name="New batch").click()
    console.shot("new-batch-390px")


def test_a_file_dropped_on_the_new_batch_page_is_the_one_uploaded(
    console: Console, model_id: str, http: httpx.Client
) -> None:
    page = console.login()
    page.goto(f"{console.url}#/new")
    # Two models, one served: a mixed batch runs the one and answers the other model_not_found.
    content = (
        chat_line("dropped-0", model_id, "hi", max_tokens=2) + "\n" + chat_line("gone", "no-model", "hi")
    )
    # What a drag from the desktop delivers: a drop event whose DataTransfer holds the file.
    page.locator("#drop").evaluate(
        """(zone, text) => { const data = new DataTransfer();
             data.items.add(new File([text], 'dropped.jsonl', {type: 'application/jsonl'}));
             const init = {dataTransfer: data, bubbles: true, cancelable: true};
             zone.dispatchEvent(new DragEvent('dragover', init));
             zone.dispatchEvent(new DragEvent('drop', init)); }""",
        content,
    )
    expect(page.locator("#chosen")).to_contain_text("dropped.jsonl")
    page.get_by_label("Priority (-100 to 100)").fill("7")
    page.get_by_label("Lines may name several models and adapters").check()
    page.get_by_role("button", name="Upload and create").click()
    page.wait_for_url("**/console/#/batches/batch_*")
    expect(page.locator("h1 .badge")).to_have_text("completed", timeout=120_000)
    batch = http.get(f"/v1/batches/{page.url.rsplit('/', 1)[-1]}").json()
    assert batch["priority"] == 7 and batch["mixed_models"] is True
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    by_model = page.locator("#usage-by-model")
    expect(by_model).to_contain_text(model_id)
    expect(by_model).to_contain_text(f"{batch['usage_by_model'][model_id]['total_tokens']:,}")
    expect(page.locator("#error-lines")).to_contain_text("model_not_found")
    assert http.get(f"/v1/files/{batch['input_file_id']}/content").text == content
    assert http.get(f"/v1/files/{batch['input_file_id']}").json()["filename"] == "dropped.jsonl"


def test_message_batches_are_listed_beside_the_others_and_tagged(
    console: Console, model_id: str, http: httpx.Client
) -> None:
    params = {"model": model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    created = http.post(
        "/v1/messages/batches",
        json={"requests": [{"custom_id": "m1", "params": params}]},
        headers={"x-api-key": console.stack.api_key, "anthropic-version": "2023-06-01"},
    )
    assert created.status_code == 200, created.text
    message_batch = created.json()["id"]
    openai_batch = create_batch(http, chat_lines(model_id, "beside", 1, max_tokens=2))
    page = console.login()
    row = page.locator(f"tr[data-id='{message_batch}']")
    expect(row).to_be_visible()
    expect(row.locator("td.id .badge")).to_have_text("messages")
    expect(page.locator(f"tr[data-id='{openai_batch}'] td.id .badge")).to_have_count(0)
