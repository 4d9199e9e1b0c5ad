"""How many more lines a model's requests topic may take: its backlog against a target.

The backlog is measured without ListOffsets LATEST (it would cost a request per partition, and
Tansu, the local and test broker, answers it wrongly for multi-record batches): the end of each partition is
the highest offset our own sends were acknowledged at, plus one, and the consumed side is the
inference group's committed offset, less the lines past it already done (a worker commits a
partition only up to its oldest line in flight and runs lines out of offset order: behind one
long or waiting line, every line done after it would count as waiting, and the target would hold
the workers dry). Those are counted by the worker itself (its commit's metadata,
``shared.topics.CommitProgress``), or, on a broker that keeps no commit metadata, are our lines
the aggregator has a result of (``done_past`` takes the larger of the two).
Lines of direct-Kafka pipelines sent before our last send count too; lines sent after it are
seen at our next send.

The target keeps every worker's in-flight window full with a little more to spare: one
``worker_window`` per group member (read from the group, so it adapts as workers join and leave)
plus what the group commits (its measured rate) in ``backlog_seconds`` and in ``commit_lag_s`` (a
line stays in the measured backlog until its worker commits, every 0.1 s, and the next probe);
never below ``min_backlog`` nor above ``max_backlog``. The rate feeds the target, so while a
line spends less time in the measured backlog than ``backlog_seconds + commit_lag_s`` the target
keeps growing with the rate: the workers, not the target, set the pace. When the group has
committed everything while lines wait, the workers may have run dry: the target doubles (a slow
start, so a fast engine is not held to the rate measured while it warmed up), and relaxes back
otherwise.
The pure part is :class:`Backlog`; :class:`GroupProbe` reads the broker.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from shared.topics import CommitProgress

log = logging.getLogger(__name__)

RATE_WINDOW_S = 1.0  # the committed offsets move in steps (workers commit every 0.1 s): smooth
DRAIN_FRACTION = 0.125  # read the offsets again once about this much of the backlog has drained
TARGET_DECAY_PER_S = 0.8  # a target above what the rate needs relaxes by this factor per second


@dataclass
class Backlog:
    """One model's topic: ends seen from our sends, the group's commits, the drain rate."""

    worker_window: int
    backlog_seconds: float
    min_backlog: int
    direct_weight: float = 1.0
    commit_lag_s: float = 0.3
    max_backlog: int = 20_000
    ends: dict[int, int] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)
    answered: dict[int, int] = field(default_factory=dict)  # lines done past the commit (observe)
    read_to: dict[int, int] = field(default_factory=dict)  # the workers' read positions (observe)
    members: int = 1
    rate: float = 0.0  # lines the group finishes (commits or answers) per second, over RATE_WINDOW_S
    _history: deque[tuple[float, int]] = field(default_factory=deque)
    _target: float = 0.0
    _ran_dry: bool = True  # the last reading found every line sent committed (or none was taken)
    _observed_at: float | None = None

    def produced(self, partition: int, offset: int) -> None:
        """A send acknowledged at ``offset`` (acks come in offset order per partition; taking the
        latest rather than the highest follows a broker that lost its data and starts again)."""
        self.ends[partition] = offset + 1

    def observe(
        self,
        committed: dict[int, int],
        members: int,
        now: float,
        waiting: bool = True,
        answered: dict[int, int] | None = None,
        read_to: dict[int, int] | None = None,
    ) -> None:
        """A probe's answer: committed offsets per partition and the group's member count;
        ``answered``: per partition, the lines done that the commit has not passed yet (counted
        by the worker, or ours the aggregator has a result of), out of the backlog; ``read_to``:
        per partition, the offset after the last line the worker read (past our last send when a
        pipeline wrote after it: those lines are in ``answered`` too).

        ``waiting``: lines are queued for the topic. If the group had committed everything (the
        workers ran dry between two commits) the target doubles (slow start); otherwise it
        relaxes towards what the rate needs, by ``TARGET_DECAY_PER_S`` a second however often
        the group is read (commits that stall for a moment must not shrink it in a few readings).
        """
        self.committed.update(committed)
        self.answered = dict(answered or {})
        self.read_to = dict(read_to or {})
        self.members = max(1, members)
        total = sum(self.committed.values()) + sum(self.answered.values())  # lines done
        self._history.append((now, total))
        while len(self._history) > 2 and self._history[0][0] < now - RATE_WINDOW_S:
            self._history.popleft()
        (first_at, first), (last_at, last) = self._history[0], self._history[-1]
        self.rate = max(0, last - first) / (last_at - first_at) if last_at > first_at else 0.0
        needed = self._needed
        self._ran_dry = self.lag == 0
        if waiting and self.lag == 0:  # at most 4x what the rate asks: a ramp, not a flood
            grown = min(max(2 * self._target, self.min_backlog), 4 * needed)
            self._target = min(self.max_backlog, max(needed, grown))
        else:
            elapsed = 0.0 if self._observed_at is None else max(0.0, now - self._observed_at)
            self._target = max(needed, self._target * TARGET_DECAY_PER_S**elapsed)
        self._observed_at = now

    @property
    def _needed(self) -> float:
        """Every worker's window, plus the rate over the commit delay and ``backlog_seconds``."""
        return self.members * self.worker_window + self.rate * (self.backlog_seconds + self.commit_lag_s)

    @property
    def lag(self) -> int:
        """Lines in the topic or in a worker without a result: past each partition's commit (up to
        our last send, or the worker's read position when past it), less those done already."""
        return sum(
            max(0, max(end, self.read_to.get(p, 0)) - self.committed.get(p, 0) - self.answered.get(p, 0))
            for p, end in self.ends.items()
        )

    @property
    def target(self) -> int:
        wanted = min(self.max_backlog, max(self._target, self._needed))
        return max(self.min_backlog, math.ceil(wanted))

    def reading_interval(self, fastest: float, slowest: float) -> float:
        """Seconds until the group's offsets are worth reading again: when, at the measured rate,
        about an eighth of the lines in the topic will have been worked off (the rest still keep
        the workers busy), between ``fastest`` and ``slowest``. So a slow engine's group is read
        rarely (each reading is a request the broker answers, CPU the engine may share); a fast
        one, an empty topic or an unknown rate, every ``fastest`` seconds. Lines beyond what the
        rate needs (a slow start's ramp) do not stretch it: a warming engine may speed up.
        Nor does a rate the last reading found the topic empty at: that rate was what the group
        was given (a few small batches), not what it can do, and a big batch sent after them
        would otherwise wait up to ``slowest`` for its second round."""
        if self.rate <= 0 or self.lag == 0 or self._ran_dry:
            return fastest
        return min(slowest, max(fastest, DRAIN_FRACTION * min(self.lag, self._needed) / self.rate))

    def head_room(self) -> int:
        """Lines head starts may send beyond the allowance: up to a second target in the topic.
        A new batch starts within a round behind a full topic, and a stream of new batches
        cannot fill the topic beyond what the workers can hold (lines past their windows wait in
        the topic in arrival order, where the worker's places cannot put a new batch first)."""
        return max(0, 2 * self.target - self.lag)

    def allowance(self, ours_in_topic: int) -> int:
        """Lines we may send now.

        Up to the target; and while direct-Kafka lines wait in the topic, our own lines may stay
        at ``direct / direct_weight`` of them (capped at the target), so batch lines keep their
        weighted place in the stream rather than starving behind a pipeline's burst.
        """
        lag = self.lag
        direct = max(0, lag - ours_in_topic)
        fill = self.target - lag
        share = min(self.target, math.ceil(direct / self.direct_weight)) - ours_in_topic
        return max(0, fill, share)


MEMBERS_EVERY_S = 1.0  # workers join and leave rarely: the offsets are read far more often
COORDINATOR_EVERY_S = 30.0  # find the group's coordinator again at least this often
NOT_COORDINATOR_ERRORS = {14, 15, 16}  # load in progress, not available, not coordinator


class GroupReading(NamedTuple):
    committed: dict[int, int]  # partition -> the group's committed offset
    progress: dict[int, CommitProgress]  # partition -> its worker's count past the commit, if any
    members: int


def done_past(reading: GroupReading, answered: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition, the lines done past the commit and the workers' read positions: the larger
    of the workers' own count (their commit's metadata, as fresh as their last commit) and ours
    the aggregator has a result of (``answered``, read with each journey check), which stands
    alone where the broker keeps no commit metadata or a worker sent none."""
    done = dict(answered)
    for partition, progress in reading.progress.items():
        done[partition] = max(progress.done_past, answered.get(partition, 0))
    return done, {partition: progress.read_to for partition, progress in reading.progress.items()}


class GroupProbe:
    """Reads a consumer group's committed offsets and member count with one admin client.

    The group's coordinator (the broker that answers for it) is found once and kept: without it,
    every read would first ask the cluster for the coordinator, twice the requests. It is found
    again after a failed read, after an answer that lacks a partition asked for (aiokafka drops a
    broker's group-level NOT_COORDINATOR error and returns nothing), after a DescribeGroups error
    saying so, and every ``COORDINATOR_EVERY_S`` in any case.
    """

    def __init__(self, admin: AIOKafkaAdminClient) -> None:
        self._admin = admin
        self._started = False
        self._describe_works = True
        self._members: dict[str, tuple[float, int]] = {}  # group -> (read at, members)
        self._coordinators: dict[str, tuple[float, int]] = {}  # group -> (found at, node id)

    async def read(self, group: str, topic: str, partitions: int) -> GroupReading:
        """Committed offsets of ``topic``'s partitions, the lines done past each (the commit's
        metadata), and the group's members.

        The partitions are named in the request, as every Kafka broker answers it; a request for
        all of a group's offsets is answered wrongly by some (Tansu)."""
        if not self._started:
            await self._admin.start()
            self._started = True
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        coordinator = await self._coordinator(group)
        try:
            offsets = await self._admin.list_consumer_group_offsets(group, coordinator, wanted)
        except Exception:
            self._coordinators.pop(group, None)
            raise
        if any(tp not in offsets for tp in wanted):  # every partition named is answered, or none
            self._coordinators.pop(group, None)
        ours = {tp.partition: meta for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}
        return GroupReading(
            committed={p: meta.offset for p, meta in ours.items()},
            progress={p: read for p, meta in ours.items() if (read := CommitProgress.read(meta.metadata))},
            members=await self._members_cached(group),
        )

    async def _coordinator(self, group: str) -> int:
        now = time.monotonic()
        found_at, node = self._coordinators.get(group, (float("-inf"), -1))
        if now - found_at >= COORDINATOR_EVERY_S:
            node = await self._admin.find_coordinator(group)
            self._coordinators[group] = (now, node)
        return node

    async def _members_cached(self, group: str) -> int:
        now = time.monotonic()
        read_at, members = self._members.get(group, (float("-inf"), 1))
        if now - read_at >= MEMBERS_EVERY_S:
            members = await self._read_members(group) or members  # None: keep the last count
            self._members[group] = (now, members)
        return members

    async def _read_members(self, group: str) -> int | None:
        if not self._describe_works:
            return 1
        try:
            responses = await self._admin.describe_consumer_groups(
                [group], group_coordinator_id=self._coordinators.get(group, (0.0, None))[1]
            )
        except Exception as exc:  # a broker without DescribeGroups: assume one worker
            log.info("cannot describe the consumer group: %s", exc, extra={"group": group})
            self._describe_works = False
            return 1
        # raw DescribeGroups responses: groups are (error, id, state, type, protocol, members)
        groups = [g for r in responses for g in r.groups]
        if any(g[0] in NOT_COORDINATOR_ERRORS for g in groups):
            self._coordinators.pop(group, None)  # asked the wrong broker: find it again
            return None
        return max(1, sum(len(g[5]) for g in groups))

    async def close(self) -> None:
        if self._started:
            await self._admin.close()
