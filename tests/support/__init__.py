"""Code the tests share, each piece defined once here; fixtures stay in the conftest.py files.

- ``waiting``: ``wait_until`` / ``eventually`` (poll a check), ``TERMINAL``, ``wait_status`` /
  ``wait_terminal`` (poll a batch through the api; ``*_async`` with an async client) and
  ``wait_stored_status`` (its document in MongoDB).
- ``lines``: request lines as the Batch API takes them (``request_line``, ``chat_request``,
  ``chat_line``, ``jsonl``) and result files read back (``parse_jsonl``, ``read_lines``,
  ``read_lines_async``).
- ``http_batches``: files and batches over plain HTTP (httpx): ``upload``, ``create``,
  ``create_batch``, ``wait_http_terminal`` and ``assert_error`` (OpenAI's error body).
- ``stacks``: the session stack's model (``session_model``), a stack of a module's own on the
  session's stand-ins (``own_stack``, handed out by the fixture as ``OwnStack``),
  ``aggregator_processing`` and ``FAKE_STACK_ENV`` (a fake-engine stack's settings).
- ``real_servers``: the session's servers, the stand-ins or (``BATCHSTREAM_TEST_SERVERS``)
  testcontainers, and the stand-ins' Kafka broker (``BATCHSTREAM_TEST_BROKER``:
  ``requested_broker``).
- ``object_stores``: the session's S3 server, SeaweedFS or (``BATCHSTREAM_TEST_OBJECT_STORE``)
  a JuiceFS gateway, and ``juicefs_gateway`` (one of a caller's own).
- ``fresh_kafka``: Kafka settings under a topic prefix of a test's own, the topics created.
- ``fresh_mongo``: a MongoDB database of a test module's own, dropped afterwards.
- ``metrics``: one value from a Prometheus ``/metrics`` page (``metric_value``).
- ``private_servers``: a SecantusDB (``PrivateMongo``) or a broker (``private_broker``) of a
  test's own, to kill, restart or proxy.
- ``request_recorder``: ``RequestRecorder``, a stand-in for a model's workers that consumes and
  commits its requests topic and records the order the dispatcher sent lines in.
- ``fakes``: ``FakeClock`` and ``FakeResultsView`` for unit tests.

The modules the unit tests import (``waiting``, ``fakes``, ``real_servers``, ``object_stores``)
need no running server and import testcontainers only when the real servers are asked for:
``tests/unit`` runs without the stand-ins.
"""
