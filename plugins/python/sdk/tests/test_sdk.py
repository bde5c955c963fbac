"""Unit tests of the SDK on the host's CPython (no wasm): config parsing,
event accessors, workload helpers, action builders and Spring target apps
on the types of WIT 0.4.0 (wit/0.4.0/plugin.wit), with the host imports
replaced by fakes. Run with ../test (it generates the bindings)."""

from __future__ import annotations

import dataclasses
import enum
import unittest
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

import wasmwatch_plugin as ww
from wasmwatch_plugin import spring
from wit_world.imports import host


def event(kind=ww.CONFIG_MAP, name="orders", annotations=None, data=None, changed_keys=None):
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
        changed_keys=changed_keys or [],
        digest="d",
        replay=False,
    )


SPCPS = ww.other_kind("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClassPodStatus")


def workload(group, version, kind, name, uses=(), referenced=True):
    """A WorkloadInfo as host.workloads_referencing returns it; ``uses`` are
    (via, key) pairs."""
    return ww.WorkloadInfo(
        workload=ww.WorkloadRef(group, version, kind, "shop", name),
        labels=[],
        annotations=[ww.KeyValue("reloader.stakater.com/auto", "true")],
        template_annotations=[],
        referenced=referenced,
        uses=[ww.ObjectUse(via, key) for via, key in uses],
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
        self.assertEqual(ww.kind_name(event(kind=ww.SECRET)), "Secret")
        self.assertEqual(ww.object_id(ev), "shop/orders")
        self.assertTrue(ww.is_kind(ev, "", "ConfigMap"))
        self.assertFalse(ww.is_kind(ev, "", "Secret"))
        self.assertEqual(ww.object_type(ev), ww.ObjectType("", "v1", "ConfigMap"))
        self.assertEqual(ww.CONFIG_MAP, ww.ObjectKind_ConfigMap())
        self.assertEqual(ww.SECRET, ww.ObjectKind_Secret())
        self.assertNotEqual(ww.CONFIG_MAP, ww.SECRET)

    def test_actions(self):
        self.assertEqual(
            ww.action.refresh_service("shop", "orders", ww.HttpMethod.POST, None, "/a/refresh"),
            ww.Action_RefreshService(ww.RefreshService("shop", "orders", ww.HttpMethod.POST, None, "/a/refresh", False)),
        )
        self.assertEqual(
            ww.action.publish_json("rabbit", "bus", "#", '{"a":1}'),
            ww.Action_Publish(ww.BusPublish("rabbit", "bus", "#", [ww.Header("content-type", "application/json")], b'{"a":1}')),
        )
        ref = ww.WorkloadRef("apps", "v1", "Deployment", "shop", "orders")
        self.assertEqual(
            ww.action.restart(ref, "changed", "h"),
            ww.Action_Restart(ww.RestartWorkload(ref, "changed", "h", None)),
        )
        self.assertEqual(
            ww.action.restart(ref, "changed", "h", ww.RestartStrategy.ENV_VARS),
            ww.Action_Restart(ww.RestartWorkload(ref, "changed", "h", ww.RestartStrategy.ENV_VARS)),
        )
        info = workload("apps", "v1", "Deployment", "orders")
        self.assertEqual(ww.action.restart(info, "changed", "h"), ww.action.restart(ref, "changed", "h"))
        self.assertEqual(
            ww.action.event_warning("Bad", "m"),
            ww.Action_Event(ww.EmitEvent(ww.EventType.WARNING, "Bad", "m")),
        )
        self.assertEqual(
            ww.action.http(ww.HttpMethod.PUT, "https://x/y", {"a": "b"}, "body"),
            ww.Action_Http(ww.HttpCall(ww.HttpMethod.PUT, "https://x/y", [ww.Header("a", "b")], b"body")),
        )
        self.assertEqual(
            ww.action.http_json(ww.HttpMethod.POST, "https://x/y", '{"a":1}'),
            ww.Action_Http(
                ww.HttpCall(ww.HttpMethod.POST, "https://x/y", [ww.Header("content-type", "application/json")], b'{"a":1}')
            ),
        )


class OtherKinds(unittest.TestCase):
    """WIT 0.4.0: ``object-kind`` is ``config-map``, ``secret`` or
    ``other(object-type)``."""

    def test_an_other_kind_event(self):
        ev = event(
            kind=SPCPS,
            name="web-0-aws-secrets",
            data=[ww.DataEntry("status.objects", ww.DataValue_Text('[{"id":"db","version":"2"}]'))],
        )
        self.assertIsInstance(ev.kind, ww.ObjectKind_Other)
        self.assertEqual(ev.kind.value, ww.ObjectType("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClassPodStatus"))
        self.assertFalse(ww.is_config_map(ev))
        self.assertFalse(ww.is_secret(ev))
        self.assertTrue(ww.is_kind(ev, "secrets-store.csi.x-k8s.io", "SecretProviderClassPodStatus"))
        self.assertFalse(ww.is_kind(ev, "", "SecretProviderClassPodStatus"))
        self.assertFalse(ww.is_kind(ev, "secrets-store.csi.x-k8s.io", "SecretProviderClass"))
        self.assertEqual(ww.kind_name(ev), "SecretProviderClassPodStatus")
        self.assertEqual(ww.object_type(ev).version, "v1")
        self.assertEqual(ww.text(ev, "status.objects"), '[{"id":"db","version":"2"}]')
        self.assertEqual(ww.object_id(ev), "shop/web-0-aws-secrets")

    def test_workloads_referencing_takes_the_variant(self):
        asked = []
        saved = host.workloads_referencing
        host.workloads_referencing = lambda kind, ns, name: asked.append((kind, ns, name)) or []
        try:
            spc = ww.other_kind("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClass")
            host.workloads_referencing(spc, "shop", "aws-secrets")
            host.workloads_referencing(ww.SECRET, "shop", "db")
        finally:
            host.workloads_referencing = saved
        self.assertEqual(
            asked,
            [
                (
                    ww.ObjectKind_Other(ww.ObjectType("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClass")),
                    "shop",
                    "aws-secrets",
                ),
                (ww.ObjectKind_Secret(), "shop", "db"),
            ],
        )


class Workloads(unittest.TestCase):
    """WIT 0.3.0 and 0.4.0: workloads by group/version/kind, ``referenced``,
    ``uses``, and restarts with a strategy."""

    def setUp(self):
        self.cronjob = workload("batch", "v1", "CronJob", "nightly", uses=[(ww.UseVia.ENV, "level")])
        self.rollout = workload(
            "argoproj.io",
            "v1alpha1",
            "Rollout",
            "web",
            uses=[(ww.UseVia.VOLUME, "a.yaml"), (ww.UseVia.VOLUME, "b.yaml")],
        )
        self.whole = workload("apps", "v1", "StatefulSet", "db", uses=[(ww.UseVia.ENV_FROM, None), (ww.UseVia.ENV, "level")])
        self.named = workload("apps", "v1", "Deployment", "api", referenced=False)
        self.saved = host.workloads_referencing

    def tearDown(self):
        host.workloads_referencing = self.saved

    def test_kinds_api_versions_and_descriptions(self):
        self.assertTrue(ww.is_workload_kind(self.cronjob, "batch", "v1", "CronJob"))
        self.assertTrue(ww.is_workload_kind(self.cronjob.workload, "batch", "v1", "CronJob"))
        self.assertFalse(ww.is_workload_kind(self.cronjob, "batch", "v1beta1", "CronJob"))
        self.assertFalse(ww.is_workload_kind(self.cronjob, "", "v1", "CronJob"))
        self.assertTrue(ww.is_workload_kind(self.rollout, "argoproj.io", "v1alpha1", "Rollout"))
        self.assertEqual(ww.api_version(self.cronjob), "batch/v1")
        self.assertEqual(ww.api_version(self.rollout.workload), "argoproj.io/v1alpha1")
        self.assertEqual(ww.api_version(ww.WorkloadRef("", "v1", "Pod", "shop", "p")), "v1")
        self.assertEqual(ww.describe(self.cronjob), "CronJob shop/nightly")
        self.assertEqual(ww.describe(self.rollout.workload), "Rollout shop/web")

    def test_uses_only_keys_and_uses_any_of(self):
        self.assertTrue(ww.uses_only_keys(self.cronjob))
        self.assertTrue(ww.uses_only_keys(self.rollout))
        self.assertFalse(ww.uses_only_keys(self.whole), "envFrom takes the whole object")
        self.assertFalse(ww.uses_only_keys(self.named), "not referenced: nothing known of its uses")
        self.assertFalse(
            ww.uses_only_keys(workload("apps", "v1", "Deployment", "x", uses=[(ww.UseVia.ENV, "k")], referenced=False))
        )
        self.assertFalse(ww.uses_only_keys(workload("apps", "v1", "Deployment", "x")), "no uses known")
        self.assertTrue(ww.uses_any_of(self.cronjob, ["level"]))
        self.assertFalse(ww.uses_any_of(self.cronjob, ["other", "a.yaml"]))
        self.assertTrue(ww.uses_any_of(self.rollout, ("b.yaml",)))
        self.assertFalse(ww.uses_any_of(self.rollout, []))
        self.assertTrue(ww.uses_any_of(self.whole, []), "the whole object: any change")
        self.assertTrue(ww.uses_any_of(self.named, []))

    def test_round_trip_of_the_0_4_0_fields(self):
        """A key-aware plugin over the lookup: the fields it reads are the
        fields the host gave, and its restarts carry the workloads' refs
        and the strategy it chose."""
        found = [self.cronjob, self.rollout, self.whole, self.named]
        asked = []

        def workloads_referencing(kind, namespace, name):
            asked.append((kind, namespace, name))
            return found

        host.workloads_referencing = workloads_referencing
        ev = event(changed_keys=["level"])

        def decide(ev):
            actions = []
            for w in host.workloads_referencing(ev.kind, ev.namespace, ev.name):
                if not ww.uses_any_of(w, ev.changed_keys):
                    continue
                rollout = ww.is_workload_kind(w, "argoproj.io", "v1alpha1", "Rollout")
                strategy = ww.RestartStrategy.RESTART_AT if rollout else None
                if not w.referenced:
                    strategy = ww.RestartStrategy.ANNOTATIONS
                actions.append(ww.action.restart(w, f"{ww.kind_name(ev)} {ww.object_id(ev)} changed", "configmap/orders:d", strategy))
            return actions

        self.assertEqual(
            [a.value for a in decide(ev)],
            [
                ww.RestartWorkload(
                    ww.WorkloadRef("batch", "v1", "CronJob", "shop", "nightly"), "ConfigMap shop/orders changed", "configmap/orders:d", None
                ),
                ww.RestartWorkload(
                    ww.WorkloadRef("apps", "v1", "StatefulSet", "shop", "db"), "ConfigMap shop/orders changed", "configmap/orders:d", None
                ),
                ww.RestartWorkload(
                    ww.WorkloadRef("apps", "v1", "Deployment", "shop", "api"),
                    "ConfigMap shop/orders changed",
                    "configmap/orders:d",
                    ww.RestartStrategy.ANNOTATIONS,
                ),
            ],
        )
        self.assertEqual(asked, [(ww.CONFIG_MAP, "shop", "orders")])
        restarted = decide(event(changed_keys=["a.yaml"]))
        self.assertEqual([ww.describe(a.value.workload) for a in restarted], ["Rollout shop/web", "StatefulSet shop/db", "Deployment shop/api"])
        self.assertEqual(restarted[0].value.strategy, ww.RestartStrategy.RESTART_AT)
        # The generated records keep every field as given.
        self.assertEqual(
            self.rollout.uses,
            [ww.ObjectUse(ww.UseVia.VOLUME, "a.yaml"), ww.ObjectUse(ww.UseVia.VOLUME, "b.yaml")],
        )
        self.assertEqual(dataclasses.asdict(self.cronjob.workload), {
            "group": "batch", "version": "v1", "kind": "CronJob", "namespace": "shop", "name": "nightly",
        })
        self.assertEqual([f.name for f in dataclasses.fields(ww.WorkloadInfo)][-2:], ["referenced", "uses"])
        self.assertEqual([f.name for f in dataclasses.fields(ww.RestartWorkload)][-1], "strategy")
        self.assertEqual([s.name for s in ww.RestartStrategy], ["ANNOTATIONS", "ENV_VARS", "RESTART_AT"])
        self.assertEqual([v.name for v in ww.UseVia], ["ENV", "ENV_FROM", "VOLUME"])


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
            event(kind=ww.SECRET, annotations={"spring.cloud.kubernetes.secret.labels": "tier = back, junk"})
        )
        self.assertEqual(apps.names(), ["billing"])
        ignored = spring.target_apps(
            event(kind=ww.SECRET, annotations={"spring.cloud.kubernetes.configmap.apps": "billing"})
        )
        self.assertEqual(ignored, spring.ObjectName("orders"))

    def test_object_name(self):
        self.assertEqual([s.name for s in spring.target_apps(event()).services("shop")], ["orders"])
        self.assertEqual(spring.target_apps(event(name="ghost")).services("shop"), [])
        self.assertEqual(spring.parse_labels("a=b, c = d ,e"), [ww.KeyValue("a", "b"), ww.KeyValue("c", "d")])

    def test_other_kinds_have_no_target_apps(self):
        """An object of another kind: no apps, and no lookup at all (the
        Spring watcher knows ConfigMaps and Secrets only), whatever its
        annotations say."""

        def refuse(*args):
            raise AssertionError("looked up Services for another kind")

        host.service = host.services_with_labels = refuse
        for annotations in [
            {},
            {"spring.cloud.kubernetes.configmap.apps": "billing"},
            {"spring.cloud.kubernetes.secret.labels": "tier=back"},
        ]:
            apps = spring.target_apps(event(kind=SPCPS, annotations=annotations))
            self.assertEqual(apps, spring.Named([]))
            self.assertEqual(apps.services("shop"), [])
            self.assertEqual(apps.names(), [])
        self.assertIsNone(spring.annotation_prefix(SPCPS))
        self.assertEqual(spring.annotation_prefix(ww.CONFIG_MAP), "spring.cloud.kubernetes.configmap")
        self.assertEqual(spring.annotation_prefix(ww.SECRET), "spring.cloud.kubernetes.secret")


if __name__ == "__main__":
    unittest.main()
