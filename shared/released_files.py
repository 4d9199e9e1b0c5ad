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

from shared.storage import ObjectStore
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore

log = logging.getLogger(__name__)


async def purge_if_released(files: FileStore, batches: BatchStore, store: ObjectStore, file_id: str) -> bool:
    """Remove a hidden (deleted) file unless an unfinished batch reads it; True when removed."""
    if not file_id:
        return False
    doc = await files.hidden(file_id)
    if doc is None or await batches.reads_file(file_id):
        return False
    await store.delete(doc.object_key)
    await files.remove_hidden(file_id)
    log.info("deleted file removed", extra={"file_id": file_id})
    return True
