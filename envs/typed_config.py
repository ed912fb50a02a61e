"""The one way configs are read: typed dataclasses from YAML recipes and command-line overrides.

    load_config(PPOConfig, ["--config", "configs/ppo/default.yaml", "--updates", "2", "--lora.r", "8"])

Dataclass defaults, then the YAML recipe given by ``--config``, then ``--key value`` (or
``--key=value``) overrides; nested fields with dots (``--lora.r 8``,
``--env.candidates_per_search 3``). Values are parsed as YAML scalars (``8``, ``1e-6``, ``true``,
``null``). A bare ``--flag`` sets a boolean field to true. Unknown keys raise :class:`ConfigError`
(a ``ValueError``). A recipe may start from another (``base: default.yaml``, relative to its
folder) and state only what differs. Used by every config of the project: ``EnvConfig``,
``PPOConfig``, ``WarmStartConfig`` and the evaluation CLI's ``--config``.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from envs.atomic import write_text_atomic


class ConfigError(ValueError):
    """A recipe or command-line override the config does not accept."""


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _field_default(cls: type, name: str) -> Any:
    """The default value of field ``name`` of dataclass ``cls`` (None when it has none)."""
    spec = next(f for f in dataclasses.fields(cls) if f.name == name)
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return None if spec.default is dataclasses.MISSING else spec.default


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Light type fixing for YAML values: ints and numeric strings (``3e-4``) for float fields,
    strings for str fields; a value of the wrong kind for a bool, int or float field is an error."""
    if value is None:
        return None
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML 1.1 reads 3e-4 and 1e5 (no dot) as strings
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{key} expects a number, got {value!r}") from None
    if hint is float and not isinstance(value, float):
        raise ConfigError(f"{key} expects a number, got {value!r}")
    if hint is str and not isinstance(value, str):
        return str(value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} expects true or false, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key} expects an integer, got {value!r}")
    return value


def from_dict(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict; unknown keys raise ConfigError. A nested section
    given in part (``lora: {r: 8}``) overlays that field's own default, not its class's defaults."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {values!r}")
    hints = _field_types(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"unknown config key(s) {[prefix + k for k in unknown]}; "
                          f"valid keys: {', '.join(prefix + k for k in hints)}")
    kwargs = {}
    for key, value in values.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and not isinstance(value, hint):
            base = _field_default(cls, key)
            section = merge_values(dataclasses.asdict(base), value or {}) if base is not None else value or {}
            kwargs[key] = from_dict(hint, section, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, hint, prefix + key)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = tree.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--{dotted}: {part} is not a nested section")
        tree = node
    tree[parts[-1]] = value


def merge_values(base: dict, extra: dict) -> dict:
    """``extra`` over ``base``, nested sections merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (merge_values(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict)
                    else value)
    return out


def parse_overrides(argv: list[str]) -> tuple[str | None, dict[str, Any]]:
    """``["--config", "x.yaml", "--lora.r", "8", "--resume"]`` -> ("x.yaml", {"lora": {"r": 8}, "resume": True})."""
    config_path, overrides, i = None, {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected --key value, got {arg!r}")
        key, eq, text = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                text, i = argv[i + 1], i + 1
            else:
                text = "true"  # a bare flag
        i += 1
        key = key.replace("-", "_")
        if key == "config":
            config_path = text
        else:
            _set_dotted(overrides, key, yaml.safe_load(text))
    return config_path, overrides


def load_config(cls: type, argv: list[str] | None = None) -> Any:
    """Defaults < ``--config`` YAML < command-line overrides (see the module docstring)."""
    argv = list(argv or [])
    if "-h" in argv or "--help" in argv:
        print(help_text(cls))
        raise SystemExit(0)
    config_path, overrides = parse_overrides(argv)
    values = read_recipe(Path(config_path)) if config_path else {}
    return from_dict(cls, merge_values(values, overrides))


def read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML recipe's keys. ``base: other.yaml`` (relative to the recipe's folder) loads that
    recipe first and applies this one's keys on top, so a variant states only what differs."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"recipe {path} is its own base")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys")
    base = values.pop("base", None)
    if base is None:
        return values
    return merge_values(read_recipe(path.parent / str(base), seen + (path.resolve(),)), values)


def help_text(cls: type) -> str:
    lines = [f"options of {cls.__name__} (--key value; nested with dots):"]
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        lines.append(f"  --{f.name} (default {default!r})")
    return "\n".join(lines)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Any config dataclass as plain nested dicts (what ``config.yaml`` holds)."""
    return dataclasses.asdict(cfg)


def save_resolved(cfg: Any, directory: str | Path) -> Path:
    """Write the fully resolved config to ``directory/config.yaml`` (atomically); returns the path."""
    path = Path(directory) / "config.yaml"
    return write_text_atomic(yaml.safe_dump(to_dict(cfg), sort_keys=False), path)
