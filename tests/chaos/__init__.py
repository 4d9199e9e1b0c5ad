"""Fault-injection trials (``trials.py``); ``python -m tests.chaos`` runs many (``make chaos``)."""
