"""Accessors for a :class:`ChangeEvent`, a workload (:class:`WorkloadRef`,
:class:`WorkloadInfo`) and label/annotation lists."""

from __future__ import annotations

from typing import Iterable, List, Optional, Union

from wit_world.imports.types import (
    ChangeEvent,
    DataValue_Text,
    KeyValue,
    ObjectKind,
    ObjectKind_ConfigMap,
    ObjectKind_Other,
    ObjectKind_Secret,
    ObjectType,
    WorkloadInfo,
    WorkloadRef,
)

__all__ = [
    "CONFIG_MAP",
    "SECRET",
    "other_kind",
    "lookup",
    "annotation",
    "label",
    "text",
    "is_config_map",
    "is_secret",
    "is_kind",
    "kind_name",
    "object_type",
    "object_id",
    "is_workload_kind",
    "api_version",
    "describe",
    "uses_only_keys",
    "uses_any_of",
]

CONFIG_MAP: ObjectKind = ObjectKind_ConfigMap()
"""The :data:`ObjectKind` of a ConfigMap (``ObjectKind_ConfigMap()``)."""

SECRET: ObjectKind = ObjectKind_Secret()
"""The :data:`ObjectKind` of a Secret (``ObjectKind_Secret()``)."""


def other_kind(group: str, version: str, kind: str) -> ObjectKind:
    """``ObjectKind_Other(ObjectType(group, version, kind))``: a kind beyond
    ConfigMap and Secret, as an event carries it or as the argument of
    ``host.workloads_referencing`` (``other_kind("secrets-store.csi.x-k8s.io",
    "v1", "SecretProviderClass")``)."""
    return ObjectKind_Other(ObjectType(group, version, kind))


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
    binary or withheld. For an object of another kind the keys are the
    manifest's content field paths (``status.objects``)."""
    for entry in event.data:
        if entry.key == key:
            value = entry.value
            return value.value if isinstance(value, DataValue_Text) else None
    return None


def is_config_map(event: ChangeEvent) -> bool:
    """True when the changed object is a ConfigMap."""
    return isinstance(event.kind, ObjectKind_ConfigMap)


def is_secret(event: ChangeEvent) -> bool:
    """True when the changed object is a Secret."""
    return isinstance(event.kind, ObjectKind_Secret)


def is_kind(event: ChangeEvent, group: str, kind: str) -> bool:
    """True when the changed object is of kind ``kind`` in API group
    ``group``, any version: ``is_kind(event, "secrets-store.csi.x-k8s.io",
    "SecretProviderClassPodStatus")``; ConfigMaps and Secrets are group
    ``""`` (``is_kind(event, "", "ConfigMap")``)."""
    t = object_type(event)
    return t.group == group and t.kind == kind


def kind_name(event: ChangeEvent) -> str:
    """``"ConfigMap"``, ``"Secret"``, or another kind's ``kind``
    (``"SecretProviderClassPodStatus"``)."""
    return object_type(event).kind


def object_type(event: ChangeEvent) -> ObjectType:
    """The changed object's group, version and kind: ``("", "v1",
    "ConfigMap")``, ``("", "v1", "Secret")``, or an ``other`` kind's."""
    kind = event.kind
    if isinstance(kind, ObjectKind_Other):
        return kind.value
    if isinstance(kind, ObjectKind_ConfigMap):
        return ObjectType("", "v1", "ConfigMap")
    return ObjectType("", "v1", "Secret")


def object_id(event: ChangeEvent) -> str:
    """``namespace/name`` of the changed object."""
    return f"{event.namespace}/{event.name}"


Workload = Union[WorkloadRef, WorkloadInfo]
"""A workload's reference, or what ``host.workloads_referencing`` returns
about it (the workload helpers below take either)."""


def _ref(workload: Workload) -> WorkloadRef:
    return workload.workload if isinstance(workload, WorkloadInfo) else workload


def is_workload_kind(workload: Workload, group: str, version: str, kind: str) -> bool:
    """True when ``workload`` is of ``group``/``version``/``kind``:
    ``("apps", "v1", "Deployment")``, ``("batch", "v1", "CronJob")``,
    ``("argoproj.io", "v1alpha1", "Rollout")``."""
    w = _ref(workload)
    return w.group == group and w.version == version and w.kind == kind


def api_version(workload: Workload) -> str:
    """The workload's ``apiVersion`` as Kubernetes writes it: ``apps/v1``,
    or ``v1`` for the core group."""
    w = _ref(workload)
    return f"{w.group}/{w.version}" if w.group else w.version


def describe(workload: Workload) -> str:
    """``Kind namespace/name`` (``CronJob shop/nightly``), for logs and
    reasons."""
    w = _ref(workload)
    return f"{w.kind} {w.namespace}/{w.name}"


def uses_only_keys(workload: WorkloadInfo) -> bool:
    """True when the pod template uses the object only through specific keys
    (env ``configMapKeyRef``/``secretKeyRef``, volume ``items``): then a
    change that touches none of them leaves the workload's pods as they are.
    False when a use takes the whole object (``envFrom``, a volume without
    ``items``), when nothing is known of the uses, or when the workload is
    not referenced (selected by a named ``reload`` annotation)."""
    return (
        workload.referenced
        and bool(workload.uses)
        and all(use.key is not None for use in workload.uses)
    )


def uses_any_of(workload: WorkloadInfo, changed_keys: Iterable[str]) -> bool:
    """True when the change touches what the workload uses: one of the keys
    it uses is in ``changed_keys`` (the event's ``changed_keys``), or it
    uses the whole object (see :func:`uses_only_keys`)."""
    if not uses_only_keys(workload):
        return True
    changed = set(changed_keys)
    return any(use.key in changed for use in workload.uses)
