"""The engine configuration as the api shows and edits it: paths, list, get, set, unset (key values never
shown: only `${ENV_NAME}` references are stored).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akm.api._models import (
        ConfigChange,
        ConfigPaths,
    )


# ================================================================== config (`akm config …`)
# Engines issue: thin wrappers over akm.config / akm.config.keys. Kept in one section.


def config_paths(*, cwd: str | None = None) -> ConfigPaths:
    """The user and project config paths (works even when a file is broken)."""
    from akm import config as cfg
    from akm.api._models import ConfigPaths

    user, project = cfg.user_config_path(), cfg.project_config_path(cwd)
    return ConfigPaths(
        user=str(user), project=str(project), user_exists=user.is_file(), project_exists=project.is_file()
    )


def _public_config(data: Any) -> Any:
    """Defence in depth: drop any `apiKey` that is not a `${NAME}` reference before showing config."""
    from akm.config import env_ref_name

    if isinstance(data, dict):
        return {k: _public_config(v) for k, v in data.items() if not (k == "apiKey" and env_ref_name(v) is None)}
    if isinstance(data, list):
        return [_public_config(v) for v in data]
    return data


def _public_mapping(data: dict[str, Any]) -> dict[str, Any]:
    """`_public_config` of a whole config (a mapping in, a mapping out)."""
    public: dict[str, Any] = _public_config(data)
    return public


def config_list(*, cwd: str | None = None) -> dict[str, Any]:
    """The effective config: the user file deep-merged under the project file (validated)."""
    from akm import config as cfg

    return _public_mapping(cfg.load_config(cwd).merged)


def config_get(key: str, *, cwd: str | None = None) -> Any:
    """The effective value at a dotted key, or None when unset."""
    from akm import config as cfg
    from akm.config import keys as config_keys

    config_keys.leaf_kind(key)  # an unknown key is a usage error even when the config is broken
    return _public_config(config_keys.get_value(cfg.load_config(cwd).merged, key))


def config_set(key: str, raw_value: str, *, project: bool = False, cwd: str | None = None) -> ConfigChange:
    """Set a key in the user (or project) file; the string is coerced to the key's type.

    Objects deep-merge into an existing object at that key; arrays replace. The
    whole config must stay valid or nothing is written (ConfigError, exit 78).
    """
    from akm import config as cfg
    from akm.config import keys as config_keys

    value, unset = config_keys.coerce(key, raw_value)
    if unset:
        return config_unset(key, project=project, cwd=cwd)
    new, written = cfg.update_config_file(
        lambda data: config_keys.set_value(data, key, value), project=project, cwd=cwd
    )
    target = cfg.project_config_path(cwd) if project else cfg.user_config_path()
    from akm.api._models import ConfigChange

    return ConfigChange(
        key=key,
        value=_public_config(config_keys.get_value(new, key)),
        file=str(target),
        written=written,
        warnings=config_keys.unknown_key_warnings(new, str(target)),
    )


def config_unset(key: str, *, project: bool = False, cwd: str | None = None) -> ConfigChange:
    """Remove a key from the user (or project) file; emptied parents are pruned. No file: nothing happens."""
    from akm import config as cfg
    from akm.api._models import ConfigChange
    from akm.config import keys as config_keys

    config_keys.leaf_kind(key)
    target = cfg.project_config_path(cwd) if project else cfg.user_config_path()
    if not target.is_file():
        return ConfigChange(key=key, value=None, file=str(target), written=False)
    _, written = cfg.update_config_file(lambda data: config_keys.unset_value(data, key), project=project, cwd=cwd)
    return ConfigChange(key=key, value=None, file=str(target), written=written)
