"""The quotas' arithmetic and wording: pure, no I/O (the checks that read MongoDB are in
``service.py``).

What is exact and what is an estimate:
- stored bytes, batches in progress and concurrent validations are counted from the file and batch
  documents at the moment of the check: exact;
- queued lines of a one-model batch are exact as of the aggregator's last counts flush (under a
  second behind); a mixed batch's lines without a result are shared out among its models in
  proportion to each model's lines;
- enqueued tokens are an estimate: the api has no tokenizer, so a line counts its prompt's UTF-8
  bytes / ``BYTES_PER_TOKEN``, rounded up (the whole line's bytes for endpoints without a prompt:
  embeddings, score, rerank), and a batch's tokens count down in proportion to its lines that got
  a result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.api.quotas.settings import ProjectLimits
from shared.stores.batches import EnqueuedBatch

BYTES_PER_TOKEN = 4
"""UTF-8 bytes per token of the estimate (about right for English text with BPE tokenizers)."""

# Error codes, one owner each.
TOKEN_LIMIT = "token_limit_exceeded"  # OpenAI's, a batch failed at validation
LINE_LIMIT = "queued_line_limit_exceeded"  # a batch failed at validation
QUOTA_EXCEEDED = "quota_exceeded"  # a 429: the project is at a quota that frees as work ends
RATE_LIMITED = "rate_limit_exceeded"  # a 429: too many validations at once


def estimate_tokens(text: str | bytes) -> int:
    """Tokens of ``text`` by the estimate: its UTF-8 bytes / ``BYTES_PER_TOKEN``, rounded up."""
    if isinstance(text, bytes):
        size = len(text)
    else:
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return -(-size // BYTES_PER_TOKEN)


@dataclass
class ModelUse:
    """Lines without a result and their estimated prompt tokens, on one model."""

    lines: int = 0
    tokens: int = 0

    def add(self, lines: int, tokens: int) -> None:
        self.lines += lines
        self.tokens += tokens

    def stored(self) -> dict[str, int]:
        return {"lines": self.lines, "tokens": self.tokens}


def queued_use(batches: Iterable[EnqueuedBatch]) -> dict[str, ModelUse]:
    """Each model's lines still without a result and their tokens, over ``batches`` (a project's
    unfinished ones): a batch counts the share of its lines and tokens whose lines have no result."""
    use: dict[str, ModelUse] = {}
    for batch in batches:
        if batch.total <= 0:
            continue
        left = max(0, batch.total - batch.done)
        for model, counts in batch.enqueued.items():
            share = use.setdefault(model, ModelUse())
            share.add(
                _share(counts.get("lines", 0), left, batch.total),
                _share(counts.get("tokens", 0), left, batch.total),
            )
    return use


def _share(amount: int, left: int, total: int) -> int:
    """``amount * left / total``, rounded up (a line or token left is never counted as none)."""
    return -(-amount * left // total)


def at_limit(limit: int, used: int) -> bool:
    """The project may not add more (0: unlimited)."""
    return limit > 0 and used >= limit


def past_limit(limit: int, used: int, adding: int) -> bool:
    """Adding ``adding`` would take the project past the limit (0: unlimited)."""
    return limit > 0 and used + adding > limit


@dataclass(frozen=True)
class Refusal:
    """Why a request or a batch is refused: the limit's name (a ``ProjectLimits`` field), its
    error code and a message naming the limit and the project's use."""

    limit: str
    code: str
    message: str


def count_refusal(limits: ProjectLimits, in_progress: int, validating: int) -> Refusal | None:
    """A create refused by the project's batches not ended or validating (one more each)."""
    if past_limit(limits.batches_in_progress, in_progress, 1):
        return Refusal(
            "batches_in_progress",
            QUOTA_EXCEEDED,
            f"Batches in progress limit reached: the project has {in_progress} batches not yet "
            f"ended. Limit: {limits.batches_in_progress} batches in progress. "
            "Please try creating your batch again later.",
        )
    if past_limit(limits.concurrent_validations, validating, 1):
        return Refusal(
            "concurrent_validations",
            RATE_LIMITED,
            f"Concurrent validation limit reached: the project has {validating} batches validating. "
            f"Limit: {limits.concurrent_validations} concurrent validations. "
            "Please try creating your batch again shortly.",
        )
    return None


def queue_refusal(model: str, limits: ProjectLimits, use: ModelUse) -> Refusal | None:
    """A create refused because the project is already at a per-model limit on ``model``."""
    if at_limit(limits.enqueued_tokens, use.tokens):
        return Refusal("enqueued_tokens", QUOTA_EXCEEDED, _tokens_message(model, limits, use, None))
    if at_limit(limits.queued_lines, use.lines):
        return Refusal("queued_lines", QUOTA_EXCEEDED, _lines_message(model, limits, use, None))
    return None


def batch_refusal(model: str, limits: ProjectLimits, use: ModelUse, mine: ModelUse) -> Refusal | None:
    """A batch refused at validation: its own lines or tokens on ``model`` would take the project
    past that model's limit (``use``: the project's other batches)."""
    if past_limit(limits.enqueued_tokens, use.tokens, mine.tokens):
        return Refusal("enqueued_tokens", TOKEN_LIMIT, _tokens_message(model, limits, use, mine))
    if past_limit(limits.queued_lines, use.lines, mine.lines):
        return Refusal("queued_lines", LINE_LIMIT, _lines_message(model, limits, use, mine))
    return None


def stored_refusal(limits: ProjectLimits, used: int, adding: int) -> Refusal | None:
    """An upload of ``adding`` bytes refused by the project's stored bytes."""
    if not past_limit(limits.stored_bytes, used, adding):
        return None
    return Refusal(
        "stored_bytes",
        QUOTA_EXCEEDED,
        f"Stored bytes limit reached: the project's files hold {used} bytes and this file has "
        f"{adding}. Limit: {limits.stored_bytes} stored bytes. Delete files or try again later.",
    )


def _tokens_message(model: str, limits: ProjectLimits, use: ModelUse, mine: ModelUse | None) -> str:
    adds = f" and this batch adds {mine.tokens}" if mine is not None else ""
    return (
        f"Enqueued token limit reached for {model}: the project has {use.tokens} enqueued "
        f"tokens{adds} (estimated). Limit: {limits.enqueued_tokens} enqueued tokens. "
        "Please try submitting your batch again later."
    )


def _lines_message(model: str, limits: ProjectLimits, use: ModelUse, mine: ModelUse | None) -> str:
    adds = f" and this batch adds {mine.lines}" if mine is not None else ""
    return (
        f"Queued line limit reached for {model}: the project has {use.lines} queued lines{adds}. "
        f"Limit: {limits.queued_lines} queued lines. Please try submitting your batch again later."
    )
