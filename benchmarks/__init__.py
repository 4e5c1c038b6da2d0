"""Benchmarks: run with ``python -m benchmarks.<name>`` (see ``benchmarks/README.md``)."""
