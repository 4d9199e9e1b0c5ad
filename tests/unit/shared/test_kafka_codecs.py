"""The producer's partitioner and the message decoder are faster, never different."""

from __future__ import annotations

import json
import random

import pytest
from aiokafka.partitioner import DefaultPartitioner

from shared.kafka import CachedPartitioner, decode


def test_the_cached_partitioner_picks_the_default_partition_for_every_key() -> None:
    cached, default = CachedPartitioner(max_keys=50), DefaultPartitioner()
    rng = random.Random(7)
    for _ in range(3):  # hashed, remembered, then hashed again after the cache was cleared
        for count in (1, 3, 12):
            partitions = list(range(count))
            for n in range(200):
                key = f"batch_{n:05d}".encode() if n % 2 else rng.randbytes(rng.randint(0, 40))
                assert cached(key, partitions, partitions) == default(key, partitions, partitions)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "b": [1.5, "x\\u00e9"], "c": null}',
        b'{"big": 123456789012345678901234567890}',  # over 64 bits: stays an integer
        b'{"nan": NaN}',
        b'{"lone": "\\ud800"}',
    ],
)
def test_decode_reads_what_json_reads(raw: bytes) -> None:
    assert repr(decode(raw)) == repr(json.loads(raw))


@pytest.mark.parametrize("raw", [b"[1]", b"null", None, b"not json"])
def test_decode_refuses_what_is_not_an_object(raw: bytes | None) -> None:
    with pytest.raises(ValueError):
        decode(raw)
