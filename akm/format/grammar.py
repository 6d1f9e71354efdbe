"""The workflow frontmatter's vocabulary: limits, the keys each mapping allows, name patterns.

Kept apart from the readers so every limit and key list lives in one place: the
readers enforce them, `lint` and the tests import them (through
`akm.format.parse`, which re-exports them), and a change to the format is a
change to this file. Plain constants only, so importing it costs nothing.
"""

from __future__ import annotations

import re

# ---- limits (spec/workflow-format.md, "Limits") ----
MAX_SOURCE_BYTES = 1_048_576
MAX_STEPS = 256
MAX_PARAMS = 128
MAX_ROUTE_BRANCHES = 256
MAX_INPUTS = 64
MAX_ENV_REFS = 1024
MAX_TEXT_BYTES = 256 * 1024
MAX_SCHEMA_BYTES = 256 * 1024
MAX_EXTRA_PARAMS_BYTES = 64 * 1024
MAX_JSON_DEPTH = 48
MAX_UNITS = 10_000
MAX_CONCURRENCY = 64
MAX_LOOPS = 100
MAX_RETRY = 100
MAX_TIMEOUT_MS = 2_147_483_647
MAX_EXEC_ARGV = 64
MAX_EXEC_ARG_BYTES = 4096
MAX_EXEC_CWD_CHARS = 1024
MAX_EXEC_PASS_ENV = 32

# ---- the keys each mapping allows (unknown keys are errors, with a did-you-mean) ----
# The asset envelope: keys a workflow shares with other knowledge files (also kept by `upgrade`).
ENVELOPE_KEYS = (
    "type",
    "description",
    "tags",
    "when_to_use",
    "xrefs",
    "updated",
    "timestamp",
    "generated",
    "verified",
    "provenance",
    "status",
    "stale_after",
)
TOP_LEVEL_KEYS = (
    *ENVELOPE_KEYS,
    "params",
    "defaults",
    "budget",
    "steps",
)
DEFAULTS_KEYS = ("engine", "model", "timeout", "on_error", "llm")
BUDGET_KEYS = ("max_tokens", "max_units", "max_cost", "unknown")
BUDGET_UNKNOWN = ("refuse", "allow")  # budget.unknown: what a ceiling does once a unit reported no usage
STEP_KEYS = ("id", "unit", "map", "route", "inputs", "output", "gate")
UNIT_KEYS = ("exec", "engine", "model", "llm", "timeout", "retry", "on_error", "output", "env", "isolation")
LLM_KEYS = ("temperature", "max_tokens", "supports_json_schema", "extra_params", "context_length", "enable_thinking")
RETRY_KEYS = ("max", "on")
EXEC_KEYS = ("command", "cwd", "pass_env", "inherit_env")
MAP_KEYS = ("over", "concurrency", "reducer", "unit")
ROUTE_KEYS = ("input", "when", "default")
BRANCH_KEYS = ("match", "step")
GATE_KEYS = ("max_loops",)
STAMP_KEYS = ("by", "at")

# ---- closed value sets ----
ON_ERROR_CHOICES = ("fail", "continue")

# ---- name patterns ----
STEP_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# `env/<name>`: the name becomes a file name (`.akm/env/<name>.env`), so no separators, no leading dot.
ENV_REF_RE = re.compile(r"env/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
ENGINE_NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")
DURATION_RE = re.compile(r"([0-9]+)(ms|s|m)?\Z")
# Config names (akm/config/, setup): an engine name in the config may not start with `akm-` (reserved);
# `${NAME}` / `$NAME` is an environment variable reference (an apiKey). Every pattern ends in `\Z`, never
# `$`, which also matches before a final newline (`"ci\n"` would pass as a name).
CONFIG_ENGINE_NAME_RE = re.compile(r"(?!akm-)[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")
ENV_VAR_REF_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))\Z")

# `llm.extra_params` keys, compared with case and punctuation removed: akm sets the protected
# ones for every request, and a workflow file (not secret) must never carry credentials.
PROTECTED_LLM_KEYS = frozenset(
    "model messages temperature maxtokens responseformat stream streamoptions enablethinking chattemplatekwargs".split()
)
CREDENTIAL_KEYS = frozenset("authorization headers apikey token password secret cookie setcookie".split())

DURATION_HINT = 'write milliseconds (250), a number with ms, s or m (1500ms, 90s, 10m), or "none" for no limit'
