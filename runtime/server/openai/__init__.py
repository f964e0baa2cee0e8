"""The OpenAI-compatible API at /v1: chat and text completions, streaming, tools."""
