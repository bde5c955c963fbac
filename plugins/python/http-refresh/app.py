"""http-refresh in Python: Spring Cloud Kubernetes-compatible actuator
refresh, the twin of plugins/http-refresh (same config, same actions, same
config errors), on the Python SDK's world ``wasmwatch:plugin/plugin@0.4.0``.

For a changed ConfigMap or Secret it finds the target apps the way the
Spring Cloud Kubernetes Configuration Watcher does and asks the host to POST
``<base>/refresh`` (or ``<base>/shutdown``) on every ready pod of each app's
Service:

- apps named in ``spring.cloud.kubernetes.configmap.apps`` /
  ``spring.cloud.kubernetes.secret.apps`` (comma-separated Service names), or
- Services whose labels match ``spring.cloud.kubernetes.configmap.labels`` /
  ``...secret.labels`` (``k=v,k2=v2``), or else
- the Service named like the object.

Apps without a Service are skipped. An object of another kind (WIT 0.4.0's
``other``, say a SecretProviderClassPodStatus a manifest's ``events.kinds``
gives the plugin) has no target apps: nothing is done, as in the Rust
plugin (the SDK's ``spring.target_apps`` returns no apps for it).

The Service annotation ``boot.spring.io/actuator``
(``http://:9090/myactuator``) overrides the port and base path; the default
base path is ``/actuator`` and the default port the endpoint's first port.

Config (JSON from the manifest), all optional:
``{"strategy": "refresh" | "shutdown", "basePath": "/actuator"}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Literal, Optional, Tuple

from wasmwatch_plugin import (
    Action,
    ChangeEvent,
    HttpMethod,
    LogLevel,
    Plugin,
    PluginError,
    action,
    config_class,
    host,
    log,
    lookup,
    object_id,
    parse_config,
    spring,
)


@config_class
@dataclass
class Config:
    strategy: Literal["refresh", "shutdown"] = "refresh"
    base_path: str = "/actuator"


def config(text: str) -> Config:
    parsed = parse_config("http-refresh", text, Config)
    if not parsed.base_path.startswith("/"):
        raise PluginError(
            f"http-refresh config: basePath must start with '/', got {json.dumps(parsed.base_path)}"
        )
    return parsed


def _strip_prefix_repeatedly(text: str, prefix: str) -> str:
    while text.startswith(prefix):
        text = text[len(prefix) :]
    return text


def _port(text: str) -> Optional[int]:
    digits = text[1:] if text.startswith("+") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    port = int(digits)
    return port if port <= 65535 else None


def parse_actuator(value: str) -> Tuple[Optional[int], Optional[str]]:
    """``http://:9090/myactuator`` -> ``(9090, "/myactuator")``."""
    rest = _strip_prefix_repeatedly(value.strip(), "http://")
    rest = _strip_prefix_repeatedly(rest, "https://")
    slash = rest.find("/")
    if slash >= 0:
        authority, path = rest[:slash], rest[slash:].rstrip("/")
    else:
        authority, path = rest, None
    _, colon, port = authority.rpartition(":")
    return (_port(port) if colon else None, path or None)


class WitWorld(Plugin):
    def check_config(self, config_json: str) -> None:
        config(config_json)

    def handle(self, event: ChangeEvent) -> List[Action]:
        cfg = config(host.config())
        services = spring.target_apps(event).services(event.namespace)
        if not services:
            log(LogLevel.DEBUG, f"no app Service found for {object_id(event)}")
        actions = []
        for svc in services:
            actuator = lookup(svc.annotations, "boot.spring.io/actuator")
            port, base = parse_actuator(actuator) if actuator is not None else (None, None)
            path = f"{(base or cfg.base_path).rstrip('/')}/{cfg.strategy}"
            actions.append(action.refresh_service(svc.namespace, svc.name, HttpMethod.POST, port, path))
        return actions
