"""Which LoRA adapters the engine holds, as the worker sees it, and the loads it costs.

vLLM keeps at most ``max_loras`` adapters active at once and loads another in place of the least
recently used one. The worker follows the same rule over the lines it hands the engine, so
``ADAPTER_LOADS`` counts the loads a line order causes: the dispatcher sends a mixed batch's lines
adapter by adapter (``services/api/service/dispatch_order.py``, tags) to keep it low. It is the worker's
count of the engine's policy, not a reading of the engine.
"""

from __future__ import annotations

from collections import OrderedDict

from prometheus_client import Counter

ADAPTER_LOADS = Counter(
    "batchstream_inference_adapter_loads_total",
    "LoRA adapter loads into the engine's max_loras places (a line naming an adapter not held).",
    ["adapter"],
)


class AdapterSlots:
    """The ``places`` most recently used adapters; ``use`` counts a load for any other."""

    def __init__(self, places: int) -> None:
        self.places = max(1, places)
        self.loads = 0
        self._held: OrderedDict[str, None] = OrderedDict()

    def use(self, adapter: str) -> bool:
        """A line runs with ``adapter``; True when that meant a load."""
        if adapter in self._held:
            self._held.move_to_end(adapter)
            return False
        self._held[adapter] = None
        if len(self._held) > self.places:
            self._held.popitem(last=False)
        self.loads += 1
        ADAPTER_LOADS.labels(adapter=adapter).inc()
        return True
