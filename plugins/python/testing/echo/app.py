"""echo: a test plugin that says what the 0.4.0 contract brought it, so a
host test sees each field cross the component boundary
(host/runtime/tests/wit_v3.rs). For every change it asks the host for the
workloads referencing the object and answers, for each, a Normal Event
``Workload`` with ``<apiVersion> <Kind> <namespace>/<name> referenced=<bool>
uses=<via[:key],...>`` and a restart of it with the strategy
``restart-at``; and one Event ``Object`` with the object's kind
(``<group>/<version>/<Kind>``) and its data keys.
"""

from __future__ import annotations

from typing import List

from wasmwatch_plugin import (
    Action,
    ChangeEvent,
    Plugin,
    RestartStrategy,
    UseVia,
    action,
    api_version,
    describe,
    host,
    object_type,
)

VIA = {UseVia.ENV: "env", UseVia.ENV_FROM: "env-from", UseVia.VOLUME: "volume"}


class WitWorld(Plugin):
    def check_config(self, config: str) -> None:
        return None

    def handle(self, event: ChangeEvent) -> List[Action]:
        t = object_type(event)
        keys = ",".join(d.key for d in event.data)
        out = [action.event_normal("Object", f"{t.group}/{t.version}/{t.kind} {keys}")]
        for w in host.workloads_referencing(event.kind, event.namespace, event.name):
            uses = ",".join(
                VIA[u.via] + (f":{u.key}" if u.key is not None else "") for u in w.uses
            )
            out.append(
                action.event_normal(
                    "Workload",
                    f"{api_version(w)} {describe(w)} referenced={str(w.referenced).lower()} uses={uses}",
                )
            )
            out.append(
                action.restart(w, "echo", f"echo/{event.name}:1", RestartStrategy.RESTART_AT)
            )
        return out
