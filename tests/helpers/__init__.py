"""Shared, importable test helpers (reference implementations, test-audio makers)."""
