"""Moved to ``tests.support.waiting``; kept so tests written before the move still import."""

from tests.support.waiting import eventually, wait_until

__all__ = ["eventually", "wait_until"]
