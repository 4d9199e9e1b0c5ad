"""The quotas' arithmetic: token estimates, use counted down as lines get results, and which
limit refuses what, with messages naming the limit, the model and the project's use."""

from __future__ import annotations

import json

from services.api.prompt_keys import prompt_text
from services.api.quotas.limits import (
    LINE_LIMIT,
    QUOTA_EXCEEDED,
    RATE_LIMITED,
    TOKEN_LIMIT,
    ModelUse,
    batch_refusal,
    count_refusal,
    estimate_tokens,
    queue_refusal,
    queued_use,
    stored_refusal,
)
from services.api.quotas.settings import ProjectLimits
from services.api.service.validation import InputValidator
from shared.stores.batches import EnqueuedBatch
from tests.support.lines import file_request_lines, served

CHAT = "/v1/chat/completions"


def batch(total: int, done: int, **models: tuple[int, int]) -> EnqueuedBatch:
    enqueued = {m: {"lines": lines, "tokens": tokens} for m, (lines, tokens) in models.items()}
    return EnqueuedBatch(batch_id=f"b{total}{done}", total=total, done=done, enqueued=enqueued, enqueued_at=1)


def test_tokens_are_utf8_bytes_over_four_rounded_up() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("é" * 4) == 2  # 8 bytes
    assert estimate_tokens(b"123456789") == 3


def test_use_counts_down_as_lines_get_results() -> None:
    use = queued_use([batch(10, 0, m=(10, 400)), batch(10, 6, m=(10, 400)), batch(4, 4, m=(4, 40))])
    assert use == {"m": ModelUse(lines=14, tokens=560)}  # 10 + 4 lines left; 400 + 160 tokens


def test_a_mixed_batch_shares_its_lines_left_among_its_models() -> None:
    use = queued_use([batch(4, 2, a=(3, 30), b=(1, 10))])
    assert use == {"a": ModelUse(lines=2, tokens=15), "b": ModelUse(lines=1, tokens=5)}  # rounded up


def test_a_batch_without_lines_counts_nothing() -> None:
    assert queued_use([batch(0, 0, m=(0, 0))]) == {}


LIMITS = ProjectLimits(
    queued_lines=10, enqueued_tokens=1000, stored_bytes=500, batches_in_progress=3, concurrent_validations=2
)
UNLIMITED = ProjectLimits()


def test_a_batch_over_the_token_limit_fails_with_openais_code_and_the_numbers() -> None:
    refusal = batch_refusal("m", LIMITS, ModelUse(lines=2, tokens=900), ModelUse(lines=1, tokens=101))
    assert refusal is not None
    assert (refusal.limit, refusal.code) == ("enqueued_tokens", TOKEN_LIMIT)
    assert refusal.message.startswith("Enqueued token limit reached for m")
    assert "Limit: 1000 enqueued tokens" in refusal.message
    assert "900 enqueued" in refusal.message and "adds 101" in refusal.message


def test_a_batch_exactly_at_the_limit_passes_and_lines_are_checked_too() -> None:
    assert batch_refusal("m", LIMITS, ModelUse(2, 900), ModelUse(8, 100)) is None
    refusal = batch_refusal("m", LIMITS, ModelUse(2, 0), ModelUse(9, 0))
    assert refusal is not None and refusal.code == LINE_LIMIT
    assert "Limit: 10 queued lines" in refusal.message and "for m" in refusal.message


def test_a_batch_alone_bigger_than_the_limit_fails_and_unlimited_never_does() -> None:
    assert batch_refusal("m", LIMITS, ModelUse(), ModelUse(11, 0)) is not None
    assert batch_refusal("m", UNLIMITED, ModelUse(10**9, 10**12), ModelUse(10**9, 10**12)) is None


def test_a_create_is_refused_only_once_the_project_is_at_a_model_limit() -> None:
    assert queue_refusal("m", LIMITS, ModelUse(9, 999)) is None
    refusal = queue_refusal("m", LIMITS, ModelUse(3, 1000))
    assert refusal is not None and (refusal.limit, refusal.code) == ("enqueued_tokens", QUOTA_EXCEEDED)
    refusal = queue_refusal("m", LIMITS, ModelUse(10, 0))
    assert refusal is not None and refusal.limit == "queued_lines"


def test_counts_refuse_the_next_batch_past_each_limit() -> None:
    assert count_refusal(LIMITS, 2, 1) is None
    refusal = count_refusal(LIMITS, 3, 0)
    assert refusal is not None and (refusal.limit, refusal.code) == ("batches_in_progress", QUOTA_EXCEEDED)
    assert "Limit: 3 batches in progress" in refusal.message
    refusal = count_refusal(LIMITS, 2, 2)
    assert refusal is not None and (refusal.limit, refusal.code) == ("concurrent_validations", RATE_LIMITED)
    assert count_refusal(UNLIMITED, 10**6, 10**6) is None


def test_an_upload_past_the_stored_bytes_is_refused_naming_both_sizes() -> None:
    assert stored_refusal(LIMITS, 400, 100) is None
    refusal = stored_refusal(LIMITS, 400, 101)
    assert refusal is not None and refusal.limit == "stored_bytes"
    assert "400 bytes" in refusal.message and "101" in refusal.message and "Limit: 500" in refusal.message
    assert stored_refusal(UNLIMITED, 10**15, 10**15) is None


async def test_validation_counts_each_served_models_lines_and_prompt_tokens() -> None:
    bodies = [{"model": "m", "messages": [{"role": "user", "content": text}]} for text in ("x" * 40, "y" * 4)]
    items = [{"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": b} for i, b in enumerate(bodies)]
    validator = InputValidator(CHAT, served(m=1024, other=None), 100, 100)
    report = await validator.run(file_request_lines([json.dumps(i).encode() for i in items]))
    assert report.ok
    expected = sum(estimate_tokens(prompt_text(CHAT, b) or "") for b in bodies)
    assert expected > 40 // 4 + 4 // 4  # the prompts' text, with the role
    assert report.enqueued == {"m": ModelUse(lines=2, tokens=expected)}
