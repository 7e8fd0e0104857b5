"""Helm values in the tests."""

from __future__ import annotations


def merge(*parts: dict) -> dict:
    """Deep merge of values dicts (later wins), as Helm merges ``-f`` files."""
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
