"""The fault-injection suite in ``make test``: a few trials per fault (``trials.py`` says what one
trial does and checks). ``CHAOS_TRIALS_PER_FAULT`` (default 1) sets how many; ``make chaos
TRIALS=200`` runs a long series with a summary table.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.trials import FAULTS, ChaosStack, run_trial

pytestmark = pytest.mark.chaos
TRIALS_PER_FAULT = int(os.environ.get("CHAOS_TRIALS_PER_FAULT", "1"))
LINES = int(os.environ.get("CHAOS_LINES", "4000"))


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    stack = ChaosStack(Path(tmp_path_factory.mktemp("chaos")))
    try:
        stack.start()
        yield stack
    finally:
        stack.close()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_batch_ends_exact_when_a_component_dies_mid_batch(chaos: ChaosStack, fault: str) -> None:
    for _ in range(TRIALS_PER_FAULT):
        seed = random.randrange(1, 2**31)
        result = run_trial(chaos, FAULTS[fault], seed, LINES)
        assert result.ok, result.line()
