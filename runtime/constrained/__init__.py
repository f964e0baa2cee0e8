"""Constrained decoding: constraint specs, grammar compilation, matchers, jump-forward."""
