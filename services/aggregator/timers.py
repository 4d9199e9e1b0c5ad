"""What the aggregator's timers do (``agents.py`` declares them): the sweep and offset rewinds.

The third timer, the counts flush, is ``counting.ChunkProcessor.flush_counts``.

faust runs these once the first table recovery is over; the stall check is not among them for
that reason (``supervisor.py``).
"""

from __future__ import annotations

import logging

from services.aggregator.faust_adapter import TP, ResultsPartitions, label
from services.aggregator.metrics import REWINDS
from services.aggregator.offset_gaps import GapRewinder, unaccounted
from services.aggregator.runtime import Runtime, partition_for

log = logging.getLogger(__name__)


async def sweep(runtime: Runtime, results: ResultsPartitions, partitions: int) -> None:
    """Schedule finalize for the batches this worker owns that are due (``counting.ChunkProcessor.sweep``)."""
    try:
        due = await runtime.processor.sweep(
            lambda batch_id: results.owns(partition_for(batch_id, partitions))
        )
    except Exception:
        log.exception("sweep failed")
        return
    if due:
        log.info("sweep scheduled finalize", extra={"batch_ids": due})


async def rewind_lost_offsets(results: ResultsPartitions, rewinder: GapRewinder[TP]) -> None:
    """Fetch again the results faust dropped and will never deliver (``offset_gaps.py``)."""
    view = results.offsets()
    for tp in rewinder.due({tp: unaccounted(offsets) for tp, offsets in view.items()}):
        committed = view[tp].committed
        assert committed is not None  # ``unaccounted`` reports nothing without it
        REWINDS.inc()
        log.warning(
            "results offsets that faust will not deliver; fetching again from the committed one",
            extra={"partition": label(tp), "offsets": results.describe({tp: view[tp]})},
        )
        try:
            await results.rewind(tp, committed)
        except Exception:
            log.exception("rewinding failed; retrying after the next wait", extra={"partition": label(tp)})
