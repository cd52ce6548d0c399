"""Benchmarks: `make bench` runs every `bench/<name>.py` that defines `main()`."""
