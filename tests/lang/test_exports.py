"""The DSL's public names are importable from `stemma` itself (import rules live in
tests/test_import_rules.py)."""

from __future__ import annotations


def test_public_names_are_exported_from_stemma():
    import stemma
    import stemma.lang

    for name in ("function", "gen", "select", "fork", "RuntimeEndpoint", "set_default_backend"):
        assert name in stemma.lang.__all__
        assert getattr(stemma, name) is getattr(stemma.lang, name)
