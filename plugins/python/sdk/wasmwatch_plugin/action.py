"""Builders for the actions a plugin returns. The host checks each one
against the plugin's capabilities before executing it."""

from __future__ import annotations

from typing import Optional, Union

from wit_world.imports.types import (
    Action,
    Action_Event,
    Action_Http,
    Action_Publish,
    Action_RefreshService,
    Action_Restart,
    BusPublish,
    EmitEvent,
    EventType,
    Header,
    HttpCall,
    HttpMethod,
    RefreshService,
    RestartStrategy,
    RestartWorkload,
    WorkloadInfo,
    WorkloadRef,
)

__all__ = [
    "refresh_service",
    "publish_json",
    "restart",
    "event_normal",
    "event_warning",
    "http",
    "http_json",
]


def refresh_service(
    namespace: str,
    service: str,
    method: HttpMethod,
    port: Optional[int],
    path: str,
    *,
    tls: bool = False,
) -> Action:
    """``method path`` on every ready pod of Service ``namespace/service``,
    over http (https with ``tls=True``); ``port=None`` takes each endpoint's
    first port. Needs the ``refresh`` capability."""
    return Action_RefreshService(RefreshService(namespace, service, method, port, path, tls))


def publish_json(
    connection: str,
    destination: str,
    routing_key: str,
    json: Union[str, bytes],
) -> Action:
    """A JSON message on bus connection ``connection`` (a ``buses`` entry of
    the manifest) to ``destination`` (AMQP exchange or NATS subject), with
    header ``content-type: application/json``. ``json`` is the serialised
    message (``str`` is encoded as UTF-8). Needs ``bus: [connection/destination]``."""
    payload = json.encode() if isinstance(json, str) else bytes(json)
    return Action_Publish(
        BusPublish(
            connection,
            destination,
            routing_key,
            [Header("content-type", "application/json")],
            payload,
        )
    )


def restart(
    workload: Union[WorkloadRef, WorkloadInfo],
    reason: str,
    content_hash: str,
    strategy: Optional[RestartStrategy] = None,
) -> Action:
    """Roll ``workload``'s pods (a :class:`WorkloadRef`, or a
    :class:`WorkloadInfo` from ``host.workloads_referencing``: its
    ``workload``). The host records ``content_hash`` and never restarts the
    same workload twice for the same hash.

    ``strategy`` (a :class:`RestartStrategy`) replaces the plugin's
    ``delivery.restartStrategy`` for this restart: ``ANNOTATIONS``,
    ``ENV_VARS``, or ``RESTART_AT`` (an Argo Rollout's ``spec.restartAt``,
    refused for other kinds); ``None`` keeps it. A workload's
    ``wasmwatch.io/reload-strategy`` annotation still wins.

    Needs ``restart`` (and, for kinds other than the apps/v1 ones, the kind
    granted: ``restart: {namespaces: [...], kinds: [batch/v1/CronJob]}``)."""
    ref = workload.workload if isinstance(workload, WorkloadInfo) else workload
    return Action_Restart(RestartWorkload(ref, reason, content_hash, strategy))


def event_normal(reason: str, message: str) -> Action:
    """A Normal Kubernetes Event on the changed object (``reason`` in
    UpperCamelCase). Needs ``events``."""
    return Action_Event(EmitEvent(EventType.NORMAL, reason, message))


def event_warning(reason: str, message: str) -> Action:
    """A Warning Kubernetes Event on the changed object. Needs ``events``."""
    return Action_Event(EmitEvent(EventType.WARNING, reason, message))


def http(
    method: HttpMethod,
    url: str,
    headers: Optional[dict[str, str]] = None,
    body: Optional[Union[str, bytes]] = None,
) -> Action:
    """One HTTP call. Needs an ``http`` grant matching ``url``; the host
    refuses ``Host``, ``Content-Length``, ``Transfer-Encoding`` and
    ``Connection`` headers."""
    data = body.encode() if isinstance(body, str) else body
    return Action_Http(
        HttpCall(
            method,
            url,
            [Header(k, v) for k, v in (headers or {}).items()],
            data,
        )
    )


def http_json(method: HttpMethod, url: str, json: Union[str, bytes]) -> Action:
    """:func:`http` with a JSON body (``str`` is encoded as UTF-8) and header
    ``content-type: application/json``."""
    return http(method, url, {"content-type": "application/json"}, json)
