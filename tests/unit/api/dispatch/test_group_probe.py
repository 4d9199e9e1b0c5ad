"""The group probe keeps the group's coordinator and finds it again when it moved (fake admin).

The real broker (tests/integration/test_dispatcher.py) has one node, so a coordinator that moves
is played here by a fake admin client standing in for aiokafka's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from services.api.dispatch.meter import GroupProbe
from shared.topics import CommitProgress

NOT_COORDINATOR = 16


@dataclass
class FakeAdminClient:
    """Answers as a cluster whose group coordinator is ``coordinator``; any other node answers
    OffsetFetch with nothing (as aiokafka returns a group-level NOT_COORDINATOR)."""

    coordinator: int = 1
    committed: int = 10
    members: int = 2
    finds: int = 0
    asked: list[int | None] = field(default_factory=list)
    fail_next: bool = False
    metadata: str = ""  # what the workers committed with the offsets

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def find_coordinator(self, group: str) -> int:
        self.finds += 1
        return self.coordinator

    async def list_consumer_group_offsets(
        self, group: str, coordinator: int | None, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        self.asked.append(coordinator)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("the node went away")
        if coordinator != self.coordinator:
            return {}
        return {tp: OffsetAndMetadata(self.committed, self.metadata) for tp in partitions}

    async def describe_consumer_groups(self, groups: list[str], group_coordinator_id: int | None) -> Any:
        error = 0 if group_coordinator_id == self.coordinator else NOT_COORDINATOR
        members = [] if error else [("m",)] * self.members
        return [SimpleNamespace(groups=[(error, groups[0], "Stable", "consumer", "range", members)])]


@pytest.fixture
async def probe_and_fake() -> tuple[GroupProbe, FakeAdminClient]:
    fake = FakeAdminClient()
    probe = GroupProbe(fake)  # type: ignore[arg-type]
    return probe, fake


async def test_the_coordinator_is_found_once_and_kept(probe_and_fake: Any) -> None:
    probe, fake = probe_and_fake
    for _ in range(5):
        committed, _, members = await probe.read("g", "t", 2)
        assert committed == {0: 10, 1: 10} and members == 2
    assert fake.finds == 1 and fake.asked == [1] * 5


async def test_a_coordinator_that_moved_is_found_again_and_the_members_kept(probe_and_fake: Any) -> None:
    probe, fake = probe_and_fake
    await probe.read("g", "t", 2)
    fake.coordinator, fake.committed = 2, 20  # a broker restarted: the group moved to node 2
    committed, _, members = await probe.read("g", "t", 2)  # node 1 answers nothing
    assert committed == {} and members == 2
    committed, _, _ = await probe.read("g", "t", 2)
    assert committed == {0: 20, 1: 20} and fake.finds == 2 and fake.asked[-1] == 2


async def test_a_failed_read_finds_the_coordinator_again(probe_and_fake: Any) -> None:
    probe, fake = probe_and_fake
    await probe.read("g", "t", 1)
    fake.fail_next = True
    with pytest.raises(ConnectionError):
        await probe.read("g", "t", 1)
    await probe.read("g", "t", 1)
    assert fake.finds == 2


async def test_the_lines_done_past_each_commit_are_read_from_its_metadata(probe_and_fake: Any) -> None:
    probe, fake = probe_and_fake
    assert (await probe.read("g", "t", 2)).progress == {}  # a broker that keeps none
    fake.metadata = CommitProgress(done_past=7, read_to=30).encode()
    reading = await probe.read("g", "t", 2)
    assert reading.committed == {0: 10, 1: 10}
    assert reading.progress == {0: CommitProgress(7, 30), 1: CommitProgress(7, 30)}
    fake.metadata = "another writer's note"
    assert (await probe.read("g", "t", 2)).progress == {}
