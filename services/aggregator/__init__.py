"""The aggregator: counts each result line once, writes result chunks, finalizes batches."""
