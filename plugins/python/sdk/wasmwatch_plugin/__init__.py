"""wasmwatch_plugin: write a wasmwatch plugin in a few lines of Python.

A plugin is a WebAssembly component of the world
``wasmwatch:plugin/plugin@0.2.0`` (``wit/plugin.wit``), built with
componentize-py, which generates the bindings (the ``wit_world`` package)
at build time. This SDK sits beside them and offers:

- every generated type (:class:`ChangeEvent`, :data:`Action`,
  :class:`ServiceInfo`, ...) and the :mod:`host` imports;
- :class:`Plugin`, the base class of your ``WitWorld`` class, and
  :class:`PluginError`, the exception that makes ``check_config`` or
  ``handle`` return an error;
- event accessors: :func:`annotation`, :func:`label`, :func:`text`,
  :func:`is_config_map`, :func:`is_secret`, :func:`kind_name`,
  :func:`object_id`, and :func:`lookup` for any label/annotation list;
- :mod:`~wasmwatch_plugin.action`: builders for the actions a plugin returns;
- :func:`parse_config`: the plugin's JSON config into a dict or a dataclass,
  refusing unknown fields; :func:`config_class` resolves a config
  dataclass at build time;
- :mod:`~wasmwatch_plugin.spring`: Spring Cloud Kubernetes target apps.

A plugin (``app.py``)::

    from wasmwatch_plugin import Action, ChangeEvent, Plugin, action, object_id

    class WitWorld(Plugin):
        def check_config(self, config: str) -> None:
            pass

        def handle(self, event: ChangeEvent) -> list[Action]:
            return [action.event_normal("Seen", object_id(event))]

built with ``componentize-py -d wit -w plugin componentize -p sdk -p . app
-o plugin.wasm``. The class must be called ``WitWorld`` and live in the
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
    RefreshService,
    RestartWorkload,
    ServiceInfo,
    ServicePort,
    WorkloadInfo,
    WorkloadKind,
    WorkloadRef,
)

from . import action, spring
from .config import config_class, parse_config
from .error import PluginError
from .event import (
    annotation,
    is_config_map,
    is_secret,
    kind_name,
    label,
    lookup,
    object_id,
    text,
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
    "kind_name",
    "object_id",
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
    "RefreshService",
    "RestartWorkload",
    "ServiceInfo",
    "ServicePort",
    "WorkloadInfo",
    "WorkloadKind",
    "WorkloadRef",
]

Plugin = wit_world.WitWorld
"""The base class of a plugin: subclass it as ``WitWorld`` in your app
module and implement ``check_config(self, config: str) -> None`` and
``handle(self, event: ChangeEvent) -> list[Action]``."""


def log(level: LogLevel, message: str) -> None:
    """Writes a line to the host's log, tagged with the plugin's name."""
    host.log(level, message)

