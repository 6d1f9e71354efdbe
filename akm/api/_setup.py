"""`akm setup`'s service calls: look around, recommend, preview, verify and save engines. The interactive
wizard is a front (`akm.cli.wizard`) over these calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from akm.codes import Code
from akm.errors import UsageError

if TYPE_CHECKING:
    from akm.api._models import (
        SetupResult,
    )
    from akm.setup.core import Recommendation
    from akm.setup.detect import Detection
    from akm.setup.verify import Verification
from akm.api._config import _public_mapping

# ================================================================== setup (`akm setup`, MCP `setup`)
# Setup issue: thin wrappers over akm.setup. The wizard (akm/setup/wizard.py) is the CLI's interactive
# front; it calls setup_detect / setup_recommend / setup_verify / setup_save below.


def _setup_result(outcome: Any) -> SetupResult:
    from akm.api._models import SetupResult

    return SetupResult(
        config_path=outcome.config_path,
        written=outcome.written,
        dry_run=outcome.dry_run,
        fields=outcome.fields,
        engines=[a.to_json() for a in outcome.actions],
        defaults=outcome.defaults,
        judge_engine=outcome.judge_engine,
        detected=outcome.detection.to_json() if outcome.detection is not None else None,
        verifications=[v.to_json() for v in outcome.verifications],
        json_schema=outcome.json_schema.to_json() if outcome.json_schema is not None else None,
        warnings=outcome.warnings,
        can_run=outcome.can_run,
        message=outcome.message,
    )


def setup(
    *,
    yes: bool = False,
    config: Any = None,
    from_file: str | None = None,
    probe: bool = False,
    project: bool = False,
    cwd: str | None = None,
    dry_run: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> SetupResult:
    """Non-interactive setup: detect + verify + write engines (`yes`), apply a config blob (`config` object or
    `from_file`), record json_schema support (`probe`). `dry_run` computes everything and writes nothing."""
    from akm.errors import ConfigError
    from akm.setup import core

    if config is not None and from_file is not None:
        raise UsageError("Give the setup config inline or as a file, not both.", code=Code.INVALID_ARGUMENT)
    base = Path(cwd) if cwd else Path.cwd()
    blob = core.read_blob_file(from_file, base) if from_file is not None else config
    if from_file is not None and not isinstance(blob, dict):
        raise ConfigError(
            f"Setup config {from_file} must hold one JSON object at the top.",
            code=Code.INVALID_CONFIG_FILE,
            details={"file": from_file},
        )
    outcome = core.run(
        yes=yes, blob=blob, probe=probe, project=project, cwd=cwd, dry_run=dry_run, on_warning=on_warning
    )
    return _setup_result(outcome)


def setup_preflight(*, cwd: str | None = None) -> None:
    """Raise (ConfigError, file untouched) when the existing config is invalid: setup cannot run on it."""
    from akm.setup import core

    core.preflight(cwd)


def setup_detect(*, cwd: str | None = None) -> Detection:
    """What this machine has (servers, agent CLIs, harness configs, key variable names). Read-only."""
    from akm.setup.detect import detect

    return detect(cwd=Path(cwd) if cwd else None)


def setup_recommend(
    detection: Detection,
    *,
    cwd: str | None = None,
    project: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> Recommendation:
    """What `--yes` would write given `detection` (verifies the chosen server)."""
    from akm.setup import core

    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, project)
    return core.recommend(detection, merged, warn=on_warning)


def setup_current(*, cwd: str | None = None) -> dict[str, Any]:
    """The effective config as setup sees it (both layers merged), apiKey values never included."""
    from akm.setup import core

    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, False)
    return _public_mapping(merged)


def setup_preview(intent: Any, *, cwd: str | None = None, project: bool = False) -> list[str]:
    """What could run if `intent` were saved (nothing written)."""
    from akm.setup import core

    merged, _ = core.effective_after(intent, cwd, project)
    return core.can_run(merged)


def setup_verify(endpoint: str, model: str, api_key_env: str | None = None) -> Verification:
    """One 1-token chat request against an endpoint (key read from `$api_key_env` for the header only)."""
    from akm.setup.verify import verify_endpoint

    return verify_endpoint(endpoint, model, api_key_env)


def setup_save(
    intent: Any,
    *,
    cwd: str | None = None,
    project: bool = False,
    probe: bool = True,
    on_warning: Callable[[str], None] | None = None,
) -> SetupResult:
    """Write the wizard's choices (one locked atomic save). `probe`: best-effort json_schema probe first."""
    from akm.setup import core

    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        if on_warning is not None:
            on_warning(message)

    core.validate_intent(intent, cwd, project)
    probe_result = None
    merged, planned = core.effective_after(intent, cwd, project)
    if probe and any(a.kind == "llm" and a.action == "added" for a in planned.actions):
        # only an engine setup adds is probed: a user's own engine is never retuned
        probe_result = core.probe_default_llm(merged)
        if probe_result is not None and probe_result.supported is not None:
            intent.json_schema = probe_result.supported
        elif probe_result is not None:
            warn(f"Could not probe engine {probe_result.engine} for json_schema support: {probe_result.reason}")
    target, file_obj, written, applied = core.save(intent, cwd=cwd, project=project)
    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, project)
    from akm.api._models import SetupResult

    return SetupResult(
        config_path=str(target),
        written=written,
        fields=list(file_obj or {}),
        engines=[a.to_json() for a in applied.actions],
        defaults=dict(merged.get("defaults") or {}),
        judge_engine=(merged.get("workflow") or {}).get("judgeEngine"),
        json_schema=probe_result.to_json() if probe_result is not None else None,
        warnings=warnings,
        can_run=core.can_run(merged),
        message=f"Wrote {target}." if written else f"{target} already says this; nothing was written.",
    )
