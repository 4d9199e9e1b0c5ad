"""The collection registry: every collection named once, reached through it alone."""

from __future__ import annotations

import re
from pathlib import Path

from shared import mongo
from shared.mongo import COLLECTIONS, Mongo
from shared.settings import MongoSettings

ROOT = Path(__file__).resolve().parents[3]


def test_every_collection_is_registered_once_and_has_its_property() -> None:
    names = [registered.name for registered in COLLECTIONS]
    assert len(names) == len(set(names))
    client = Mongo(MongoSettings(uri="mongodb://127.0.0.1:1"))
    for name in names:
        assert getattr(client, name).name == name


def test_every_registered_collection_is_in_the_list_ensure_indexes_walks() -> None:
    declared = {value for value in vars(mongo).values() if isinstance(value, mongo.Collection)}
    assert declared == set(COLLECTIONS)


def test_no_code_but_the_registry_names_a_collection_by_its_string() -> None:
    by_name = re.compile(r"""\bdb\[\s*["']""")
    sources = [p for top in ("shared", "services", "deploy", "bench") for p in (ROOT / top).rglob("*.py")]
    found = [str(p.relative_to(ROOT)) for p in sources if by_name.search(p.read_text(encoding="utf-8"))]
    assert found == []
