"""The plugin's config: the manifest's ``config`` as JSON text, read into a
dict or a dataclass."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any, Literal, TypeVar, Union

from .error import PluginError

__all__ = ["parse_config", "config_class", "json_name"]

T = TypeVar("T")


def parse_config(plugin: str, config: str, into: type[T] = dict) -> T:  # type: ignore[assignment]
    """Reads the plugin's config (JSON text, as ``check_config`` and
    ``host.config()`` give it) into ``into``: ``dict`` (the default) or a
    dataclass.

    Empty text and ``null`` read as ``{}``, so a plugin whose fields all have
    defaults needs no ``config`` in the manifest. A dataclass field ``base_path``
    is read from the JSON key ``basePath`` (camelCase, as manifests spell
    keys) unless its metadata names another key (``field(metadata={"json":
    "base-path"})``). Unknown keys, missing fields without a default and
    values of the wrong type are errors, checked against the field's
    annotation: ``str``, ``int``, ``float``, ``bool``, ``Optional[...]``,
    ``list[...]``, ``dict[str, ...]``, ``Literal[...]``, an ``Enum`` (by
    value), a nested dataclass, or ``Any``.

    Raises :class:`PluginError` with a message starting with ``plugin``, e.g.
    ``bus-refresh config: missing field `connection```, which the host shows
    to the operator.

    Decorate the dataclass with :func:`config_class` so that its field types
    are resolved once, at build time, instead of in every call.
    """
    text = config.strip()
    if text in ("", "null"):
        text = "{}"
    try:
        value = json.loads(text)
        return typing.cast(T, _convert(value, into, ""))
    except json.JSONDecodeError as e:
        raise PluginError(f"{plugin} config: {e}") from None
    except _Invalid as e:
        where = f"{e.path}: " if e.path else ""
        raise PluginError(f"{plugin} config: {where}{e.message}") from None


def json_name(field: dataclasses.Field[Any]) -> str:
    """The JSON key of a dataclass field: its ``json`` metadata, else its
    name in camelCase (``base_path`` -> ``basePath``)."""
    explicit = field.metadata.get("json")
    if explicit is not None:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _Schema:
    """A config dataclass's fields, resolved: JSON key -> (field name, type),
    and the JSON keys that must be present."""

    __slots__ = ("fields", "required")

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        self.fields: dict[str, tuple[str, Any]] = {}
        self.required: list[str] = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            key = json_name(f)
            self.fields[key] = (f.name, hints[f.name])
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.required.append(key)


# Filled by `config_class` when the plugin's module is imported. componentize-py
# snapshots the interpreter after that import and every call starts from the
# snapshot, so what is resolved here is never resolved again; what a call
# resolves is gone with its sandbox.
_SCHEMAS: dict[type, _Schema] = {}


def config_class(cls: type[T]) -> type[T]:
    """Class decorator for a config dataclass (and its nested ones): resolves
    its field types when the module is imported, which the build snapshots,
    so :func:`parse_config` does not evaluate annotations in every call
    (measured: ~1.6 ms and ~340 page faults per call for a two-field class,
    about half of a Python plugin's per-event cost)::

        @config_class
        @dataclass
        class Config:
            strategy: Literal["refresh", "shutdown"] = "refresh"
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"config_class: {cls!r} is not a dataclass")
    _resolve(cls)
    return cls


def _resolve(tp: Any) -> None:
    """Resolves the schema of every dataclass reachable from ``tp``."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp in _SCHEMAS:
            return
        schema = _SCHEMAS[tp] = _Schema(tp)
        for _, field_type in schema.fields.values():
            _resolve(field_type)
        return
    for arg in typing.get_args(tp):
        _resolve(arg)


class _Invalid(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{json.dumps(value)}`"
    if isinstance(value, (int, float)):
        return f"number `{json.dumps(value)}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _one_of(options: list[str]) -> str:
    quoted = [f"`{o}`" for o in options]
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return f"{quoted[0]} or {quoted[1]}"
    return "one of " + ", ".join(quoted)


def _convert(value: Any, tp: Any, path: str) -> Any:
    if tp is Any or tp is object:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(value, tp, path)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _convert(value, options[0], path)
        for option in options:
            try:
                return _convert(value, option, path)
            except _Invalid:
                continue
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected {tp}")
    if origin is Literal:
        if value in args and all(type(value) is type(a) for a in args if a == value):
            return value
        if isinstance(value, str):
            raise _Invalid(
                path,
                f"unknown variant `{value}`, expected {_one_of([str(a) for a in args])}",
            )
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected {_one_of([str(a) for a in args])}")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if member.value == value:
                return member
        raise _Invalid(
            path,
            f"unknown variant {_kind(value)}, expected {_one_of([str(m.value) for m in tp])}",
        )
    if origin in (list, typing.List) or tp is list:
        if not isinstance(value, list):
            raise _Invalid(path, f"invalid type: {_kind(value)}, expected an array")
        item = args[0] if args else Any
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, typing.Dict) or tp is dict:
        if not isinstance(value, dict):
            raise _Invalid(path, f"invalid type: {_kind(value)}, expected an object")
        item = args[1] if len(args) == 2 else Any
        return {k: _convert(v, item, _join(path, k)) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected a boolean")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected a string")
    raise TypeError(f"parse_config: unsupported field type {tp!r} at {path or 'the top'}")


def _dataclass(value: Any, cls: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise _Invalid(path, f"invalid type: {_kind(value)}, expected an object")
    schema = _SCHEMAS.get(cls)
    if schema is None:
        # Not decorated: resolved in this call (correct, only slower).
        schema = _Schema(cls)
    fields = schema.fields
    kwargs: dict[str, Any] = {}
    for key, v in value.items():
        field = fields.get(key)
        if field is None:
            raise _Invalid(
                path, f"unknown field `{key}`, expected {_one_of(list(fields))}"
            )
        name, field_type = field
        kwargs[name] = _convert(v, field_type, _join(path, key))
    for key in schema.required:
        if key not in value:
            raise _Invalid(path, f"missing field `{key}`")
    return cls(**kwargs)
