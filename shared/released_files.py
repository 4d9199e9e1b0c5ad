"""Deleting the bytes of a file that was deleted while a running batch still read it.

``DELETE /v1/files/{id}`` hides a file (``deleted: true``) and then calls
:func:`purge_if_released`, which removes its document and object unless an unfinished batch reads
it: that batch's workers are fed already, but finalize may stream the input again to name the lines
of a cancelled or expired batch. Whoever ends a batch (the aggregator, or the api when validation
fails) calls it too, so both orders of "batch ends" and "file deleted" end with the bytes gone.
The calls are idempotent.
"""

from __future__ import annotations

import logging
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared.protocol.openai import TERMINAL_STATUSES
from shared.storage import ObjectStore

log = logging.getLogger(__name__)


async def purge_if_released(
    files: AsyncCollection[dict[str, Any]],
    batches: AsyncCollection[dict[str, Any]],
    store: ObjectStore,
    file_id: str,
) -> bool:
    """Remove a hidden (deleted) file unless an unfinished batch reads it; True when removed."""
    if not file_id:
        return False
    doc = await files.find_one({"_id": file_id, "deleted": True}, {"object_key": 1})
    if doc is None:
        return False
    reader = {"input_file_id": file_id, "status": {"$nin": list(TERMINAL_STATUSES)}}
    if await batches.count_documents(reader, limit=1):
        return False
    await store.delete(str(doc["object_key"]))
    await files.delete_one({"_id": file_id, "deleted": True})
    log.info("deleted file removed", extra={"file_id": file_id})
    return True
