"""Page sizes of the list endpoints, and of the console's views of them.

The routes take their ``limit`` bounds from here, and the console reads its sizes from
``/console/config.json`` (services/api/routes/console.py), so each size is written once.
"""

from __future__ import annotations

from typing import Any

BATCHES_PAGE = 20
"""``GET /v1/batches``: the default ``limit`` (OpenAI's)."""
BATCHES_PAGE_MAX = 100
"""``GET /v1/batches``: the largest ``limit`` (OpenAI's)."""
FILES_PAGE_MAX = 10_000
"""``GET /v1/files``: the largest ``limit``, also its default (OpenAI's)."""
MESSAGE_BATCHES_PAGE = 20
"""``GET /v1/messages/batches``: the default ``limit`` (Anthropic's)."""
MESSAGE_BATCHES_PAGE_MAX = 1000
"""``GET /v1/messages/batches``: the largest ``limit`` (Anthropic's)."""
ERROR_LINES_PAGE = 50
"""``GET /v1/batches/{id}/error_lines``: the default ``limit``."""
ERROR_LINES_PAGE_MAX = 500
"""``GET /v1/batches/{id}/error_lines``: the largest ``limit``."""

CONSOLE_BATCH_PAGE_SIZES = (20, 100, 1000)
"""The console's choices of batches per page (read in pages of ``BATCHES_PAGE_MAX``)."""
CONSOLE_BATCH_PAGE_SIZE = 100
"""The console's batches per page until the user chooses."""
CONSOLE_FILES_PAGE = 100
"""The console's files per page."""


def console_page_sizes() -> dict[str, Any]:
    """The sizes the console pages by (its ``config.json``'s ``pages``)."""
    return {
        "batches_max": BATCHES_PAGE_MAX,
        "batches_sizes": list(CONSOLE_BATCH_PAGE_SIZES),
        "batches_default": CONSOLE_BATCH_PAGE_SIZE,
        "files": CONSOLE_FILES_PAGE,
        "error_lines": ERROR_LINES_PAGE,
    }
