"""batchstream's services: api, inference and aggregator, each its own process."""
