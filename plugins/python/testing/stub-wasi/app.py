"""stub-wasi: a plugin built with componentize-py's ``--stub-wasi`` (its
``componentize-flags`` file), which replaces every WASI import with a stub
inside the component. Such a component has more core module instances
than a plain build (38 against 14 with componentize-py 0.25.1), which the
host's sandbox pool must take (host/runtime/tests/sandbox.rs). It answers
every change with one Normal Event naming the object, its kind and the
keys that changed.
"""

from __future__ import annotations

from typing import List

from wasmwatch_plugin import Action, ChangeEvent, Plugin, action, kind_name


class WitWorld(Plugin):
    def check_config(self, config: str) -> None:
        return None

    def handle(self, event: ChangeEvent) -> List[Action]:
        keys = ",".join(event.changed_keys)
        return [
            action.event_normal(
                "Seen",
                f"{kind_name(event)} {event.namespace}/{event.name}: {keys}",
            )
        ]
