"""Benchmarks of the supervisor: ``python -m tests.benchmarks.run`` (not part of the test suite)."""
