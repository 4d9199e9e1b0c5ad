"""API keys for tests, made the way an operator makes them: ``batchstream keys create``."""

from __future__ import annotations

import os
import subprocess
import sys

from deploy.local import Stack


def create_key(stack: Stack, project: str) -> str:
    """A new key of ``project`` on ``stack``'s database."""
    out = subprocess.run(
        [sys.executable, "-m", "services.client", "keys", "create", "--project", project],
        env={**os.environ, **stack.env()},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
