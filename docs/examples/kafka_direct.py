"""Run a JSONL file of requests through Kafka directly, without the HTTP api, and print the results.

    BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 \\
        python docs/examples/kafka_direct.py requests.jsonl --model gemma-3-270m --reply-topic my-replies

Each line of the file is an input-file line (``custom_id``, ``method``, ``url``, ``body``). The
script publishes every line to the model's requests topic naming ``--reply-topic``, then prints one
output line per request (the same JSON a batch's output or error file holds) as results arrive.
It exits 0 when every request succeeded, 1 when some failed. Needs ``batchstream[service]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from shared.kafka_client import KafkaRequestClient


async def run(path: Path, model: str, reply_topic: str, timeout_s: float) -> int:
    failed = 0
    async with KafkaRequestClient(model=model, reply_topic=reply_topic) as kafka:
        with path.open() as lines:
            for line in lines:
                if line.strip():
                    await kafka.publish(json.loads(line))
        async for result in kafka.results(timeout_s=timeout_s):
            failed += not result.succeeded
            print(json.dumps(result.output_line()), flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input", type=Path, help="a JSONL file of request lines")
    parser.add_argument("--model", required=True, help="the served model: requests go to requests.<model>")
    parser.add_argument("--reply-topic", required=True, help="where the workers publish the results")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for all results")
    args = parser.parse_args()
    return asyncio.run(run(args.input, args.model, args.reply_topic, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
