"""One batch per create, however often a client retries it.

An ``Idempotency-Key`` header claims a slot for 24 hours. Without one, the SDK's retries after a
timeout look like identical creates from the same key: those are deduplicated within a short window
(``BATCHSTREAM_API_CREATE_DEDUPE_WINDOW_S``). A slot is claimed before the batch is written, so two
concurrent identical creates cannot both win.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

from shared.errors import InvalidRequest
from shared.stores.batches import BatchStore
from shared.stores.idempotency import Claim, IdempotencyStore

KEY_TTL_S = 86_400
WAIT_FOR_WINNER_S = 5.0


def fingerprint(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


class CreateDeduplicator:
    def __init__(self, claims: IdempotencyStore, batches: BatchStore, window_s: float) -> None:
        self.claims = claims
        self.batches = batches
        self.window_s = window_s

    async def claim(
        self, project: str, params: dict[str, Any], idempotency_key: str | None, batch_id: str
    ) -> str | None:
        """Claim the slot for ``batch_id``; return the id of an earlier batch that holds it, if any."""
        digest = fingerprint(params)
        explicit = bool(idempotency_key)
        slot = _slot(project, digest, idempotency_key)
        claim = Claim(slot=slot, batch_id=batch_id, fingerprint=digest, created_at=time.time())
        if await self.claims.claim(claim):
            return None
        held = await self.claims.held(slot)
        if held is None:
            return await self.claim(project, params, idempotency_key, batch_id)
        fresh = claim.created_at - held.created_at < (KEY_TTL_S if explicit else self.window_s)
        if not fresh:
            await self.claims.take_over(held, claim)
            return None
        if explicit and held.fingerprint != digest:
            raise InvalidRequest(
                "This Idempotency-Key was already used with different parameters.",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            )
        await self._wait_for_batch(held.batch_id)
        return held.batch_id

    async def release(
        self, project: str, params: dict[str, Any], idempotency_key: str | None, batch_id: str
    ) -> None:
        """Give back the slot ``batch_id`` claimed (its create was refused): a retry may win it."""
        await self.claims.release(_slot(project, fingerprint(params), idempotency_key), batch_id)

    async def _wait_for_batch(self, batch_id: str) -> None:
        """The winner writes its batch right after claiming; wait for it to appear."""
        deadline = time.monotonic() + WAIT_FOR_WINNER_S
        while not await self.batches.exists(batch_id):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.05)


def _slot(project: str, digest: str, idempotency_key: str | None) -> str:
    return f"{project}:key:{idempotency_key}" if idempotency_key else f"{project}:body:{digest}"
