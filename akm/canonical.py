"""Canonical JSON and hashing (spec/decisions.md D2).

canonical(v) = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
after normalising numbers: a float with an integral value (YAML `2.0`) is written
as the integer `2`, so the same authored value always hashes the same way.
Non-finite numbers and non-JSON types are refused. Plan hashes and unit input
hashes are built on this function and must never change silently
(tests/test_identity.py holds the golden vectors).
"""

from __future__ import annotations

try:  # the builtin module: `hashlib` loads OpenSSL (~3 ms of every start) for a few small digests
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - an interpreter built without it
    from hashlib import sha256 as _sha256
import json
import math
from json.encoder import encode_basestring as _encode_str
from typing import Any

MAX_DEPTH = 64


class CanonicalError(ValueError):
    """The value cannot be represented as canonical JSON."""


def normalize(value: Any, _depth: int = 0) -> Any:
    """Return a JSON-ready copy: integral floats become ints, tuples become lists."""
    if _depth > MAX_DEPTH:
        raise CanonicalError(f"value nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalError("non-finite number")
        if value.is_integer() and abs(value) < 1e21:
            return int(value)
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CanonicalError(f"object key {k!r} is not a string")
            out[k] = normalize(v, _depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(v, _depth + 1) for v in value]
    raise CanonicalError(f"{type(value).__name__} is not a JSON value")


# One encoder each, built once: `json.dumps` with options builds a new encoder per call,
# and these run several times per dispatched unit.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, raw UTF-8, normalised numbers."""
    kind = type(value)
    # A string or an int (a fan-out's usual item) is its encoder's text: skip the copy and the encoder's
    # set-up, ~1 us of every unit of a large fan-out (tests/test_identity.py checks they agree).
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    return _CANONICAL.encode(normalize(value))


def compact_json(value: Any) -> str:
    """Insertion-order compact JSON for prompts, params_json and evidence."""
    return _COMPACT.encode(value)


def sha256_hex(text: str) -> str:
    return _sha256(text.encode("utf-8")).hexdigest()


def canonical_hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def json_object(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else {}: for reading JSON whose shape is not ours to trust (a harness's
    output, a stored record), so a missing or odd field reads as empty instead of raising."""
    return value if isinstance(value, dict) else {}


def json_array(value: Any) -> list[Any]:
    """`value` if it is a JSON array, else [] (see `json_object`)."""
    return value if isinstance(value, list) else []
