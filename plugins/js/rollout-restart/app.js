// rollout-restart (JavaScript): the twin of plugins/rollout-restart (WIT
// 0.4.0), with the same config, annotations, decisions and actions
// (Stakater Reloader's rules; see plugins/README.md):
//
// 1. `reloader.stakater.com/ignore: "true"` (or `wasmwatch.io/ignore`) on
//    the changed object: nothing restarts.
// 2. The workload's own annotations are read when they hold any deciding
//    annotation for the object's kind, else the pod template's.
// 3. Exclude lists (exact names) win; then named reloads (each entry a
//    whole-name regex, an invalid one compared literally), which also
//    restart workloads that do not reference the object (the host returns
//    them with `referenced: false`); then, for referencing workloads only,
//    search/match; then auto (any kind, or the kind's own); then, with
//    `autoReloadAll`, every referencing workload that does not say
//    `auto: "false"`.
// 4. `keyAware: true`: a workload that uses only some keys of the object
//    (env `configMapKeyRef`/`secretKeyRef`, volume `items`) restarts only
//    when one of them is in the event's `changedKeys`.
// 5. `ignoredWorkloadTypes` (`jobs`, `cronjobs`): those batch/v1 kinds
//    never restart, named or not.
//
// A change of the CSI driver's SecretProviderClassPodStatus (a kind the
// manifest's `watch.kinds` names) stands for the SecretProviderClass it
// mounts (`status.secretProviderClassName`): the workloads using that
// class restart per the `secretproviderclass.reloader.stakater.com/...`
// annotations, on modifications and resyncs only. Any other kind restarts
// nothing (logged).
//
// Each action: reason `ConfigMap shop/orders changed` (`created`,
// `deleted`), content hash `configmap/<name>:<digest>` (`...:deleted`).
// Config: {"reloadOnCreate": false, "reloadOnDelete": false,
// "autoReloadAll": false, "keyAware": false, "ignoredWorkloadTypes": []}.
// `annotations` ({auto, configmapAuto, secretAuto, configmapReload,
// secretReload, search, match, ignore}) names keys read instead of
// Reloader's, as Reloader's custom annotation flags do; the
// `wasmwatch.io/` names stay read.
//
// `mode` picks what happens to the selected workloads: `restart` (default);
// `webhook`: no restart, one POST per change to `webhook.url` (when a
// workload would restart, or always with `webhook.always`), body per
// `webhook.format` (`json`, default, or Reloader's constant `reloader`);
// `alert`: the restarts plus one POST per restarted workload to `alert.url`
// in `alert.sink`'s format, with Reloader's message.

import {
  PluginError,
  action,
  describe,
  host,
  isKind,
  kindName,
  log,
  lookup,
  objectId,
  otherKind,
  parseConfig,
  text,
  usesAnyOf,
} from '../sdk/index.js';

const PLUGIN = 'rollout-restart';
/** @satisfies {Record<string, import('../sdk/index.js').FieldSpec>} */
const CONFIG = {
  reloadOnCreate: { type: 'boolean', default: false },
  reloadOnDelete: { type: 'boolean', default: false },
  autoReloadAll: { type: 'boolean', default: false },
  keyAware: { type: 'boolean', default: false },
  mode: { type: 'string', nullable: true },
  webhook: { type: 'object', nullable: true },
  alert: { type: 'object', nullable: true },
  annotations: { type: 'object', nullable: true },
  ignoredWorkloadTypes: { type: 'array', items: 'string', default: [] },
};
// The `ignoredWorkloadTypes` values Reloader accepts, with the batch/v1
// kind each names.
/** @type {[string, string][]} */
const WORKLOAD_TYPES = [
  ['jobs', 'Job'],
  ['cronjobs', 'CronJob'],
];
/** @satisfies {Record<string, import('../sdk/index.js').FieldSpec>} */
const WEBHOOK = {
  url: { type: 'string', nullable: true },
  format: { type: 'string', nullable: true },
  always: { type: 'boolean', default: false },
};
/** @satisfies {Record<string, import('../sdk/index.js').FieldSpec>} */
const ALERT = {
  url: { type: 'string', nullable: true },
  sink: { type: 'string', nullable: true },
  additionalInfo: { type: 'string', nullable: true },
};
// `annotations`: Reloader's custom annotation flags, each replacing its key.
// [field, family, Reloader's default]; the order of the checks.
/** @type {[string, string, string][]} */
const NAMES = [
  ['auto', 'auto', 'reloader.stakater.com/auto'],
  ['configmapAuto', 'auto', 'configmap.reloader.stakater.com/auto'],
  ['secretAuto', 'auto', 'secret.reloader.stakater.com/auto'],
  ['configmapReload', 'reload', 'configmap.reloader.stakater.com/reload'],
  ['secretReload', 'reload', 'secret.reloader.stakater.com/reload'],
  ['search', 'search', 'reloader.stakater.com/search'],
  ['match', 'match', 'reloader.stakater.com/match'],
  ['ignore', 'ignore', 'reloader.stakater.com/ignore'],
];
/** @type {Record<string, import('../sdk/index.js').FieldSpec>} */
const ANNOTATION_NAMES = Object.fromEntries(NAMES.map(([field]) => [field, { type: 'string', nullable: true }]));
// The keys no field renames, with what they mean.
/** @type {[string, string][]} */
const FIXED_KEYS = [
  ['auto', 'wasmwatch.io/auto'],
  ['auto', 'wasmwatch.io/auto-configmaps'],
  ['auto', 'wasmwatch.io/auto-secrets'],
  ['reload', 'wasmwatch.io/reload-configmaps'],
  ['reload', 'wasmwatch.io/reload-secrets'],
  ['exclude', 'wasmwatch.io/exclude-configmaps'],
  ['exclude', 'wasmwatch.io/exclude-secrets'],
  ['exclude', 'configmaps.exclude.reloader.stakater.com/reload'],
  ['exclude', 'secrets.exclude.reloader.stakater.com/reload'],
  ['auto', 'wasmwatch.io/auto-secretproviderclasses'],
  ['auto', 'secretproviderclass.reloader.stakater.com/auto'],
  ['reload', 'wasmwatch.io/reload-secretproviderclasses'],
  ['reload', 'secretproviderclass.reloader.stakater.com/reload'],
  ['exclude', 'wasmwatch.io/exclude-secretproviderclasses'],
  ['exclude', 'secretproviderclasses.exclude.reloader.stakater.com/reload'],
  ['search', 'wasmwatch.io/search'],
  ['match', 'wasmwatch.io/match'],
  ['ignore', 'wasmwatch.io/ignore'],
];

/**
 * `key` is a Kubernetes annotation key: `[prefix/]name`, the name at most
 * 63 of `[A-Za-z0-9-_.]` starting and ending alphanumeric, the prefix a
 * lower-case DNS subdomain of at most 253 characters.
 * @param {string} key
 */
function annotationKeyOk(key) {
  const slash = key.indexOf('/');
  const prefix = slash < 0 ? undefined : key.slice(0, slash);
  const name = slash < 0 ? key : key.slice(slash + 1);
  const nameOk = name.length <= 63 && /^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$/.test(name);
  const label = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
  return nameOk && (prefix === undefined || (prefix.length <= 253 && prefix.split('.').every((l) => label.test(l))));
}

/**
 * The keys of `annotations` checked, with Reloader's defaults for the
 * others: field name → key. As the Rust plugin's `names`, with the same
 * errors.
 * @param {Record<string, string | undefined> | undefined} given
 * @returns {Record<string, string>}
 */
function annotationNames(given) {
  for (const [field] of NAMES) {
    const v = given?.[field];
    if (v !== undefined && !annotationKeyOk(v)) {
      throw new PluginError(
        `${PLUGIN} config: annotations.${field}: ${JSON.stringify(v)} is not a valid annotation key ` +
          "([prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter " +
          "or digit, after an optional lower-case DNS subdomain and '/')",
      );
    }
  }
  const effective = NAMES.map(([field, family, def]) => [field, family, given?.[field] ?? def]);
  // Every key read, with what it means: one key, one meaning.
  const keys = [...effective.map(([, family, key]) => [family, key]), ...FIXED_KEYS];
  for (const [field, family, key] of effective) {
    if (given?.[field] === undefined) continue;
    const other = keys.find(([f, k]) => k === key && f !== family);
    if (other !== undefined) {
      throw new PluginError(
        `${PLUGIN} config: annotations.${field}: ${JSON.stringify(key)} is already the name of the ${other[0]} annotation; each needs its own`,
      );
    }
  }
  return Object.fromEntries(effective.map(([field, , key]) => [field, key]));
}

/**
 * The batch/v1 kinds `ignoredWorkloadTypes` names, checked; as the Rust
 * plugin's `ignored_kinds`, with the same error.
 * @param {string[]} types
 * @returns {string[]}
 */
function ignoredKinds(types) {
  return types.map((t) => {
    // Rust's eq_ignore_ascii_case: ASCII letters only.
    const lower = t.trim().replace(/[A-Z]/g, (c) => c.toLowerCase());
    const found = WORKLOAD_TYPES.find(([name]) => name === lower);
    if (found === undefined) {
      throw new PluginError(
        `${PLUGIN} config: ignoredWorkloadTypes: ${JSON.stringify(t)} is not a workload type Reloader ignores (jobs, cronjobs)`,
      );
    }
    return found[1];
  });
}

// `alert.sink` values; `webhook` is Reloader's docs' name for `raw`.
const SINKS = {
  slack: 'slack',
  teams: 'teams',
  'teams-workflow': 'teams-workflow',
  gchat: 'gchat',
  raw: 'raw',
  webhook: 'raw',
};

/**
 * @typedef {import('../sdk/index.js').KeyValue} KeyValue
 * @typedef {'ignore' | 'match' | 'search' | 'auto' | 'typedAuto' | 'reload' | 'exclude'} Ann
 * @typedef {'config-map' | 'secret' | 'secret-provider-class'} Of
 *   the kind of the object a change stands for, as the annotations name it
 */

const CSI_GROUP = 'secrets-store.csi.x-k8s.io';

/** @type {Record<Of, {kindName: string, objectType: string, wit: import('../sdk/index.js').ObjectKind}>} */
const OF = {
  'config-map': { kindName: 'ConfigMap', objectType: 'CONFIGMAP', wit: { tag: 'config-map' } },
  secret: { kindName: 'Secret', objectType: 'SECRET', wit: { tag: 'secret' } },
  // The CSI driver's SecretProviderClass, for a change of one of its
  // SecretProviderClassPodStatuses (Reloader's CSI integration).
  'secret-provider-class': {
    kindName: 'SecretProviderClass',
    objectType: 'SECRETPROVIDERCLASS',
    wit: otherKind(CSI_GROUP, 'v1', 'SecretProviderClass'),
  },
};

/**
 * What a change stands for: the changed object itself, or for a
 * SecretProviderClassPodStatus the SecretProviderClass it mounts, whose
 * annotations the plugin cannot read (`ignore` and `match` are not
 * honoured for CSI changes).
 * @typedef {{of: Of, name: string, annotations: KeyValue[]}} Target
 */

/**
 * The target of `event`, or why there is none (a string: logged, nothing
 * restarts).
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @returns {Target | string}
 */
function target(event) {
  switch (event.kind.tag) {
    case 'config-map':
      return { of: 'config-map', name: event.name, annotations: event.annotations };
    case 'secret':
      return { of: 'secret', name: event.name, annotations: event.annotations };
    default: {
      const t = event.kind.val;
      if (isKind(event, CSI_GROUP, 'SecretProviderClassPodStatus')) {
        const name = text(event, 'status.secretProviderClassName');
        if (name === undefined || name === '') {
          return `SecretProviderClassPodStatus ${objectId(event)} names no SecretProviderClass (status.secretProviderClassName; is it in the kind's content?)`;
        }
        return { of: 'secret-provider-class', name, annotations: [] };
      }
      return `${t.group}/${t.kind} ${objectId(event)}: ${PLUGIN} restarts for ConfigMaps, Secrets and SecretProviderClassPodStatuses only`;
    }
  }
}

/**
 * The annotations' names per kind: ours first, then Reloader's, or the key
 * `annotations` gives in its place (`n`, from annotationNames).
 * @type {Record<Ann, (n: Record<string, string>, of: Of) => string[]>}
 */
const ANNOTATIONS = {
  ignore: (n) => ['wasmwatch.io/ignore', n.ignore],
  match: (n) => ['wasmwatch.io/match', n.match],
  search: (n) => ['wasmwatch.io/search', n.search],
  auto: (n) => ['wasmwatch.io/auto', n.auto],
  typedAuto: (n, of) =>
    of === 'secret-provider-class'
      ? ['wasmwatch.io/auto-secretproviderclasses', 'secretproviderclass.reloader.stakater.com/auto']
      : of === 'config-map'
        ? ['wasmwatch.io/auto-configmaps', n.configmapAuto]
        : ['wasmwatch.io/auto-secrets', n.secretAuto],
  reload: (n, of) =>
    of === 'secret-provider-class'
      ? ['wasmwatch.io/reload-secretproviderclasses', 'secretproviderclass.reloader.stakater.com/reload']
      : of === 'config-map'
        ? ['wasmwatch.io/reload-configmaps', n.configmapReload]
        : ['wasmwatch.io/reload-secrets', n.secretReload],
  exclude: (_, of) =>
    of === 'secret-provider-class'
      ? ['wasmwatch.io/exclude-secretproviderclasses', 'secretproviderclasses.exclude.reloader.stakater.com/reload']
      : of === 'config-map'
        ? ['wasmwatch.io/exclude-configmaps', 'configmaps.exclude.reloader.stakater.com/reload']
        : ['wasmwatch.io/exclude-secrets', 'secrets.exclude.reloader.stakater.com/reload'],
};

/**
 * @param {Record<string, string>} names
 * @param {KeyValue[]} list
 * @param {Ann} ann
 * @param {Of} of
 */
function get(names, list, ann, of) {
  for (const key of ANNOTATIONS[ann](names, of)) {
    const v = lookup(list, key);
    if (v !== undefined) return v;
  }
  return undefined;
}

/** @type {(names: Record<string, string>, list: KeyValue[], ann: Ann, of: Of) => boolean} */
const isTrue = (names, list, ann, of) => get(names, list, ann, of) === 'true';

// Whether `list` holds any annotation that decides about `of`.
/** @type {(names: Record<string, string>, list: KeyValue[], of: Of) => boolean} */
const relevant = (names, list, of) =>
  /** @type {Ann[]} */ (['reload', 'search', 'auto', 'typedAuto']).some((a) => get(names, list, a, of) !== undefined);

// `name` matches one comma-separated entry, each a whole-name regex.
/**
 * @param {string} list
 * @param {string} name
 */
function named(list, name) {
  return list
    .split(',')
    .map((e) => e.trim())
    .filter((e) => e !== '')
    .some((entry) => {
      let re;
      try {
        re = new RegExp(`^(?:${entry})$`, 'u');
      } catch {
        return entry === name;
      }
      return re.test(name);
    });
}

/**
 * Why `workload` restarts for a change of `target`, or undefined.
 * @param {{autoReloadAll: boolean}} config
 * @param {Record<string, string>} names
 * @param {Target} target
 * @param {import('../sdk/index.js').WorkloadInfo} workload
 */
function decide(config, names, target, workload) {
  const kind = target.of;
  let ann = workload.annotations;
  if (!relevant(names, workload.annotations, kind) && relevant(names, workload.templateAnnotations, kind)) {
    ann = workload.templateAnnotations;
  }
  const exclude = get(names, ann, 'exclude', kind);
  if (exclude !== undefined && exclude.split(',').some((e) => e.trim() === target.name)) return undefined;
  const reload = get(names, ann, 'reload', kind);
  if (reload !== undefined && named(reload, target.name)) return 'named';
  // Search, auto and autoReloadAll need a pod template that uses the
  // object (Reloader: a container that uses it); only a named reload
  // restarts a workload that does not reference it.
  if (!workload.referenced) return undefined;
  if (isTrue(names, ann, 'search', kind) && isTrue(names, target.annotations, 'match', kind)) return 'search/match';
  if (isTrue(names, ann, 'auto', kind) || isTrue(names, ann, 'typedAuto', kind)) return 'auto';
  const optedOut = get(names, ann, 'auto', kind) === 'false' || get(names, ann, 'typedAuto', kind) === 'false';
  if (config.autoReloadAll && !optedOut) return 'autoReloadAll';
  return undefined;
}

/**
 * `value` is an absolute http or https URL without blanks; the error names
 * `field`.
 * @param {string} field
 * @param {string} value
 * @returns {string | undefined} the problem
 */
function urlProblem(field, value) {
  const q = JSON.stringify(value);
  if (/[\s\u0000-\u001f\u007f-\u009f]/.test(value)) return `${field}: ${q} contains blanks or control characters`;
  let rest;
  if (value.startsWith('http://')) rest = value.slice('http://'.length);
  else if (value.startsWith('https://')) rest = value.slice('https://'.length);
  else return `${field}: ${q} is not an http or https URL (it must start with http:// or https://)`;
  const authority = rest.split(/[/?#]/)[0];
  const host = authority.slice(authority.lastIndexOf('@') + 1);
  if (host === '') return `${field}: ${q} has no host`;
  return undefined;
}

/**
 * @typedef {{name: 'restart'}
 *   | {name: 'webhook', url: string, format: 'json' | 'reloader', always: boolean}
 *   | {name: 'alert', url: string, sink: string, additionalInfo: string | undefined}} Mode
 */

/**
 * The config, checked: as the Rust plugin's `settings`, with the same
 * errors.
 * @param {string} json
 */
function settings(json) {
  const config = parseConfig(PLUGIN, json, CONFIG);
  /** @param {string} msg */
  const bad = (msg) => new PluginError(`${PLUGIN} config: ${msg}`);
  /** @type {(value: unknown, spec: typeof WEBHOOK | typeof ALERT | typeof ANNOTATION_NAMES) => any} */
  const section = (value, spec) =>
    value === undefined ? undefined : parseConfig(PLUGIN, JSON.stringify(value), spec);
  const webhook = section(config.webhook, WEBHOOK);
  const alert = section(config.alert, ALERT);
  // Parsed with the others, before any check, as serde does in the Rust
  // plugin.
  const givenNames = section(config.annotations, ANNOTATION_NAMES);
  const name = config.mode ?? 'restart';
  /** @type {Mode} */
  let mode;
  switch (name) {
    case 'restart':
      mode = { name: 'restart' };
      break;
    case 'webhook': {
      const url = webhook?.url;
      if (url === undefined) throw bad('webhook.url is required with mode: webhook');
      const problem = urlProblem('webhook.url', url);
      if (problem !== undefined) throw bad(problem);
      const format = webhook?.format ?? 'json';
      if (format !== 'json' && format !== 'reloader') {
        throw bad(`webhook.format: unknown format ${JSON.stringify(format)}, expected "json" or "reloader"`);
      }
      mode = { name: 'webhook', url, format, always: webhook?.always ?? false };
      break;
    }
    case 'alert': {
      const url = alert?.url;
      if (url === undefined) throw bad('alert.url is required with mode: alert');
      const problem = urlProblem('alert.url', url);
      if (problem !== undefined) throw bad(problem);
      const given = alert?.sink ?? 'raw';
      const sink = Object.prototype.hasOwnProperty.call(SINKS, given)
        ? SINKS[/** @type {keyof typeof SINKS} */ (given)]
        : undefined;
      if (sink === undefined) {
        throw bad(
          `alert.sink: unknown sink ${JSON.stringify(given)}, expected "slack", "teams", "teams-workflow", "gchat" or "raw"`,
        );
      }
      const info = alert?.additionalInfo?.trim();
      mode = { name: 'alert', url, sink, additionalInfo: info === '' ? undefined : info };
      break;
    }
    default:
      throw bad(`mode: unknown mode ${JSON.stringify(name)}, expected "restart", "webhook" or "alert"`);
  }
  // A section the mode does not read is a mistake (a webhook URL set
  // without `mode: webhook` would restart instead): say so.
  for (const [section, set] of /** @type {const} */ ([
    ['webhook', webhook !== undefined],
    ['alert', alert !== undefined],
  ])) {
    if (set && name !== section) {
      throw bad(`${section} is set but mode is ${JSON.stringify(name)}: set mode: ${section}, or remove ${section}`);
    }
  }
  const names = annotationNames(givenNames);
  const ignored = ignoredKinds(config.ignoredWorkloadTypes);
  return { config, mode, names, ignored };
}

// Reloader's `--webhook-url` body, byte for byte.
const RELOADER_WEBHOOK_BODY = '{"webhook":"update successful"}';

/**
 * `format: json`: the change and the workloads it selects.
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @param {import('../sdk/index.js').WorkloadRef[]} workloads
 */
function notification(event, workloads) {
  return JSON.stringify({
    kind: kindName(event),
    namespace: event.namespace,
    name: event.name,
    uid: event.uid,
    resourceVersion: event.resourceVersion,
    change: event.change,
    digest: event.digest,
    changedKeys: event.changedKeys,
    workloads: workloads.map((w) => ({ kind: w.kind, namespace: w.namespace, name: w.name })),
  });
}

/**
 * A JSON string literal as Go's `encoding/json` writes it (Reloader's alert
 * bodies): `<`, `>`, `&`, U+2028 and U+2029 escaped too.
 * @param {string} s
 */
function goString(s) {
  return JSON.stringify(s)
    .replaceAll('<', '\\u003c')
    .replaceAll('>', '\\u003e')
    .replaceAll('&', '\\u0026')
    .replaceAll('\u2028', '\\u2028')
    .replaceAll('\u2029', '\\u2029');
}

/**
 * Reloader's alert message, with the optional `additionalInfo` prefix.
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @param {Target} target
 * @param {import('../sdk/index.js').WorkloadRef} w
 * @param {string | undefined} info
 */
function alertMessage(event, target, w, info) {
  const message =
    `Reloader detected changes in *${target.name}* of type *${OF[target.of].objectType}* in namespace *${event.namespace}*. ` +
    `Hence reloaded *${w.name}* of type *${w.kind}* in namespace *${w.namespace}*`;
  return info === undefined ? message : `${info} : ${message}`;
}

/**
 * The alert about `message` for `sink`, as Reloader sends it.
 * @param {string} url
 * @param {string} sink
 * @param {string} message
 */
function alertAction(url, sink, message) {
  const text = goString(message);
  let json;
  switch (sink) {
    case 'slack':
      json = `{"attachments":[{"author_name":"Reloader","color":"good","text":${text}}]}`;
      break;
    case 'teams':
    case 'gchat':
      json = `{"text":${text}}`;
      break;
    case 'teams-workflow':
      json =
        '{"type":"message","attachments":[{"contentType":"application/vnd.microsoft.card.adaptive",' +
        '"content":{"$schema":"http://adaptivecards.io/schemas/adaptive-card.json","type":"AdaptiveCard",' +
        `"version":"1.2","body":[{"type":"TextBlock","text":${text},"wrap":true}]}}]}`;
      break;
    default:
      return action.http('post', url, {
        headers: [{ name: 'content-type', value: 'text/plain' }],
        body: message.replaceAll('*', ''),
      });
  }
  return postJson(url, json);
}

/**
 * @param {string} url
 * @param {string} json
 */
function postJson(url, json) {
  return action.http('post', url, {
    headers: [{ name: 'content-type', value: 'application/json' }],
    body: json,
  });
}

/** @param {string} json */
export function checkConfig(json) {
  settings(json);
}

/**
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @returns {import('../sdk/index.js').Action[]}
 */
export function handle(event) {
  const { config, mode, names, ignored } = settings(host.config());
  const t = target(event);
  if (typeof t === 'string') {
    log('warn', `nothing to restart: ${t}`);
    return [];
  }
  const csi = t.of === 'secret-provider-class';
  let what;
  switch (event.change) {
    // A pod's mount status comes and goes with the pod: Reloader ignores
    // both, whatever reloadOnCreate and reloadOnDelete say.
    case 'added':
      if (csi || !config.reloadOnCreate) return [];
      what = 'created';
      break;
    case 'deleted':
      if (csi || !config.reloadOnDelete) return [];
      what = 'deleted';
      break;
    default:
      what = 'changed';
  }
  if (isTrue(names, t.annotations, 'ignore', t.of)) {
    log('debug', `${kindName(event)} ${objectId(event)} is ignored`);
    return [];
  }
  const doing = mode.name === 'webhook' ? 'would restart' : 'restarting';
  /** @type {import('../sdk/index.js').WorkloadRef[]} */
  const selected = [];
  for (const w of host.workloadsReferencing(OF[t.of].wit, event.namespace, t.name)) {
    if (w.workload.group === 'batch' && ignored.includes(w.workload.kind)) {
      log('debug', `not restarting ${describe(w)}: ignoredWorkloadTypes`);
      continue;
    }
    const why = decide(config, names, t, w);
    if (why === undefined) continue;
    if (config.keyAware && !usesAnyOf(w, event.changedKeys)) {
      log('debug', `not restarting ${describe(w)}: it uses none of the changed keys (${event.changedKeys.join(', ')})`);
      continue;
    }
    log('debug', `${doing} ${describe(w)} (${why})`);
    selected.push(w.workload);
  }
  if (mode.name === 'webhook') {
    if (selected.length === 0 && !mode.always) return [];
    const body = mode.format === 'json' ? notification(event, selected) : RELOADER_WEBHOOK_BODY;
    return [postJson(mode.url, body)];
  }
  const kind = OF[t.of].kindName;
  const reason = `${kind} ${event.namespace}/${t.name} ${what}`;
  const version = event.change === 'deleted' ? 'deleted' : event.digest;
  // For CSI, keyed by the SecretProviderClass: every pod's mount status of
  // the same objects has the same content, so the pods of one rotation
  // restart a workload once.
  const hash = `${kind.toLowerCase()}/${t.name}:${version}`;
  const actions = selected.map((w) => action.restart(w, reason, hash));
  if (mode.name === 'alert') {
    for (const w of selected) {
      actions.push(alertAction(mode.url, mode.sink, alertMessage(event, t, w, mode.additionalInfo)));
    }
  }
  return actions;
}
