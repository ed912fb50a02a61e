"""The one way configs are read: typed dataclasses from YAML recipes and command-line overrides.

    load_config(PPOConfig, ["--config", "configs/ppo/default.yaml", "--optim.updates", "2", "--model.lora.r", "8"])

Dataclass defaults, then the YAML recipe given by ``--config``, then ``--key value`` (or
``--key=value``) overrides; nested fields with dots (``--model.lora.r 8``,
``--env.candidates_per_search 3``). Values are parsed as YAML scalars (``8``, ``1e-6``, ``true``,
``null``). A bare ``--flag`` sets a boolean field to true. Unknown keys raise :class:`ConfigError`
(a ``ValueError``). A recipe may start from another (``base: default.yaml``, relative to its
folder) and state only what differs. Used by every config of the project: ``EnvConfig``,
``PPOConfig``, ``WarmStartConfig`` and the evaluation config (``inference.eval_config.EvalConfig``).

A config class may rename its old keys with a classmethod ``upgrade_keys(values) -> values``
(:func:`upgrade`; ``PPOConfig``'s reads the flat names of the PPO config before its sections),
applied to each layer (a recipe file, the command line) before the layers are merged. A section
whose field names a sibling recipe field in its metadata (``RECIPE``: PPOConfig's ``env`` and
``env_config``) starts from that recipe, its own keys on top. :func:`with_values` builds or changes
a config by dotted names (``{"algorithm.advantage": "grpo"}``).

Each field's documentation is the ``# ...`` comment beside it in its dataclass (or the comment lines
directly above it; else its dataclass bases' or its ``DOCS_FROM`` classes'): :func:`field_docs` reads
them from the source, :func:`config_help` prints every field, nested sections included, as
``--section.field  type = default`` and that doc (``--help``).
A ``dict`` field that holds overrides of another config names it in its metadata,
``field(default_factory=dict, metadata={OVERRIDES: LoraSettings})`` (or ``"module:Class"``), and its
keys are documented as that config's fields (``--warm_start.lora.r``).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
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
    upgrade_keys = getattr(cls, UPGRADE_KEYS, None)
    values = upgrade_keys(values) if upgrade_keys else values
    hints = _field_types(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"unknown config key(s) {[prefix + k for k in unknown]}; "
                          f"valid keys: {', '.join(prefix + k for k in hints)}")
    values = dict(values)
    for spec in dataclasses.fields(cls):  # a section whose recipe field is given is built from that recipe
        if spec.metadata.get(RECIPE) in values and spec.name not in values:
            values[spec.name] = {}
    kwargs = {}
    for key, value in values.items():
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and not isinstance(value, hint):
            recipe_field = _spec(cls, key).metadata.get(RECIPE)
            if recipe_field:
                base_values = recipe_values(hint, values.get(recipe_field, _field_default(cls, recipe_field)))
            else:
                base = _field_default(cls, key)
                base_values = dataclasses.asdict(base) if base is not None else {}
            section = merge_values(base_values, upgrade(hint, value or {}))
            kwargs[key] = from_dict(hint, section, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, hint, prefix + key)
    return cls(**kwargs)


def _spec(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def recipe_values(cls: type, path: str | Path | None) -> dict[str, Any]:
    """The keys of recipe ``path`` for config ``cls`` (old keys upgraded; :func:`read_recipe`), a
    relative path read from the working folder, else from the project's root; None: ``{}``."""
    if not path:
        return {}
    path = Path(path)
    return read_recipe(path if path.is_file() or path.is_absolute() else PROJECT_ROOT / path, cls)


def upgrade(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the old keys of ``cls`` and of its nested sections renamed to today's, by each
    class's own ``upgrade_keys`` (a classmethod ``dict -> dict``; see :class:`training.config.PPOConfig`),
    so that one layer (a recipe, the command line) is upgraded before it is merged with another."""
    if not isinstance(values, dict):
        return values
    upgrade_keys = getattr(cls, UPGRADE_KEYS, None)
    values = upgrade_keys(values) if upgrade_keys else dict(values)
    hints = _field_types(cls)
    return {key: (upgrade(hints[key], value) if key in hints and dataclasses.is_dataclass(hints[key])
                  and isinstance(value, dict) else value) for key, value in values.items()}


def move_old_keys(values: dict[str, Any], old_keys: dict[str, str], sections: tuple[str, ...],
                  convert: Callable[[str, str, Any], tuple[str, Any]] | None = None,
                  ) -> tuple[dict[str, Any], list[str]]:
    """``values`` with each old flat key of ``old_keys`` moved to its dotted target (``{"limit": 3}``,
    ``{"limit": "data.limit"}`` -> ``{"data": {"limit": 3}}``) and the keys moved, for one deprecation line. A key
    named like a section is old only when its value is not a mapping; ``convert(key, target, value)`` gives the
    (target, value) to set where a plain move is not enough (pairs, renamed values)."""
    out: dict[str, Any] = {}
    moved = []
    for key, value in values.items():
        target = old_keys.get(key)
        if target is None or (key in sections and isinstance(value, dict)):
            out = merge_values(out, {key: value})
            continue
        moved.append(key)
        if convert is not None:
            target, value = convert(key, target, value)
        tree: dict[str, Any] = {}
        _set_dotted(tree, target, value)
        out = merge_values(out, tree)
    return out, moved


_PRINTED: set[str] = set()


def deprecated(message: str) -> None:
    """Print ``message`` (one line, to stderr) once per process: an old key read, not refused."""
    if message not in _PRINTED:
        _PRINTED.add(message)
        print(f"deprecated: {message}", file=sys.stderr, flush=True)


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
    config_path: str | None = None
    overrides: dict[str, Any] = {}
    i = 0
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
    values = read_recipe(Path(config_path), cls) if config_path else {}
    return from_dict(cls, merge_values(values, upgrade(cls, overrides)))


def read_recipe(path: Path, cls: type | None = None, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML recipe's keys. ``base: other.yaml`` (relative to the recipe's folder) loads that
    recipe first and applies this one's keys on top, so a variant states only what differs. With
    ``cls``, each file's old keys are upgraded (:func:`upgrade`) before the two are merged."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"recipe {path} is its own base")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys")
    base = values.pop("base", None)
    values = upgrade(cls, values) if cls is not None else values
    if base is None:
        return values
    return merge_values(read_recipe(path.parent / str(base), cls, seen + (path.resolve(),)), values)


OVERRIDES = "overrides"  # field metadata key: the config class a dict field's keys override
# field metadata key of a section: the sibling field naming the YAML recipe the section starts from (its keys
# over the recipe's): PPOConfig's ``env`` starts from ``env_config``
RECIPE = "recipe"
UPGRADE_KEYS = "upgrade_keys"  # a config class's classmethod renaming its old keys (:func:`upgrade`)
DOCS_FROM = "DOCS_FROM"  # a config class attribute: classes ("module:Class" too) whose docs document its fields
SECTION_HEADING = "----"  # a ``# ---- model`` comment heads a group of fields and documents none


def field_docs(cls: type) -> dict[str, str]:
    """``{field: doc}`` for dataclass ``cls``: the comment at the end of the field's first line,
    else the block of comment lines directly above it (section headings ``# ---- x`` left out),
    joined into one line. Fields without either are missing from the result."""
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    """The class's own docs, then its dataclass bases' and its :data:`DOCS_FROM` classes' for the rest."""
    docs = dict(_own_field_docs(cls))
    names = {f.name for f in dataclasses.fields(cls)}
    for other in (*cls.__mro__[1:], *map(_config_class, getattr(cls, DOCS_FROM, ()))):
        if isinstance(other, type) and dataclasses.is_dataclass(other):
            for name, text in _own_field_docs(other):
                if name in names:
                    docs.setdefault(name, text)
    return tuple(docs.items())


@functools.cache
def _own_field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source file (a frozen or compiled-only install): no docs, no failure
        return ()
    if not any(isinstance(node, ast.ClassDef) and node.name == cls.__name__ for node in ast.parse(source).body):
        return ()  # a class made by make_dataclass: inspect found another class's source
    comments = {tok.start[0]: (tok.string.lstrip("#").strip(), tok.line[:tok.start[1]].strip() == "")
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)).body
    names = {f.name for f in dataclasses.fields(cls)}
    docs = []
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names):
            continue
        text, alone = comments.get(node.lineno, ("", True))
        if not text or alone:
            above: list[str] = []
            line = node.lineno - 1
            while line in comments and comments[line][1]:
                if not comments[line][0].startswith(SECTION_HEADING):
                    above.insert(0, comments[line][0])
                line -= 1
            text = " ".join(above)
        if text:
            docs.append((node.target.id, text))
    return tuple(docs)


def _type_name(spec: dataclasses.Field) -> str:
    hint = spec.type
    return hint if isinstance(hint, str) else getattr(hint, "__name__", str(hint))


def _config_class(target: Any) -> Any:
    """``target``, or the class a ``"module:Class"`` string names (imported when it is needed)."""
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target


def _overridden(spec: dataclasses.Field) -> type | None:
    """The config class whose fields a dict field's keys override (its ``OVERRIDES`` metadata)."""
    return _config_class(spec.metadata.get(OVERRIDES))


def config_help(cls: type, prefix: str = "", instance: Any = None, _shown: dict | None = None) -> str:
    """Every field of ``cls`` (of ``instance`` for its defaults, e.g. a section's own default) as
    ``--<prefix><field>  type = default`` and its doc on the next line, nested sections and the
    configs that dict fields override (:data:`OVERRIDES`) recursively. A config listed under one
    field is referred to, not listed again, under another (``--sft.env``: as under ``--env.``)."""
    docs = field_docs(cls)
    shown = dict(_shown or {})
    for spec in dataclasses.fields(cls):  # this level's override sections are listed here, not deeper
        target = _overridden(spec)
        if target is not None:
            shown.setdefault(target, f"{prefix}{spec.name}")
    lines = []
    for spec in dataclasses.fields(cls):
        default = getattr(instance, spec.name) if instance is not None else _field_default(cls, spec.name)
        name = f"{prefix}{spec.name}"
        if dataclasses.is_dataclass(default):
            lines.append(f"  --{name}.*  section: {docs.get(spec.name, '(undocumented)')}")
            lines.append(config_help(type(default), f"{name}.", default, shown))
            continue
        lines.append(f"  --{name}  {_type_name(spec)} = {default!r}")
        lines.append(textwrap.fill(docs.get(spec.name, "(undocumented)"), width=110, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6, break_long_words=False, break_on_hyphens=False))
        target = _overridden(spec)
        if target is not None and shown.get(target) != name:
            lines.append(f"      (keys: the fields of {target.__name__}, as under --{shown[target]}.)")
        elif target is not None:
            lines.append(f"  --{name}.*  the fields of {target.__name__} (defaults: {target.__name__}'s own)")
            lines.append(config_help(target, f"{name}.", None, shown))
    return "\n".join(lines)


def help_text(cls: type) -> str:
    """``--help`` of a config: every field (:func:`config_help`)."""
    return (f"options of {cls.__name__} (--key value or --key=value; nested with dots; values are YAML scalars; "
            f"--config recipe.yaml first):\n{config_help(cls)}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Any config dataclass as plain nested dicts (what ``config.yaml`` holds)."""
    return dataclasses.asdict(cfg)


def save_resolved(cfg: Any, directory: str | Path) -> Path:
    """Write the fully resolved config to ``directory/config.yaml`` (atomically); returns the path."""
    path = Path(directory) / "config.yaml"
    return write_text_atomic(yaml.safe_dump(to_dict(cfg), sort_keys=False), path)


def with_values(cfg: Any, values: dict[str, Any]) -> Any:
    """``cfg`` with the dotted fields of ``values`` replaced: ``with_values(PPOConfig, {"algorithm.advantage":
    "grpo", "optim.updates": 2})``. A config class: built by :func:`from_dict` (defaults, a recipe field
    such as ``env_config`` read, values type-checked). A config: its sections rebuilt by
    :func:`dataclasses.replace`, so every ``__post_init__`` check runs again; a value given for a section
    as a dict replaces those of its fields; nothing is read from disk (a new ``env_config`` does not
    rebuild ``env``)."""
    tree: dict[str, Any] = {}
    for dotted, value in values.items():
        _set_dotted(tree, dotted, value)
    return from_dict(cfg, tree) if isinstance(cfg, type) else _replace_tree(cfg, tree, "")


def _replace_tree(obj: Any, tree: dict[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(tree) - names)
    if unknown:
        raise ConfigError(f"unknown config key(s) {[prefix + k for k in unknown]}")
    changes = {}
    for key, value in tree.items():
        current = getattr(obj, key)
        changes[key] = (_replace_tree(current, value, f"{prefix}{key}.")
                        if dataclasses.is_dataclass(current) and isinstance(value, dict) else value)
    return dataclasses.replace(obj, **changes)


def changed_fields(a: Any, b: Any, prefix: str = "") -> set[str]:
    """The dotted names of the fields in which configs ``a`` and ``b`` (of one class) differ, nested
    sections compared field by field: ``{"optim.updates", "env.reward"}``."""
    out = set()
    for spec in dataclasses.fields(a):
        left, right = getattr(a, spec.name), getattr(b, spec.name)
        if left == right:
            continue
        if (dataclasses.is_dataclass(left) and dataclasses.is_dataclass(right) and type(left) is type(right)
                and not prefix):
            out |= changed_fields(left, right, f"{spec.name}.")
        else:
            out.add(prefix + spec.name)
    return out
