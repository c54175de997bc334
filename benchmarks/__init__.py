"""Benchmarks of subagent-control: run them all with ``python -m benchmarks``."""
