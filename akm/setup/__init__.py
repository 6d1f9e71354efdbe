"""`akm setup`: find what this machine has, check that it answers, write engines into the config.

* `detect`  — model servers (Ollama, LM Studio, any OpenAI-compatible server),
  agent CLIs on PATH, harness configs (Claude Code, OpenCode), API-key variables
  (names only). Read-only, parallel, short timeouts.
* `verify`  — does an endpoint answer a one-token chat request? (and, on
  request, does it honour `response_format: json_schema`?)
* `core`    — turn what was found (or a user's blob, or the wizard's choices)
  into config changes: upserts by fingerprint, defaults where unset, one locked
  atomic save.
* `wizard` + `terminal` — the interactive front (`akm setup` at a terminal).

No key value is ever read into config or output: detection records variable
NAMES; a value is read only to send a Bearer header while verifying.
"""
