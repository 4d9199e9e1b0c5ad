"""Fuzzing the HTTP API from its own OpenAPI document (schemathesis, on hypothesis).

Every operation in ``/openapi.json`` gets generated requests, valid and invalid, against a running
api (its own stack: the api alone, no worker; the stand-in Kafka, MongoDB and S3). Each answer must
not be a 5xx, and its status, content type and body must be ones the document declares for that
operation. Bounded to fit in ``make test``: ``BATCHSTREAM_FUZZ_EXAMPLES`` examples per operation
(default 25); raise it to fuzz longer, e.g. ``BATCHSTREAM_FUZZ_EXAMPLES=500``. A failure prints
the request that reproduces it (hypothesis shrinks it first).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from deploy.local.stack import Stack
from services.api.app import create_app
from tests.support.stacks import OwnStack

pytestmark = pytest.mark.e2e
EXAMPLES = int(os.environ.get("BATCHSTREAM_FUZZ_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


STATUSES: Counter[int] = Counter()


@pytest.fixture(scope="module")
def fuzz_stack(own_stack: OwnStack) -> Iterator[Stack]:
    with own_stack("fuzz", ["api"]) as stack:
        started = time.monotonic()
        yield stack
        took = time.monotonic() - started
        print(
            f"\nfuzz: {STATUSES.total()} requests in {took:.0f}s, by status {dict(sorted(STATUSES.items()))}"
        )


# The document the app serves at /openapi.json, built in-process at collection time (the test
# below checks the running api serves the same); schemathesis' fixture-based loader does not work
# with pytest 9.
schema = schemathesis.openapi.from_dict(create_app().openapi())


def test_the_api_serves_the_document_the_fuzz_uses(fuzz_stack: Stack) -> None:
    served = httpx.get(f"{fuzz_stack.base_url.removesuffix('/v1')}/openapi.json", timeout=30)
    assert served.json() == create_app().openapi()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
    print_blob=True,
)
def test_every_answer_is_declared_and_none_is_a_5xx(case: schemathesis.Case, fuzz_stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {fuzz_stack.api_key}"}
    base = fuzz_stack.base_url.removesuffix("/v1")
    response = case.call_and_validate(base_url=base, headers=headers, checks=CHECKS, timeout=30)
    STATUSES[response.status_code] += 1
