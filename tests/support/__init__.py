"""Helpers every test shares: waiting on a condition, building and reading JSONL lines, metrics.

- ``waiting``: ``wait_until`` / ``eventually`` (poll a check), ``wait_terminal`` / ``wait_status``
  (poll a batch through the api).
- ``lines``: request lines as the Batch API takes them (``request_line``, ``chat_request``,
  ``chat_line``, ``jsonl``) and result files read back (``parse_jsonl``, ``read_lines``).
- ``fresh_kafka``: Kafka settings under a topic prefix of a test's own, the topics created.
- ``fresh_mongo``: a MongoDB database of a test module's own, dropped afterwards.
- ``http_batches``: ``create_batch``, upload and create a batch over plain HTTP (httpx).
- ``metrics``: one value from a Prometheus ``/metrics`` page (``metric_value``).
- ``private_servers``: a SecantusDB (``PrivateMongo``) or a Tansu broker (``private_tansu``) of a
  test's own, to kill, restart or proxy.
- ``request_recorder``: ``RequestRecorder``, a stand-in for a model's workers that consumes and
  commits its requests topic and records the order the dispatcher sent lines in.
"""
