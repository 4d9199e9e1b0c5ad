"""The `batchstream` command runs with the client extra only, and says what `keys` needs."""

from __future__ import annotations

import subprocess
import sys

from services.client.connection import LOCAL_API_KEY
from shared.settings import DEV_API_KEY

# Runs the command with the services' dependencies made unimportable, as in an environment where
# only `pip install 'batchstream[client]'` ran.
WITHOUT_SERVICE_EXTRAS = """
import sys
for name in ("pymongo", "aiokafka", "pydantic_settings", "fastapi", "minio", "prometheus_client"):
    sys.modules[name] = None
from services.client.cli import main
sys.argv = ["batchstream", *sys.argv[1:]]
main()
"""


def batchstream_without_service_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVICE_EXTRAS, *args], capture_output=True, text=True, timeout=60
    )


def test_the_command_needs_only_the_client_extra() -> None:
    done = batchstream_without_service_extras("submit", "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: batchstream submit" in done.stdout and "--temperature" in done.stdout


def test_keys_without_the_api_extra_says_what_to_install() -> None:
    done = batchstream_without_service_extras("keys", "create", "--project", "p")
    assert done.returncode == 1
    assert "pip install 'batchstream[api]'" in done.stderr


def test_the_client_defaults_to_the_local_stack_s_key() -> None:
    assert LOCAL_API_KEY == DEV_API_KEY
