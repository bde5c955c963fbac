"""{{name}}: a wasmwatch plugin. ``handle`` is called once per change of a
selected ConfigMap or Secret, in a fresh sandbox; what it returns is checked
against the manifest's capabilities and executed by the host."""

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
