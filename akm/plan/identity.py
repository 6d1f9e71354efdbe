"""Unit identity and the reuse key.

Unit ids are content-derived so that a fan-out item keeps its id when the list
is reordered; the input hash decides whether a journaled result may be reused.
Both are part of the durable contract: changing them silently would make every
existing run re-dispatch (or diverge). Golden vectors live in
tests/test_identity.py; bump `UNIT_HASH_VERSION` if the preimage must change, and keep
computing the older preimage for runs created with it (`preimage_version`).
"""

from __future__ import annotations

from typing import Any

from akm.canonical import _sha256, canonical_hash, canonical_json, sha256_hex
from akm.plan.model import UNIT_HASH_VERSION, UnitNode

_NO_ITEM = object()
_OPENSSL_WORTH_BYTES = 1 << 20


def solo_unit_id(step_id: str) -> str:
    return f"{step_id}:solo"


def item_unit_id(template_id: str, item: Any, item_json: str | None = None) -> str:
    """`<step>.unit:<first 12 hex of sha256(canonical item)>` (`item_json`: its canonical JSON, if known)."""
    return f"{template_id}:{sha256_hex(canonical_json(item) if item_json is None else item_json)[:12]}"


def journal_base_id(unit_id: str, gate_loop: int) -> str:
    """Loop 1 journals under the unit id; later gate loops add `~l<n>`."""
    return unit_id if gate_loop <= 1 else f"{unit_id}~l{gate_loop}"


def attempt_id(base_id: str, retry: int) -> str:
    """Attempt 0 is the base id; retry k adds `~r<k>`."""
    return base_id if retry <= 0 else f"{base_id}~r{retry}"


def gate_row_id(step_id: str, gate_loop: int) -> str:
    return f"{step_id}.gate:l{gate_loop}"


def base_of_attempt(attempt: str) -> str:
    """Strip one trailing `~r<digits>`; the inverse of `attempt_id`."""
    head, sep, tail = attempt.rpartition("~r")
    return head if sep and tail.isdigit() and tail.isascii() else attempt


def preimage_version(stored: int) -> int:
    """The preimage a run's stored `hash_version` selects: 5, or 4 for anything older.

    A run keeps the version it was created with (D2), so a run journaled by an akm that hashed v4
    keeps reusing its completed units here. No akm ever wrote a version below 4; such a value (test
    fixtures write 1) reads as 4, which is what every version of akm computed for it until v5. A
    version above this akm's is refused before a run is driven (`engine.state.load_run`).
    """
    if stored > UNIT_HASH_VERSION:
        raise ValueError(f"unit hash version {stored} is newer than this akm's ({UNIT_HASH_VERSION})")
    return 4 if stored <= 4 else stored


def _shared_fields(
    template: UnitNode,
    params: dict[str, Any],
    inputs: list[tuple[str, Any]] | None,
    dispatch: Any,
    gate_feedback: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every field of the preimage except `hashVersion` and `item`: what all units of a step share."""
    fields: dict[str, Any] = {
        "template": template.instructions,
        "inputs": [{"reference": ref, "value": value} for ref, value in (inputs or [])],
        "params": params,
        "dispatch": None if template.exec is not None else dispatch,
        "invocation": (
            None if template.invocation is None else template.invocation.model_dump(mode="json", by_alias=True)
        ),
        "schema": template.output_schema,
        "env": template.env,
        "isolation": template.isolation,
    }
    if template.exec is not None:
        fields["exec"] = template.exec.model_dump(mode="json", by_alias=True)
    if gate_feedback:
        fields["gateFeedback"] = gate_feedback
    return fields


def unit_input_hash(
    *,
    template: UnitNode,
    params: dict[str, Any],
    item: Any = _NO_ITEM,
    inputs: list[tuple[str, Any]] | None = None,
    dispatch: Any = None,
    gate_feedback: dict[str, Any] | None = None,
    hash_version: int = UNIT_HASH_VERSION,
) -> str:
    """SHA-256 of the canonical preimage of `hash_version` (see `preimage_version`).

    v4: the canonical JSON of every field, the item among them. v5: of `{hashVersion: 5, item,
    shared}`, where `shared` is the SHA-256 hex of the canonical JSON of every other field — the same
    identity (any field that changes changes the hash), but a fan-out hashes its params once per step
    instead of once per unit.

    Excluded on purpose: retry, on_error, the prompt wording, ids, the directory
    akm runs in, config and secret values — none of them change what the unit is
    asked to do. (An exec unit's own `cwd` is part of its exec spec, so it counts.)
    """
    version = preimage_version(hash_version)
    fields = _shared_fields(template, params, inputs, dispatch, gate_feedback)
    value = None if item is _NO_ITEM else item
    if version == 4:
        return canonical_hash({"hashVersion": 4, "item": value, **fields})
    return canonical_hash({"hashVersion": version, "item": value, "shared": canonical_hash(fields)})


class UnitHasher:
    """`unit_input_hash` for many items of one step, serialising the shared parts once.

    v5 (a new run): the shared digest is computed here, once; per unit only the item and
    ~100 bytes are hashed. v4 (a run created before v5): a fan-out over N items with params
    of size P would canonicalise the params N times (O(N·P)); here only the item is serialised
    per unit, though each unit still hashes the whole preimage. The text is assembled in
    sorted-key order, so it is byte-identical to the canonical JSON of the full preimage
    (tests check both agree).
    """

    def __init__(
        self,
        *,
        template: UnitNode,
        params: dict[str, Any],
        inputs: list[tuple[str, Any]] | None = None,
        dispatch: Any = None,
        gate_feedback: dict[str, Any] | None = None,
        units: int = 1,
        hash_version: int = UNIT_HASH_VERSION,
    ) -> None:
        """`units`: how many hashes are coming (for v4 it picks the digest implementation, see below)."""
        self.version = preimage_version(hash_version)
        if self.version != 4:
            shared = canonical_hash(_shared_fields(template, params, inputs, dispatch, gate_feedback))
            # canonical JSON of {"hashVersion", "item", "shared"}: the keys in sorted order
            self._prefix = f'{{"hashVersion":{self.version},"item":'
            self._suffix = f',"shared":"{shared}"}}'
            return
        cj = canonical_json
        invocation = None if template.invocation is None else template.invocation.model_dump(mode="json", by_alias=True)
        head = [
            '{"dispatch":' + cj(None if template.exec is not None else dispatch),
            ',"env":' + cj(template.env),
        ]
        if template.exec is not None:
            head.append(',"exec":' + cj(template.exec.model_dump(mode="json", by_alias=True)))
        if gate_feedback:
            head.append(',"gateFeedback":' + cj(gate_feedback))
        head.append(',"hashVersion":4')
        head.append(',"inputs":' + cj([{"reference": r, "value": v} for r, v in (inputs or [])]))
        head.append(',"invocation":' + cj(invocation))
        head.append(',"isolation":' + cj(template.isolation))
        head.append(',"item":')
        # The digest state after the head is kept, and the tail (which holds the params, often the
        # bulk of the preimage) is encoded once: per unit only the item is new text.
        tail = (
            ',"params":'
            + cj(params)
            + ',"schema":'
            + cj(template.output_schema)
            + ',"template":'
            + cj(template.instructions)
            + "}"
        ).encode("utf-8")
        sha256 = _sha256
        if units * len(tail) > _OPENSSL_WORTH_BYTES:
            # A fan-out whose params hold its list hashes them once per unit: OpenSSL's SHA-256 is ~5x
            # the builtin module's, which pays for loading it (~3 ms) past about a megabyte in all.
            import hashlib

            sha256 = hashlib.sha256
        self._head = sha256("".join(head).encode("utf-8"))
        self._tail = tail

    def hash(self, item: Any = _NO_ITEM, item_json: str | None = None) -> str:
        """`item_json` may carry the item's canonical JSON when the caller already has it."""
        if item_json is None:
            item_json = "null" if item is _NO_ITEM else canonical_json(item)
        if self.version != 4:
            return _sha256(f"{self._prefix}{item_json}{self._suffix}".encode()).hexdigest()
        digest = self._head.copy()
        digest.update(item_json.encode("utf-8"))
        digest.update(self._tail)
        return digest.hexdigest()


NO_ITEM = _NO_ITEM
