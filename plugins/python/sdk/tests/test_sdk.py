"""Unit tests of the SDK on the host's CPython (no wasm): config parsing,
event accessors, action builders and Spring target apps, with the host
imports replaced by fakes. Run with ../test (it generates the bindings)."""

from __future__ import annotations

import dataclasses
import enum
import unittest
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

import wasmwatch_plugin as ww
from wasmwatch_plugin import spring
from wit_world.imports import host


def event(kind=ww.ObjectKind.CONFIG_MAP, name="orders", annotations=None, data=None):
    return ww.ChangeEvent(
        kind=kind,
        change=ww.ChangeType.MODIFIED,
        namespace="shop",
        name=name,
        uid="u-1",
        resource_version="42",
        labels=[ww.KeyValue("team", "checkout")],
        annotations=[ww.KeyValue(k, v) for k, v in (annotations or {}).items()],
        data=data or [],
        values_included=True,
        changed_keys=[],
        digest="d",
        replay=False,
    )


def service(name, labels=None):
    return ww.ServiceInfo("shop", name, [ww.KeyValue(k, v) for k, v in (labels or {}).items()], [], [])


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@dataclass
class Inner:
    url: str


@dataclass
class Config:
    connection: str
    base_path: str = "/actuator"
    strategy: Literal["refresh", "shutdown"] = "refresh"
    retries: int = 3
    ratio: float = 0.5
    enabled: bool = True
    mode: Mode = Mode.FAST
    note: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    extra: Dict[str, int] = field(default_factory=dict)
    inner: Optional[Inner] = None
    raw: Any = None
    odd_name: str = field(default="", metadata={"json": "odd-name"})


@ww.config_class
@dataclass
class Decorated:
    connection: str
    inner: Optional[Inner] = None
    strategy: Literal["refresh", "shutdown"] = "refresh"


class ConfigClass(unittest.TestCase):
    """`config_class` resolves field types at import (the build snapshots
    it), so that no call evaluates annotations again."""

    def test_resolved_at_decoration_and_never_in_a_call(self):
        schemas = ww.config._SCHEMAS
        self.assertIn(Decorated, schemas)
        self.assertIn(Inner, schemas, "nested dataclasses are reached through Optional")
        real = ww.config.typing.get_type_hints

        def refuse(*args, **kwargs):
            raise AssertionError("annotations evaluated in a call")

        ww.config.typing.get_type_hints = refuse
        try:
            self.assertEqual(
                ww.parse_config("p", '{"connection": "c", "inner": {"url": "u"}}', Decorated),
                Decorated("c", Inner("u")),
            )
            with self.assertRaises(ww.PluginError) as caught:
                ww.parse_config("p", '{"connection": "c", "strategy": "x"}', Decorated)
            self.assertEqual(
                caught.exception.value,
                "p config: strategy: unknown variant `x`, expected `refresh` or `shutdown`",
            )
            with self.assertRaises(ww.PluginError) as caught:
                ww.parse_config("p", "{}", Decorated)
            self.assertEqual(caught.exception.value, "p config: missing field `connection`")
        finally:
            ww.config.typing.get_type_hints = real

    def test_refuses_what_is_not_a_dataclass(self):
        with self.assertRaises(TypeError):
            ww.config_class(int)


class ParseConfig(unittest.TestCase):
    def err(self, text, into=Config):
        with self.assertRaises(ww.PluginError) as caught:
            ww.parse_config("p", text, into)
        return caught.exception.value

    def test_empty_and_null_are_an_empty_object(self):
        self.assertEqual(ww.parse_config("p", "", dict), {})
        self.assertEqual(ww.parse_config("p", " null ", dict), {})
        self.assertEqual(self.err(""), "p config: missing field `connection`")

    def test_fields_defaults_and_types(self):
        c = ww.parse_config(
            "p",
            '{"connection": "rabbit", "basePath": "/m", "strategy": "shutdown", "retries": 5,'
            ' "ratio": 1, "enabled": false, "mode": "safe", "note": null, "tags": ["a"],'
            ' "extra": {"x": 1}, "inner": {"url": "u"}, "raw": [1, {"a": 2}], "odd-name": "o"}',
            Config,
        )
        self.assertEqual(
            c,
            Config("rabbit", "/m", "shutdown", 5, 1.0, False, Mode.SAFE, None, ["a"], {"x": 1}, Inner("u"), [1, {"a": 2}], "o"),
        )
        self.assertEqual(ww.parse_config("p", '{"connection": "c"}', Config), Config("c"))

    def test_errors_name_the_field(self):
        self.assertEqual(
            self.err('{"connection": "c", "base_path": "/x"}'),
            "p config: unknown field `base_path`, expected one of `connection`, `basePath`, `strategy`,"
            " `retries`, `ratio`, `enabled`, `mode`, `note`, `tags`, `extra`, `inner`, `raw`, `odd-name`",
        )
        self.assertEqual(
            self.err('{"connection": "c", "strategy": "x"}'),
            "p config: strategy: unknown variant `x`, expected `refresh` or `shutdown`",
        )
        self.assertEqual(
            self.err('{"connection": "c", "retries": true}'),
            "p config: retries: invalid type: boolean `true`, expected an integer",
        )
        self.assertEqual(
            self.err('{"connection": "c", "tags": ["a", 1]}'),
            "p config: tags[1]: invalid type: number `1`, expected a string",
        )
        self.assertEqual(
            self.err('{"connection": "c", "inner": {}}'),
            "p config: inner: missing field `url`",
        )
        self.assertEqual(
            self.err('{"connection": "c", "mode": "slow"}'),
            'p config: mode: unknown variant string "slow", expected `fast` or `safe`',
        )
        self.assertEqual(self.err("[1]"), "p config: invalid type: an array, expected an object")
        self.assertTrue(self.err("{").startswith("p config: Expecting property name"))
        self.assertEqual(self.err("[]", dict), "p config: invalid type: an array, expected an object")

    def test_json_name(self):
        names = [ww.config.json_name(f) for f in dataclasses.fields(Config)]
        self.assertIn("basePath", names)
        self.assertIn("odd-name", names)


class Accessors(unittest.TestCase):
    def test_event(self):
        ev = event(
            annotations={"a": "1"},
            data=[
                ww.DataEntry("t", ww.DataValue_Text("hi")),
                ww.DataEntry("b", ww.DataValue_Binary(b"\0")),
                ww.DataEntry("w", None),
            ],
        )
        self.assertEqual(ww.annotation(ev, "a"), "1")
        self.assertIsNone(ww.annotation(ev, "b"))
        self.assertEqual(ww.label(ev, "team"), "checkout")
        self.assertEqual(ww.text(ev, "t"), "hi")
        self.assertIsNone(ww.text(ev, "b"))
        self.assertIsNone(ww.text(ev, "w"))
        self.assertIsNone(ww.text(ev, "missing"))
        self.assertTrue(ww.is_config_map(ev))
        self.assertFalse(ww.is_secret(ev))
        self.assertEqual(ww.kind_name(ev), "ConfigMap")
        self.assertEqual(ww.kind_name(event(kind=ww.ObjectKind.SECRET)), "Secret")
        self.assertEqual(ww.object_id(ev), "shop/orders")

    def test_actions(self):
        self.assertEqual(
            ww.action.refresh_service("shop", "orders", ww.HttpMethod.POST, None, "/a/refresh"),
            ww.Action_RefreshService(ww.RefreshService("shop", "orders", ww.HttpMethod.POST, None, "/a/refresh", False)),
        )
        self.assertEqual(
            ww.action.publish_json("rabbit", "bus", "#", '{"a":1}'),
            ww.Action_Publish(ww.BusPublish("rabbit", "bus", "#", [ww.Header("content-type", "application/json")], b'{"a":1}')),
        )
        ref = ww.WorkloadRef(ww.WorkloadKind.DEPLOYMENT, "shop", "orders")
        self.assertEqual(
            ww.action.restart(ref, "changed", "h"),
            ww.Action_Restart(ww.RestartWorkload(ref, "changed", "h")),
        )
        self.assertEqual(
            ww.action.event_warning("Bad", "m"),
            ww.Action_Event(ww.EmitEvent(ww.EventType.WARNING, "Bad", "m")),
        )
        self.assertEqual(
            ww.action.http(ww.HttpMethod.PUT, "https://x/y", {"a": "b"}, "body"),
            ww.Action_Http(ww.HttpCall(ww.HttpMethod.PUT, "https://x/y", [ww.Header("a", "b")], b"body")),
        )


class Spring(unittest.TestCase):
    def setUp(self):
        self.services = {"orders": service("orders", {"tier": "front"}), "billing": service("billing", {"tier": "back"})}
        self.saved = (host.service, host.services_with_labels)
        host.service = lambda ns, name: self.services.get(name) if ns == "shop" else None
        host.services_with_labels = lambda ns, labels: [
            s for s in self.services.values() if all(ww.lookup(s.labels, kv.key) == kv.value for kv in labels)
        ]

    def tearDown(self):
        host.service, host.services_with_labels = self.saved

    def test_named(self):
        apps = spring.target_apps(event(annotations={"spring.cloud.kubernetes.configmap.apps": " billing, ghost,,billing "}))
        self.assertEqual(apps, spring.Named(["billing", "ghost", "billing"]))
        self.assertEqual(apps.names(), ["billing", "ghost"])
        self.assertEqual([s.name for s in apps.services("shop")], ["billing", "billing"])

    def test_labelled_and_secret_prefix(self):
        apps = spring.target_apps(
            event(kind=ww.ObjectKind.SECRET, annotations={"spring.cloud.kubernetes.secret.labels": "tier = back, junk"})
        )
        self.assertEqual(apps.names(), ["billing"])
        ignored = spring.target_apps(
            event(kind=ww.ObjectKind.SECRET, annotations={"spring.cloud.kubernetes.configmap.apps": "billing"})
        )
        self.assertEqual(ignored, spring.ObjectName("orders"))

    def test_object_name(self):
        self.assertEqual([s.name for s in spring.target_apps(event()).services("shop")], ["orders"])
        self.assertEqual(spring.target_apps(event(name="ghost")).services("shop"), [])
        self.assertEqual(spring.parse_labels("a=b, c = d ,e"), [ww.KeyValue("a", "b"), ww.KeyValue("c", "d")])


if __name__ == "__main__":
    unittest.main()
