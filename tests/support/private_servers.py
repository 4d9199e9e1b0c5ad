"""Stand-in servers of a test's own, apart from the session's: for tests that kill, restart or
put a proxy in front of one (the session's servers are shared by every other test).

- ``PrivateMongo``: SecantusDB on a port and data dir of the test's; ``stop`` is a SIGKILL.
- ``private_broker``: the run's broker (``BATCHSTREAM_TEST_BROKER``: Tansu in memory, or
  noida-db in a tmp dir), optionally advertising another port (a proxy's; Tansu only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.local.brokers import Broker, broker_command
from deploy.local.probes import tcp_ready
from tests.support.real_servers import requested_broker
from tests.support.waiting import wait_until


class PrivateMongo:
    """A MongoDB-wire server that a test starts, SIGKILLs and starts again on the same data."""

    def __init__(self, port: int, path: Path) -> None:
        self.port, self.path = port, path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        server = os.path.join(os.path.dirname(sys.executable), "secantusd-py")
        command = [server, "--host", "127.0.0.1", "--port", str(self.port), "--storage-path", str(self.path)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(tcp_ready(self.port), 30, "the private MongoDB")

    def stop(self) -> None:
        """SIGKILL: no shutdown, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextmanager
def private_broker(
    port: int, advertised_port: int | None = None, broker: Broker | None = None
) -> Iterator[None]:
    """A broker (default: the run's) listening on ``port`` and telling clients to connect to
    ``advertised_port`` (default: ``port``) while the block runs; ready when the block starts."""
    chosen = broker or requested_broker()
    with tempfile.TemporaryDirectory(prefix="broker-") as data:
        command = broker_command(chosen, port, Path(data), advertised_port)
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            wait_until(tcp_ready(port), 15, f"the private {chosen} broker")
            yield
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # its own process group (new session)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
