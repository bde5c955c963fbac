"""Accessors for a :class:`ChangeEvent` and label/annotation lists."""

from __future__ import annotations

from typing import List, Optional

from wit_world.imports.types import ChangeEvent, DataValue_Text, KeyValue, ObjectKind


def lookup(items: List[KeyValue], key: str) -> Optional[str]:
    """The value of ``key`` in a list of labels or annotations (of the event,
    a Service, a workload), or ``None``."""
    for kv in items:
        if kv.key == key:
            return kv.value
    return None


def annotation(event: ChangeEvent, key: str) -> Optional[str]:
    """The value of annotation ``key`` on the changed object."""
    return lookup(event.annotations, key)


def label(event: ChangeEvent, key: str) -> Optional[str]:
    """The value of label ``key`` on the changed object."""
    return lookup(event.labels, key)


def text(event: ChangeEvent, key: str) -> Optional[str]:
    """The value of data key ``key`` when it is text and not withheld
    (Secret values need ``secretValues``); ``None`` when it is missing,
    binary or withheld."""
    for entry in event.data:
        if entry.key == key:
            value = entry.value
            return value.value if isinstance(value, DataValue_Text) else None
    return None


def is_config_map(event: ChangeEvent) -> bool:
    """True when the changed object is a ConfigMap."""
    return event.kind == ObjectKind.CONFIG_MAP


def is_secret(event: ChangeEvent) -> bool:
    """True when the changed object is a Secret."""
    return event.kind == ObjectKind.SECRET


def kind_name(event: ChangeEvent) -> str:
    """``"ConfigMap"`` or ``"Secret"``."""
    return "ConfigMap" if event.kind == ObjectKind.CONFIG_MAP else "Secret"


def object_id(event: ChangeEvent) -> str:
    """``namespace/name`` of the changed object."""
    return f"{event.namespace}/{event.name}"
