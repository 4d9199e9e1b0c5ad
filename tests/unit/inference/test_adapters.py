"""The worker's count of adapter loads follows vLLM's rule: ``max_loras`` places, least recently
used out."""

from __future__ import annotations

from services.inference.adapters import AdapterSlots


def test_grouped_lines_load_each_adapter_once() -> None:
    slots = AdapterSlots(places=1)
    for adapter in ["a"] * 5 + ["b"] * 5 + ["c"] * 5:
        slots.use(adapter)
    assert slots.loads == 3


def test_interleaved_lines_beyond_the_places_load_again_and_again() -> None:
    slots = AdapterSlots(places=2)
    for adapter in ["a", "b", "c"] * 3:
        slots.use(adapter)
    assert slots.loads == 9  # each line finds its adapter pushed out by the other two


def test_adapters_within_the_places_stay_loaded() -> None:
    slots = AdapterSlots(places=3)
    for adapter in ["a", "b", "c"] * 3:
        slots.use(adapter)
    assert slots.loads == 3
