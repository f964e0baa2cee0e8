"""Continuous batching: which requests run each step, their KV slots, and their outputs."""
