"""The scheduler's places follow the settings, whoever builds it."""

from __future__ import annotations

from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.scheduler import EngineScheduler
from services.inference.settings import InferenceSettings


def test_a_scheduler_built_without_settings_has_the_workers_places() -> None:
    engine = FakeEngine(max_running=64)
    settings = InferenceSettings(engine="fake", max_num_seqs=64)
    for scheduler in (
        EngineScheduler(engine),
        EngineScheduler(engine, settings),
        RequestHandler(engine).scheduler,
    ):
        places = scheduler.places
        # 64 running and as many waiting inside the engine; beside young lines the others keep 16.
        assert (places.places, places.young_lines, places.beside_young) == (128, 16, 16)


def test_an_engine_without_a_limit_has_no_places_to_share() -> None:
    places = EngineScheduler(FakeEngine()).places
    assert (places.places, places.beside_young) == (0, None)


def test_a_share_of_one_keeps_no_places_beside_young_lines() -> None:
    settings = InferenceSettings(engine="fake", engine_queue_lines=0, young_batch_others_share=1)
    scheduler = EngineScheduler(FakeEngine(max_running=8), settings)
    assert (scheduler.places.places, scheduler.places.beside_young) == (8, None)
