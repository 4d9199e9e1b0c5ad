"""``python -m services.api.keys create --project NAME`` prints a new key (shown once) and stores its hash."""

from __future__ import annotations

import argparse
import asyncio

from services.api.service.keys import KeyRing
from shared.mongo import Mongo
from shared.settings import MongoSettings


async def _run(args: argparse.Namespace) -> None:
    mongo = Mongo(MongoSettings())
    try:
        ring = KeyRing(mongo, {})
        if args.command == "create":
            print(await ring.create(args.project))
        elif not await ring.revoke(args.key):
            raise SystemExit("no such key")
    finally:
        await mongo.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.api.keys")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a key for a project and print it")
    create.add_argument("--project", required=True)
    revoke = sub.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
