"""Per-project quotas: the operator's limits (``settings.py``), their arithmetic (``limits.py``)
and the checks the api runs at upload, create and validation, and the usage view (``service.py``)."""
