"""Code used by more than one batchstream service: settings, message schemas, clients."""
