"""wasmwatch_plugin: write a wasmwatch plugin in a few lines of Python.

A plugin is a WebAssembly component of the world
``wasmwatch:plugin/plugin@0.4.0`` (``wit/0.4.0/plugin.wit``), built with
componentize-py, which generates the bindings (the ``wit_world`` package)
at build time. This SDK sits beside them and offers:

- every generated type (:class:`ChangeEvent`, :data:`Action`,
  :class:`ServiceInfo`, :class:`WorkloadInfo`, ...) and the :mod:`host`
  imports;
- :class:`Plugin`, the base class of your ``WitWorld`` class, and
  :class:`PluginError`, the exception that makes ``check_config`` or
  ``handle`` return an error;
- event accessors: :func:`annotation`, :func:`label`, :func:`text`,
  :func:`is_config_map`, :func:`is_secret`, :func:`is_kind`,
  :func:`kind_name`, :func:`object_type`, :func:`object_id`, and
  :func:`lookup` for any label/annotation list; :data:`CONFIG_MAP`,
  :data:`SECRET` and :func:`other_kind` build an :data:`ObjectKind`;
- workload helpers (a :class:`WorkloadRef` or :class:`WorkloadInfo`):
  :func:`is_workload_kind`, :func:`api_version`, :func:`describe`,
  :func:`uses_only_keys`, :func:`uses_any_of`;
- :mod:`~wasmwatch_plugin.action`: builders for the actions a plugin returns;
- :func:`parse_config`: the plugin's JSON config into a dict or a dataclass,
  refusing unknown fields; :func:`config_class` resolves a config
  dataclass at build time;
- :mod:`~wasmwatch_plugin.spring`: Spring Cloud Kubernetes target apps.

What 0.4.0 (and 0.3.0 before it) changed against 0.2.0:

- a workload is named by strings, ``WorkloadRef(group, version, kind,
  namespace, name)`` (``"apps", "v1", "Deployment"``; ``"batch", "v1",
  "CronJob"``; ``"argoproj.io", "v1alpha1", "Rollout"``; the core group is
  ``""``), no longer by a ``WorkloadKind`` enum;
- :class:`WorkloadInfo` has ``referenced`` (False: only a named ``reload``
  annotation selects it) and ``uses``, a list of :class:`ObjectUse`
  ``(via: UseVia.ENV | ENV_FROM | VOLUME, key: str | None)``;
- :class:`RestartWorkload` has ``strategy``, an optional
  :class:`RestartStrategy` (``ANNOTATIONS``, ``ENV_VARS``, ``RESTART_AT``);
- :data:`ObjectKind` is a variant: ``ObjectKind_ConfigMap()``,
  ``ObjectKind_Secret()`` or ``ObjectKind_Other(ObjectType(group, version,
  kind))``, a kind the manifest's ``watch.kinds`` names (the CSI driver's
  SecretProviderClassPodStatus); such an object's ``data`` has one entry per
  content field path. ``host.workloads_referencing`` takes the same variant.

A plugin (``app.py``)::

    from wasmwatch_plugin import Action, ChangeEvent, Plugin, action, object_id

    class WitWorld(Plugin):
        def check_config(self, config: str) -> None:
            pass

        def handle(self, event: ChangeEvent) -> list[Action]:
            return [action.event_normal("Seen", object_id(event))]

built with ``componentize-py -d wit/0.4.0 -w plugin componentize -p sdk -p .
app -o plugin.wasm``. The class must be called ``WitWorld`` and live in the
module named on that command line.
"""

from __future__ import annotations

import wit_world
from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports.types import (
    Action,
    Action_Event,
    Action_Http,
    Action_Publish,
    Action_RefreshService,
    Action_Restart,
    BusPublish,
    ChangeEvent,
    ChangeType,
    DataEntry,
    DataValue,
    DataValue_Binary,
    DataValue_Text,
    EmitEvent,
    Endpoint,
    EventType,
    Header,
    HttpCall,
    HttpMethod,
    KeyValue,
    LogLevel,
    ObjectKind,
    ObjectKind_ConfigMap,
    ObjectKind_Other,
    ObjectKind_Secret,
    ObjectType,
    ObjectUse,
    RefreshService,
    RestartStrategy,
    RestartWorkload,
    ServiceInfo,
    ServicePort,
    UseVia,
    WorkloadInfo,
    WorkloadRef,
)

from . import action, spring
from .config import config_class, parse_config
from .error import PluginError
from .event import (
    CONFIG_MAP,
    SECRET,
    Workload,
    annotation,
    api_version,
    describe,
    is_config_map,
    is_kind,
    is_secret,
    is_workload_kind,
    kind_name,
    label,
    lookup,
    object_id,
    object_type,
    other_kind,
    text,
    uses_any_of,
    uses_only_keys,
)

__all__ = [
    # The plugin itself.
    "Plugin",
    "PluginError",
    "Err",
    "host",
    # Helpers.
    "action",
    "spring",
    "parse_config",
    "config_class",
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
    "CONFIG_MAP",
    "SECRET",
    "other_kind",
    "Workload",
    "is_workload_kind",
    "api_version",
    "describe",
    "uses_only_keys",
    "uses_any_of",
    "log",
    # Generated types.
    "Action",
    "Action_Event",
    "Action_Http",
    "Action_Publish",
    "Action_RefreshService",
    "Action_Restart",
    "BusPublish",
    "ChangeEvent",
    "ChangeType",
    "DataEntry",
    "DataValue",
    "DataValue_Binary",
    "DataValue_Text",
    "EmitEvent",
    "Endpoint",
    "EventType",
    "Header",
    "HttpCall",
    "HttpMethod",
    "KeyValue",
    "LogLevel",
    "ObjectKind",
    "ObjectKind_ConfigMap",
    "ObjectKind_Other",
    "ObjectKind_Secret",
    "ObjectType",
    "ObjectUse",
    "RefreshService",
    "RestartStrategy",
    "RestartWorkload",
    "ServiceInfo",
    "ServicePort",
    "UseVia",
    "WorkloadInfo",
    "WorkloadRef",
]

Plugin = wit_world.WitWorld
"""The base class of a plugin: subclass it as ``WitWorld`` in your app
module and implement ``check_config(self, config: str) -> None`` and
``handle(self, event: ChangeEvent) -> list[Action]``."""


def log(level: LogLevel, message: str) -> None:
    """Writes a line to the host's log, tagged with the plugin's name."""
    host.log(level, message)

