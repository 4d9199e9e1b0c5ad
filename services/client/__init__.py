"""The batchstream client: the ``batchstream`` command and the one-call helper ``run_batch``.

It talks to the api over HTTP through the unmodified ``openai`` SDK only (so it works against
OpenAI too) and imports nothing from ``services.api``; ``pip install 'batchstream[client]'``
installs what it needs. ``batchstream keys`` is the exception: it writes the key store in MongoDB
(``shared.api_keys``) and needs the api extra.
"""
