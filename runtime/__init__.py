"""The serving runtime: engine, scheduler, memory pools, model, loader, sampler, grammar."""
