"""Scrub secret values out of everything a dispatcher hands back (spec/engine.md).

Why: a unit's output, error text and structured result are journaled, shown by
`status` and copied into evidence and later prompts. Values that came from `env:`
bindings are secrets by definition, and a command that echoes one (on purpose or
in a stack trace) must not leak it into any of those places. Redaction is a plain
substring scrub against a known set of values — no pattern guessing — applied by
the dispatcher before anything leaves it.

Values shorter than `MIN_SECRET_LENGTH` are ignored: replacing every "1" or "yes"
in an artifact would destroy the output while protecting nothing worth the name.

What the set holds for a value, and what it does not (spec/engine.md "Secrets" is the user-facing list):
its URL-encoded and decoded, JSON-escaped (once and twice), LF/CRLF and line-by-line spellings, URL
credentials, its Unicode NFC and NFD forms (a tool that normalises text prints the other one), and the
whole value base64-encoded (standard and URL-safe alphabets, with and without padding, also with the
newline `echo` adds) and hex-encoded (lower and upper case) — the spellings `base64`, `xxd -p` and
`.hex()` give a secret printed whole. Not redacted, because no fixed set of substrings can hold them: the
base64 of a secret inside a longer encoded blob (its characters depend on where it falls), hex dumps with
separators or offsets (`xxd`, `od`), and a secret split across two lines (a terminal or `fold` wrapping
it), except that each line of 8 or more characters of a multi-line secret is redacted by itself.
"""

from __future__ import annotations

import base64
import json
import re
import unicodedata
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlsplit

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 4
ELLIPSIS = "…"

# Query/fragment parameter names (lower-case, non-alphanumerics dropped) whose
# values are credentials even inside an otherwise harmless URL.
_CREDENTIAL_PARAM_KEYS = frozenset(
    {
        "token",
        "accesstoken",
        "apikey",
        "key",
        "secret",
        "password",
        "passwd",
        "pwd",
        "signature",
        "sig",
        "code",
        "state",
        "nonce",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "clientsecret",
        "refreshtoken",
        "idtoken",
        "sessiontoken",
        "xamzsignature",
        "xamzcredential",
        "xamzsecuritytoken",
        "xgoogsignature",
        "xgoogcredential",
    }
)


def clip(text: str, n: int) -> str:
    """First `n` characters of `text`, plus "…" when anything was cut.

    Used for diagnostics stored in the journal; clipping must happen AFTER
    redaction, otherwise a secret cut in half would survive as a fragment.
    """
    if n < 0:
        n = 0
    if len(text) <= n:
        return text
    return text[:n] + ELLIPSIS


def _effective_values(sensitive_values: Iterable[str]) -> list[str]:
    """Unique values long enough to scrub, longest first."""
    seen: set[str] = set()
    out: list[str] = []
    for v in sensitive_values:
        if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH and v not in seen:
            seen.add(v)
            out.append(v)
    out.sort(key=len, reverse=True)
    return out


def redact_text(
    text: str, sensitive_values: Iterable[str], *, cut_before: bool = False, cut_after: bool = False
) -> str:
    """Replace every occurrence of every sensitive value with `[REDACTED]`.

    All occurrences of all values are located on the ORIGINAL text first
    (overlapping ones included) and overlapping spans are merged, so two secrets
    that share characters never leave a fragment of either behind — a naive
    sequential `str.replace` would leak the tail of the second one.

    `cut_after` / `cut_before` say the text is a piece of a longer stream that
    was cut at its end / start (a capture cap, a kept tail). A secret straddling
    the cut is only partly here, so no whole occurrence matches; the part that
    is here — the longest end of the text that begins some secret, or the
    longest start that ends one — is redacted too. That may hide a few innocent
    characters right at a cut; it never leaves the first (or last) characters of
    a secret readable.
    """
    if not text:
        return text
    values = _effective_values(sensitive_values)
    if not values:
        return text
    spans: list[tuple[int, int]] = []
    for v in values:
        start = text.find(v)
        while start != -1:
            spans.append((start, start + len(v)))
            start = text.find(v, start + 1)
    if cut_after:
        k = _longest_partial(text, values, at_end=True)
        if k:
            spans.append((len(text) - k, len(text)))
    if cut_before:
        k = _longest_partial(text, values, at_end=False)
        if k:
            spans.append((0, k))
    if not spans:
        return text
    spans.sort()
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s < merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1][1] = e
        else:
            merged.append([s, e])
    parts: list[str] = []
    pos = 0
    for s, e in merged:
        parts.append(text[pos:s])
        parts.append(REDACTED)
        pos = e
    parts.append(text[pos:])
    return "".join(parts)


def _longest_partial(text: str, values: list[str], *, at_end: bool) -> int:
    """Length of the longest proper prefix of a value ending `text` (at_end), or suffix starting it."""
    best = 0
    for v in values:
        for k in range(min(len(v) - 1, len(text)), best, -1):
            if text.endswith(v[:k]) if at_end else text.startswith(v[len(v) - k :]):
                best = k
                break
    return best


def redact_value(obj: Any, sensitive_values: Iterable[str]) -> Any:
    """Return a copy of a JSON value with every string leaf AND object key redacted.

    Keys matter: a command can emit `{"<secret>": true}` just as easily as a value.
    Non-string scalars are returned unchanged.
    """
    values = _effective_values(sensitive_values)
    if not values:
        return obj
    return _walk(obj, values)


def _walk(obj: Any, values: list[str]) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, values)
    if isinstance(obj, Mapping):
        return {(redact_text(k, values) if isinstance(k, str) else k): _walk(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_walk(v, values) for v in obj]
    return obj


def _normalize_param_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


def _encoded_variants(value: str) -> list[str]:
    """The value plus the spellings it takes when echoed inside a URL."""
    variants = [value, unquote(value), unquote_plus(value), quote(value, safe=""), quote_plus(value, safe="")]
    # lower-case hex escapes (`%2f` instead of `%2F`)
    variants.extend(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), v) for v in list(variants))
    return variants


def _url_credential_parts(value: str) -> list[str]:
    """Userinfo and credential-named query/fragment values of a URL-shaped value."""
    text = value.strip()
    if "://" not in text:
        return []
    try:
        parts = urlsplit(text)
    except ValueError:
        return []
    found: list[str] = []
    if parts.netloc and "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        user, _, password = userinfo.partition(":")
        found.extend(p for p in (user, password) if p)
        found.append(userinfo)
    for section in (parts.query, parts.fragment):
        if section:
            found.extend(_credential_params(section))
    return found


def _credential_params(section: str) -> list[str]:
    """The values of credential-named parameters in a query or fragment: as written (split on `&` and `;`),
    then as `parse_qsl` decodes them."""
    found: list[str] = []
    for raw_pair in re.split(r"[&;]", section):
        k, sep, v = raw_pair.partition("=")
        if sep and v and _normalize_param_key(unquote_plus(k)) in _CREDENTIAL_PARAM_KEYS:
            found.append(v)
    for k, v in parse_qsl(section, keep_blank_values=False):
        if v and _normalize_param_key(k) in _CREDENTIAL_PARAM_KEYS:
            found.append(v)
    return found


def sensitive_values_from(bindings: Mapping[str, str] | Iterable[str]) -> list[str]:
    """The redaction set for resolved `env:` bindings (names are not secret, values are).

    Each non-empty value is added as-is and trimmed, plus its URL-encoded and
    decoded spellings; a URL-shaped value also contributes its userinfo and any
    credential-named query/fragment parameters, so a tool that logs the "safe"
    parts of a connection string still cannot print the password. Short entries
    stay in the list; `redact_text` decides what is long enough to scrub.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(v: str) -> None:
        if v and v not in seen:
            seen.add(v)
            out.append(v)

    for value in bindings.values() if isinstance(bindings, Mapping) else bindings:
        if not isinstance(value, str) or not value:
            continue
        for encoded in _encoded_whole(value):
            add(encoded)
        candidates = [value, value.strip()] + _url_credential_parts(value)
        candidates += [unicodedata.normalize(form, value) for form in ("NFC", "NFD")]
        for c in _line_end_spellings(value):
            # A multi-line secret as LF and as CRLF (a file or tool of the other convention), and each long
            # line by itself (a PEM key printed line by line); each also JSON-escaped twice (a JSON string
            # inside a JSON string: `\\n`, `\\\"`).
            candidates.append(c)
            for twice_escaped in (
                json.dumps(json.dumps(c)[1:-1])[1:-1],
                json.dumps(json.dumps(c, ensure_ascii=False)[1:-1], ensure_ascii=False)[1:-1],
            ):
                add(twice_escaped)
        for c in candidates:
            for variant in _encoded_variants(c):
                add(variant)
                # the spellings a JSON encoder gives it (`\u00e4`, `\"`), as in raw JSON stdout
                add(json.dumps(variant)[1:-1])
                add(json.dumps(variant, ensure_ascii=False)[1:-1])
    return out


def _encoded_whole(value: str) -> list[str]:
    """The value printed whole as base64 (both alphabets, padded or not, with `echo`'s newline or without) and
    as hex (both cases): what `base64`, `xxd -p` or `.hex()` print of it. Valid only for the value as a whole
    (see the module doc)."""
    out: list[str] = []
    for raw in {value.strip().encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass")}:
        for data in (raw, raw + b"\n"):
            for enc in (base64.b64encode(data).decode("ascii"), base64.urlsafe_b64encode(data).decode("ascii")):
                out += [enc, enc.rstrip("=")]
        out += [raw.hex(), raw.hex().upper()]
    return list(dict.fromkeys(x for x in out if x))


_LONG_LINE = 8  # a line of a multi-line secret redacted on its own from this length (`-----END` lines too)


def _line_end_spellings(value: str) -> list[str]:
    """`value` with LF and with CRLF line ends, and its long lines, when it spans lines."""
    if "\n" not in value and "\r" not in value:
        return [value]
    lf = value.replace("\r\n", "\n").replace("\r", "\n")
    spellings = [value, lf, lf.replace("\n", "\r\n")]
    spellings += [line.strip() for line in lf.split("\n") if len(line.strip()) >= _LONG_LINE]
    return list(dict.fromkeys(spellings))
