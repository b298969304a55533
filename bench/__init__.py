"""Conveyor's benchmarks (see bench/README.md). Run the scripts as modules: `python -m bench.ingest`."""
