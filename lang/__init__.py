"""The stemma DSL: programs, interpreter and backends (standard library only)."""

__all__: list[str] = []
