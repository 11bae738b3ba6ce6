"""Tests that need a real NVIDIA GPU (``pytest -m gpu``); skipped without one."""
