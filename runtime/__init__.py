"""The serving runtime. Layers from the top: server/ -> the engine (engine.py) -> scheduler/ ->
executor/ -> models/, with sampling/ and constrained/ beside them; docs/ARCHITECTURE.md."""
