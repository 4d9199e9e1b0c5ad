"""``python -m services.client`` is the ``batchstream`` command."""

from services.client.cli import main

main()
