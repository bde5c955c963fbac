"""{{name}}: a wasmwatch plugin (world ``wasmwatch:plugin/plugin@0.4.0``,
wit/0.4.0/plugin.wit). ``handle`` is called once per change of a selected
ConfigMap or Secret (or of another kind the manifest's ``watch.kinds``
names: ``kind_name`` gives its kind, ``is_kind(event, group, kind)`` tells
kinds apart), in a fresh sandbox; what it returns is checked against the
manifest's capabilities and executed by the host. The SDK's helpers are
in sdk/wasmwatch_plugin (``action``, ``spring``, ``uses_any_of``, ...)."""

from dataclasses import dataclass

from wasmwatch_plugin import (
    Action,
    ChangeEvent,
    Plugin,
    action,
    config_class,
    kind_name,
    object_id,
    parse_config,
)


# Resolved at build time (the snapshot), not in every call.
@config_class
@dataclass
class Config:
    """The manifest's ``config``; unknown fields are refused at start-up."""


class WitWorld(Plugin):
    def check_config(self, config: str) -> None:
        parse_config("{{name}}", config, Config)

    def handle(self, event: ChangeEvent) -> list[Action]:
        return [
            action.event_normal(
                "Changed", f"{kind_name(event)} {object_id(event)} changed"
            )
        ]
