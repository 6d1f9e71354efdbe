"""Redaction of secret values (spec-engine §9)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from akm.dispatch.redact import REDACTED, clip, redact_text, redact_value, sensitive_values_from


def test_every_occurrence_is_replaced():
    assert redact_text("a=hunter22 b=hunter22.", ["hunter22"]) == f"a={REDACTED} b={REDACTED}."


def test_longest_value_wins_over_its_prefix():
    # with shortest-first the tail "-long" would survive
    out = redact_text("tok=abcd-long", ["abcd", "abcd-long"])
    assert out == f"tok={REDACTED}"


def test_overlapping_values_leave_no_fragment():
    out = redact_text("xxabcdefyy", ["abcd", "cdef"])
    assert out == f"xx{REDACTED}yy"
    assert "ef" not in out and "ab" not in out


def test_adjacent_occurrences_each_redacted():
    assert redact_text("s3cr3ts3cr3t", ["s3cr3t"]) == REDACTED * 2


def test_short_and_empty_values_are_ignored():
    assert redact_text("yes 1 abc", ["yes", "1", "", "abc"]) == "yes 1 abc"
    assert redact_text("abcd", ["abcd"]) == REDACTED


def test_no_values_or_empty_text_unchanged():
    assert redact_text("plain", []) == "plain"
    assert redact_text("", ["secret"]) == ""


def test_value_containing_redacted_token_does_not_loop():
    assert redact_text("[REDACTED]x", ["[REDACTED]x"]) == REDACTED


def test_redact_value_walks_keys_values_and_lists():
    secret = "p4ssw0rd!"
    obj = {secret: {"k": [f"pre-{secret}", 3, None, True, {"x": secret}]}, "n": 1.5}
    out = redact_value(obj, [secret])
    assert out == {REDACTED: {"k": [f"pre-{REDACTED}", 3, None, True, {"x": REDACTED}]}, "n": 1.5}
    # input untouched
    assert secret in obj


def test_redact_value_scalars():
    assert redact_value("the p4ssw0rd", ["p4ssw0rd"]) == f"the {REDACTED}"
    assert redact_value(42, ["p4ssw0rd"]) == 42
    assert redact_value(None, ["p4ssw0rd"]) is None


def test_sensitive_values_from_binding_values_not_names():
    vals = sensitive_values_from({"API_TOKEN": "  tok-12345  ", "EMPTY": ""})
    assert "  tok-12345  " in vals and "tok-12345" in vals
    assert "API_TOKEN" not in vals
    assert "" not in vals
    assert len(vals) == len(set(vals))


def test_sensitive_values_from_url_credentials():
    url = "postgres://admin:p%40ss-w0rd@db.example.com:5432/app?sslmode=require&api_key=KEY123456"
    vals = sensitive_values_from({"DATABASE_URL": url})
    assert url in vals
    assert "p%40ss-w0rd" in vals and "p@ss-w0rd" in vals
    assert "KEY123456" in vals
    # a log line printing only the decoded password is still scrubbed
    assert redact_text("login failed for p@ss-w0rd", vals) == f"login failed for {REDACTED}"
    # the harmless query parameter is not treated as a secret
    assert "require" not in vals


def test_sensitive_values_from_encoded_spelling():
    vals = sensitive_values_from({"X": "a secret/value"})
    assert redact_text("q=a%20secret%2Fvalue", vals) == f"q={REDACTED}"
    assert redact_text("q=a+secret%2fvalue", vals) == f"q={REDACTED}"


def test_clip():
    assert clip("abcdef", 3) == "abc…"
    assert clip("abc", 3) == "abc"
    assert clip("", 0) == ""


@settings(max_examples=200, deadline=None)
@given(
    # lower-case alphabet: cannot combine with the upper-case token into a new match
    secret=st.text(alphabet="abcdefxyz0129-_", min_size=4, max_size=12),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
)
def test_property_secret_never_survives(secret, before, after):
    out = redact_text(before + secret + after, [secret])
    assert secret not in out
    assert REDACTED in out
