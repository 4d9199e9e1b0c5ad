"""On-demand benchmarks (`make bench`, or `python -m bench --help`); never part of `make test`."""
