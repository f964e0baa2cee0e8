"""One forward pass: the model runner, the batch it packs, KV memory pools, attention backends."""
