// wasmwatch JavaScript plugin SDK: helpers over the bindings that
// componentize-js generates for the world `wasmwatch:plugin/plugin@0.4.0`
// (wit/0.4.0/plugin.wit). The same helpers as the Rust SDK (plugins/sdk):
//
// - event accessors: annotation, label, text, isConfigMap, isSecret,
//   isKind, kindName, objectId, and lookup for any label/annotation list;
// - workload helpers (the Rust SDK's WorkloadExt): isWorkloadKind,
//   apiVersion, describe, usesOnlyKeys, usesAnyOf;
// - object kinds for lookups: CONFIG_MAP, SECRET, otherKind;
// - action builders (./action.js): refreshService, publishJson, restart
//   (with an optional restart strategy), eventNormal, eventWarning, http;
// - parseConfig: the plugin's JSON config checked against a field spec,
//   unknown fields refused;
// - Spring Cloud Kubernetes target-app resolution (./spring.js): targetApps;
// - PluginError: throw it (or a string) to return the WIT `result`'s error.
//
// A plugin is an ES module exporting `checkConfig(json)` and
// `handle(event)`; see plugins/js/README.md.
//
// How componentize-js maps the WIT types (the objects below follow it):
// records are objects with camelCase fields (`resourceVersion`); enums are
// their kebab-case case names as strings (`'env-from'`, `'restart-at'`);
// variants are `{tag, val}` (`{tag: 'restart', val: {...}}`, `{tag:
// 'config-map'}` for a case without payload); `option<T>` is the value or
// `undefined`; `list<u8>` is a Uint8Array (an array of numbers is accepted
// too); a `result<T, E>` export returns T or throws: a thrown string, or an
// object with a `payload` own property (PluginError), becomes the error;
// any other thrown Error traps the call (like a Rust panic).
//
// Since 0.3.0 a workload is named by `group`, `version` and `kind`
// (strings: `apps`/`v1`/`Deployment`, `batch`/`v1`/`CronJob`,
// `argoproj.io`/`v1alpha1`/`Rollout`), and `workloadsReferencing` tells
// whether each workload's pod template references the object
// (`referenced`) and how it uses it (`uses`). Since 0.4.0 the changed
// object may be of another kind than ConfigMap and Secret (`kind` is
// `{tag: 'other', val: {group, version, kind}}`, a kind the manifest's
// `watch.kinds` names); its `data` holds one entry per content field path.

import { log as hostLog } from 'wasmwatch:plugin/host@0.4.0';

export * as host from 'wasmwatch:plugin/host@0.4.0';
export * as action from './action.js';
export { targetApps, SpringApps, annotationPrefix, parseLabels } from './spring.js';

/**
 * @typedef {{group: string, version: string, kind: string}} ObjectType
 * @typedef {{tag: 'config-map', val?: undefined} | {tag: 'secret', val?: undefined}
 *   | {tag: 'other', val: ObjectType}} ObjectKind
 * @typedef {'added' | 'modified' | 'deleted' | 'resynced'} ChangeType
 * @typedef {{key: string, value: string}} KeyValue
 * @typedef {{tag: 'text', val: string} | {tag: 'binary', val: Uint8Array}} DataValue
 * @typedef {{key: string, value: DataValue | undefined}} DataEntry
 * @typedef {{
 *   kind: ObjectKind, change: ChangeType, namespace: string, name: string,
 *   uid: string, resourceVersion: string, labels: KeyValue[],
 *   annotations: KeyValue[], data: DataEntry[], valuesIncluded: boolean,
 *   changedKeys: string[], digest: string, replay: boolean
 * }} ChangeEvent
 * @typedef {'get' | 'post' | 'put' | 'patch' | 'delete'} HttpMethod
 * @typedef {{name: string, value: string}} Header
 * @typedef {{group: string, version: string, kind: string, namespace: string,
 *   name: string}} WorkloadRef
 * @typedef {'env' | 'env-from' | 'volume'} UseVia
 * @typedef {{via: UseVia, key: string | undefined}} ObjectUse
 * @typedef {{workload: WorkloadRef, labels: KeyValue[], annotations: KeyValue[],
 *   templateAnnotations: KeyValue[], referenced: boolean, uses: ObjectUse[]}} WorkloadInfo
 * @typedef {{name: string | undefined, port: number}} ServicePort
 * @typedef {{address: string, pod: string | undefined, ports: ServicePort[]}} Endpoint
 * @typedef {{namespace: string, name: string, labels: KeyValue[],
 *   annotations: KeyValue[], ports: ServicePort[]}} ServiceInfo
 * @typedef {'trace' | 'debug' | 'info' | 'warn' | 'error'} LogLevel
 * @typedef {{method: HttpMethod, url: string, headers: Header[], body: Uint8Array | undefined}} HttpCall
 * @typedef {{namespace: string, service: string, method: HttpMethod,
 *   port: number | undefined, path: string, tls: boolean}} RefreshService
 * @typedef {{connection: string, destination: string, routingKey: string,
 *   headers: Header[], payload: Uint8Array}} BusPublish
 * @typedef {'annotations' | 'env-vars' | 'restart-at'} RestartStrategy
 * @typedef {{workload: WorkloadRef, reason: string, contentHash: string,
 *   strategy: RestartStrategy | undefined}} RestartWorkload
 * @typedef {{eventType: 'normal' | 'warning', reason: string, message: string}} EmitEvent
 * @typedef {{tag: 'http', val: HttpCall} | {tag: 'refresh-service', val: RefreshService}
 *   | {tag: 'publish', val: BusPublish} | {tag: 'restart', val: RestartWorkload}
 *   | {tag: 'event', val: EmitEvent}} Action
 */

/**
 * An error a plugin returns: `check-config`'s or `handle`'s `err`. The
 * bindings take the `payload` own property as the error text.
 */
export class PluginError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'PluginError';
    /** @type {string} */
    this.payload = message;
  }
}

/**
 * Writes a line to the host's log, tagged with the plugin's name.
 * @param {LogLevel} level
 * @param {string} message
 */
export function log(level, message) {
  hostLog(level, String(message));
}

/**
 * The value of `key` in a list of labels or annotations.
 * @param {KeyValue[]} list
 * @param {string} key
 * @returns {string | undefined}
 */
export function lookup(list, key) {
  for (const kv of list) {
    if (kv.key === key) return kv.value;
  }
  return undefined;
}

/**
 * The value of annotation `key` on the changed object.
 * @param {ChangeEvent} event
 * @param {string} key
 */
export function annotation(event, key) {
  return lookup(event.annotations, key);
}

/**
 * The value of label `key` on the changed object.
 * @param {ChangeEvent} event
 * @param {string} key
 */
export function label(event, key) {
  return lookup(event.labels, key);
}

/**
 * The value of data key `key` when it is text and not withheld.
 * @param {ChangeEvent} event
 * @param {string} key
 * @returns {string | undefined}
 */
export function text(event, key) {
  const entry = event.data.find((d) => d.key === key);
  if (entry === undefined || entry.value === undefined) return undefined;
  return entry.value.tag === 'text' ? entry.value.val : undefined;
}

/** @param {ChangeEvent} event */
export function isConfigMap(event) {
  return event.kind.tag === 'config-map';
}

/** @param {ChangeEvent} event */
export function isSecret(event) {
  return event.kind.tag === 'secret';
}

/**
 * Whether the object is of kind `kind` in `group` (any version); the core
 * group is `''` (`isKind(event, '', 'ConfigMap')`).
 * @param {ChangeEvent} event
 * @param {string} group
 * @param {string} kind
 */
export function isKind(event, group, kind) {
  switch (event.kind.tag) {
    case 'config-map':
      return group === '' && kind === 'ConfigMap';
    case 'secret':
      return group === '' && kind === 'Secret';
    default:
      return event.kind.val.group === group && event.kind.val.kind === kind;
  }
}

/**
 * `ConfigMap`, `Secret`, or another kind's `kind`
 * (`SecretProviderClassPodStatus`).
 * @param {ChangeEvent} event
 * @returns {string}
 */
export function kindName(event) {
  switch (event.kind.tag) {
    case 'config-map':
      return 'ConfigMap';
    case 'secret':
      return 'Secret';
    default:
      return event.kind.val.kind;
  }
}

/**
 * `namespace/name`.
 * @param {ChangeEvent} event
 */
export function objectId(event) {
  return `${event.namespace}/${event.name}`;
}

/**
 * The ConfigMap kind, as `host.workloadsReferencing` takes it.
 * @type {ObjectKind}
 */
export const CONFIG_MAP = Object.freeze({ tag: 'config-map' });

/**
 * The Secret kind, as `host.workloadsReferencing` takes it.
 * @type {ObjectKind}
 */
export const SECRET = Object.freeze({ tag: 'secret' });

/**
 * Another kind by group, version and kind, as `host.workloadsReferencing`
 * takes it: `otherKind('secrets-store.csi.x-k8s.io', 'v1',
 * 'SecretProviderClass')`.
 * @param {string} group
 * @param {string} version
 * @param {string} kind
 * @returns {ObjectKind}
 */
export function otherKind(group, version, kind) {
  return { tag: 'other', val: { group, version, kind } };
}

/**
 * A WorkloadRef, or the one of a WorkloadInfo.
 * @param {WorkloadRef | WorkloadInfo} w
 * @returns {WorkloadRef}
 */
function workloadRef(w) {
  return 'workload' in w ? w.workload : w;
}

/**
 * Whether the workload (a WorkloadRef or a WorkloadInfo) is of
 * `group`/`version`/`kind`: `isWorkloadKind(w, 'apps', 'v1', 'Deployment')`.
 * @param {WorkloadRef | WorkloadInfo} w
 * @param {string} group
 * @param {string} version
 * @param {string} kind
 */
export function isWorkloadKind(w, group, version, kind) {
  const r = workloadRef(w);
  return r.group === group && r.version === version && r.kind === kind;
}

/**
 * `apiVersion` as Kubernetes writes it: `apps/v1`, or `v1` for the core
 * group.
 * @param {WorkloadRef | WorkloadInfo} w
 */
export function apiVersion(w) {
  const r = workloadRef(w);
  return r.group === '' ? r.version : `${r.group}/${r.version}`;
}

/**
 * `Kind namespace/name`, for logs and reasons.
 * @param {WorkloadRef | WorkloadInfo} w
 */
export function describe(w) {
  const r = workloadRef(w);
  return `${r.kind} ${r.namespace}/${r.name}`;
}

/**
 * Whether the pod template uses the object only through specific keys
 * (env `configMapKeyRef`/`secretKeyRef`, volume `items`): then a change
 * that touches none of them leaves the workload's pods as they are. False
 * when a use takes the whole object (`envFrom`, a volume without `items`),
 * when nothing is known of the uses, or when the workload is not
 * referenced (selected by a named `reload` annotation).
 * @param {WorkloadInfo} info
 */
export function usesOnlyKeys(info) {
  return info.referenced && info.uses.length > 0 && info.uses.every((u) => u.key !== undefined);
}

/**
 * Whether the change touches what the workload uses: one of the keys it
 * uses is in `changedKeys` (the event's `changedKeys`), or it uses the
 * whole object (see usesOnlyKeys).
 * @param {WorkloadInfo} info
 * @param {string[]} changedKeys
 */
export function usesAnyOf(info, changedKeys) {
  return !usesOnlyKeys(info) || info.uses.some((u) => u.key !== undefined && changedKeys.includes(u.key));
}

/**
 * The workload kind as Kubernetes names it. Since WIT 0.3.0 a
 * WorkloadRef's `kind` already is that (`Deployment`, `CronJob`); the
 * 0.2.0 enum names (`deployment`, `stateful-set`, `daemon-set`) are still
 * translated. Prefer `w.kind`, or `describe(w)`.
 * @deprecated
 * @param {string} kind
 * @returns {string}
 */
export function workloadKindName(kind) {
  switch (kind) {
    case 'deployment':
      return 'Deployment';
    case 'stateful-set':
      return 'StatefulSet';
    case 'daemon-set':
      return 'DaemonSet';
    default:
      return kind;
  }
}

/**
 * @typedef {'boolean' | 'string' | 'number' | 'integer' | 'array' | 'object' | 'any'} FieldType
 * @typedef {{type: FieldType, default?: unknown, required?: boolean,
 *   nullable?: boolean, oneOf?: unknown[], items?: FieldType}} FieldSpec
 */

/**
 * serde's words for a JSON value, so errors read like the Rust plugins'.
 * @param {unknown} value
 */
function describeValue(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'sequence';
  switch (typeof value) {
    case 'boolean':
      return `boolean \`${value}\``;
    case 'string':
      return `string ${JSON.stringify(value)}`;
    case 'number':
      return Number.isInteger(value) ? `integer \`${value}\`` : `floating point \`${value}\``;
    default:
      return 'map';
  }
}

/** @type {Record<FieldType, string>} */
const EXPECTED = {
  boolean: 'a boolean',
  string: 'a string',
  number: 'a number',
  integer: 'an integer',
  array: 'a sequence',
  object: 'a map',
  any: 'any value',
};

/**
 * @param {unknown} value
 * @param {FieldType} type
 */
function hasType(value, type) {
  switch (type) {
    case 'any':
      return true;
    case 'array':
      return Array.isArray(value);
    case 'object':
      return value !== null && typeof value === 'object' && !Array.isArray(value);
    case 'integer':
      return Number.isInteger(value);
    default:
      return typeof value === type;
  }
}

/**
 * Reads the plugin's config (JSON text from the manifest's `config`, as
 * `checkConfig` and `host.config()` give it) against `spec`, one FieldSpec
 * per allowed field (`items`: the type of an array field's elements).
 * Returns a plain object with every field of `spec` (the default, or
 * `undefined`, when absent).
 *
 * Empty text and `null` read as `{}`. Errors are PluginErrors whose text
 * starts with `<plugin> config: `, as in the Rust SDK:
 * `unknown field \`x\`, expected one of \`a\`, \`b\``, `missing field \`a\``,
 * `invalid type: string "yes", expected a boolean (field \`a\`)`,
 * `invalid value: "x", expected one of "a", "b" (field \`a\`)`.
 *
 * @template {Record<string, FieldSpec>} S
 * @param {string} plugin
 * @param {string} json
 * @param {S} spec
 * @returns {{[K in keyof S]: any}}
 */
export function parseConfig(plugin, json, spec) {
  /** @param {string} msg @returns {never} */
  const fail = (msg) => {
    throw new PluginError(`${plugin} config: ${msg}`);
  };
  const trimmed = (json ?? '').trim();
  let value;
  if (trimmed === '' || trimmed === 'null') {
    value = {};
  } else {
    try {
      value = JSON.parse(trimmed);
    } catch (e) {
      fail(e instanceof Error ? e.message : String(e));
    }
  }
  if (!hasType(value, 'object')) {
    fail(`invalid type: ${describeValue(value)}, expected a map`);
  }
  const fields = Object.keys(spec);
  for (const key of Object.keys(value)) {
    if (!Object.prototype.hasOwnProperty.call(spec, key)) {
      const expected = fields.length
        ? `expected one of ${fields.map((f) => `\`${f}\``).join(', ')}`
        : 'there are no fields';
      fail(`unknown field \`${key}\`, ${expected}`);
    }
  }
  /** @type {any} */
  const out = {};
  for (const key of fields) {
    const field = spec[key];
    const v = value[key];
    if (v === undefined || (v === null && field.nullable)) {
      if (field.required && !('default' in field)) fail(`missing field \`${key}\``);
      out[key] = field.default;
      continue;
    }
    if (!hasType(v, field.type)) {
      fail(`invalid type: ${describeValue(v)}, expected ${EXPECTED[field.type]} (field \`${key}\`)`);
    }
    if (field.items !== undefined && Array.isArray(v)) {
      for (const item of v) {
        if (!hasType(item, field.items)) {
          fail(`invalid type: ${describeValue(item)}, expected ${EXPECTED[field.items]} (field \`${key}\`)`);
        }
      }
    }
    if (field.oneOf && !field.oneOf.includes(v)) {
      const allowed = field.oneOf.map((o) => JSON.stringify(o)).join(', ');
      fail(`invalid value: ${JSON.stringify(v)}, expected one of ${allowed} (field \`${key}\`)`);
    }
    out[key] = v;
  }
  return out;
}
