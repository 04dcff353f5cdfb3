"""Checks a parsed topology document against the schema (kbtorch/topology/schema.py).

The walk follows the schema, never the document, so its depth is the schema's: a document
nested a thousand levels deep is refused at the first level that expects something else.
"""
from __future__ import annotations

import hashlib
import json
import math

from .errors import TopologyError, did_you_mean
from .schema import MAX_NUMBER, TOP, Map, Record, Seq, Value, Variant


#: Digests of the documents that passed (a process checks each content once: a sweep's driver
#: and the machines it builds for its points share one check per topology + overrides).
_PASSED: set = set()


def content_digest(doc: dict) -> str | None:
    """sha256 of ``doc`` as canonical JSON (sorted keys): what a machine IS, whatever its
    file's name or mtime; None for a document too deep or odd to serialise (never valid)."""
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    except (RecursionError, ValueError, TypeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def validate(doc: dict, path: str) -> None:
    """Raise TopologyError naming the file and the entry at the first value the schema refuses
    (a document of a content already checked in this process passes at once)."""
    digest = content_digest(doc)
    if digest is not None and digest in _PASSED:
        return
    _Checker(path).check(doc, TOP, "")
    if digest is not None:
        _PASSED.add(digest)


def show(value) -> str:
    """A short description of ``value`` for a message: never a deep or unbounded repr."""
    if isinstance(value, dict):
        return f"a table of {len(value)} keys"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return f"a list of {len(value)} items"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {len(str(abs(value)))} digits" if value.bit_length() < 10_000 else "a huge integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(value) -> str:
    big = isinstance(value, (int, float)) and not isinstance(value, bool) and MAX_NUMBER < abs(value) < math.inf
    return f" (numbers are limited to {MAX_NUMBER:g} in size)" if big else ""


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


class _Checker:
    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, message: str):
        raise TopologyError(self.path, where or "top level", message)

    def check(self, value, schema, where: str) -> None:
        if isinstance(schema, Value):
            if not schema.test(value):
                self.fail(where, f"expected {schema.words}, got {show(value)}{_hint(value)}")
        elif isinstance(schema, Record):
            self.record(value, schema.fields, schema, where)
        elif isinstance(schema, Variant):
            self.variant(value, schema, where)
        elif isinstance(schema, Map):
            self.map(value, schema, where)
        else:
            self.seq(value, schema, where)

    def table(self, value, where: str) -> None:
        if not isinstance(value, dict):
            self.fail(where, f"expected a table, got {show(value)}")

    def record(self, value, fields: dict, rules: Record, where: str) -> None:
        self.table(value, where)
        for key in value:
            if key not in fields:
                known = ", ".join(fields) or "none"
                self.fail(_join(where, key), f"unknown key{did_you_mean(key, fields)}; known keys: {known}")
        for key, spec in fields.items():
            if key in value:
                self.check(value[key], spec.schema, _join(where, key))
            elif spec.required:
                self.fail(where, f"missing field '{key}'")
        for group in rules.one_of:
            present = [k for k in group if k in value]
            if len(present) != 1:
                self.fail(where, f"needs exactly one of {', '.join(group)}, got {', '.join(present) or 'none'}")
        for small, big in rules.less:
            if small in value and big in value and not value[small] < value[big]:
                self.fail(_join(where, small), f"must be less than {big} ({value[big]}), got {value[small]}")

    def variant(self, value, schema: Variant, where: str) -> None:
        self.table(value, where)
        if schema.tag not in value:
            self.fail(where, f"missing field '{schema.tag}'")
        tag = value[schema.tag]
        if not isinstance(tag, str) or tag not in schema.kinds:
            known = ", ".join(sorted(schema.kinds))
            self.fail(_join(where, schema.tag),
                      f"unknown {schema.tag} {show(tag)}{did_you_mean(tag, schema.kinds)}; known: {known}")
        rules = schema.kinds[tag]
        self.record(value, {**schema.common, **rules.fields}, rules, where)

    def map(self, value, schema: Map, where: str) -> None:
        self.table(value, where)
        if schema.non_empty and not value:
            self.fail(where, "must not be empty")
        for key, item in value.items():
            if schema.key is not None and not schema.key.test(key):
                self.fail(_join(where, key), f"expected {schema.key.words} as the name, got {show(key)}")
            self.check(item, schema.value, _join(where, key))

    def seq(self, value, schema: Seq, where: str) -> None:
        if not isinstance(value, list):
            self.fail(where, f"expected a list, got {show(value)}")
        for i, item in enumerate(value):
            self.check(item, schema.item, f"{where}[{i}]")
