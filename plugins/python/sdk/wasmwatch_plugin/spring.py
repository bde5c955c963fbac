"""Target apps the way the Spring Cloud Kubernetes Configuration Watcher
finds them, shared by http-refresh and bus-refresh:

1. ``spring.cloud.kubernetes.configmap.apps`` (for Secrets
   ``spring.cloud.kubernetes.secret.apps``): comma-separated app names,
   which are also Service names; else
2. ``spring.cloud.kubernetes.configmap.labels`` / ``...secret.labels``
   (``k=v,k2=v2``): the Services in the object's namespace carrying all of
   these labels (host ``services_with_labels``); else
3. the app named like the object.

``target_apps(event)`` returns one of :class:`Named`, :class:`Labelled` or
:class:`ObjectName`, all :class:`SpringApps` with ``services(namespace)``
and ``names()``. An object of another kind than ConfigMap and Secret (WIT
0.4.0's ``other``, which the Spring watcher does not know) has no target
apps: an empty :class:`Named`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Optional

from wit_world.imports import host
from wit_world.imports.types import (
    ChangeEvent,
    KeyValue,
    ObjectKind,
    ObjectKind_ConfigMap,
    ObjectKind_Secret,
    ServiceInfo,
)

from .event import annotation

__all__ = [
    "SpringApps",
    "Named",
    "Labelled",
    "ObjectName",
    "annotation_prefix",
    "parse_labels",
    "target_apps",
]


class SpringApps(ABC):
    """How the target apps of a change were named."""

    @abstractmethod
    def services(self, namespace: str) -> List[ServiceInfo]:
        """The apps' Services in ``namespace``; apps without a Service are
        dropped (what an HTTP refresh needs)."""

    @abstractmethod
    def _all_names(self) -> List[str]: ...

    def names(self) -> List[str]:
        """The apps' names, each once, in order, whether or not a Service
        exists (what a bus message needs: its consumers subscribe by
        themselves)."""
        return list(dict.fromkeys(self._all_names()))


@dataclass
class Named(SpringApps):
    """Listed in the ``...apps`` annotation (not checked against Services)."""

    apps: List[str]

    def services(self, namespace: str) -> List[ServiceInfo]:
        found = (host.service(namespace, app) for app in self.apps)
        return [s for s in found if s is not None]

    def _all_names(self) -> List[str]:
        return self.apps


@dataclass
class Labelled(SpringApps):
    """The Services matching the ``...labels`` annotation."""

    matching: List[ServiceInfo]

    def services(self, namespace: str) -> List[ServiceInfo]:
        return self.matching

    def _all_names(self) -> List[str]:
        return [s.name for s in self.matching]


@dataclass
class ObjectName(SpringApps):
    """No annotation: the app named like the object."""

    name: str

    def services(self, namespace: str) -> List[ServiceInfo]:
        service = host.service(namespace, self.name)
        return [] if service is None else [service]

    def _all_names(self) -> List[str]:
        return [self.name]


def annotation_prefix(kind: ObjectKind) -> Optional[str]:
    """``spring.cloud.kubernetes.configmap`` or ``spring.cloud.kubernetes.secret``;
    ``None`` for other kinds, which the Spring watcher does not know."""
    if isinstance(kind, ObjectKind_ConfigMap):
        return "spring.cloud.kubernetes.configmap"
    if isinstance(kind, ObjectKind_Secret):
        return "spring.cloud.kubernetes.secret"
    return None


def parse_labels(selector: str) -> List[KeyValue]:
    """``k=v, k2=v2`` -> labels; entries without ``=`` are skipped."""
    labels = []
    for entry in selector.split(","):
        key, sep, value = entry.partition("=")
        if sep:
            labels.append(KeyValue(key.strip(), value.strip()))
    return labels


def target_apps(event: ChangeEvent) -> SpringApps:
    """Resolves the target apps of ``event`` (asks the host only for the
    labels annotation). An object of another kind than ConfigMap and Secret
    has none (an empty :class:`Named`)."""
    prefix = annotation_prefix(event.kind)
    if prefix is None:
        return Named([])
    apps = annotation(event, f"{prefix}.apps")
    if apps is not None:
        return Named([a.strip() for a in apps.split(",") if a.strip()])
    selector = annotation(event, f"{prefix}.labels")
    if selector is not None:
        return Labelled(host.services_with_labels(event.namespace, parse_labels(selector)))
    return ObjectName(event.name)
