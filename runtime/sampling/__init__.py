"""Sampling parameters and the batched sampler (penalties, masks, logprobs)."""
