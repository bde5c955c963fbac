// rollout-restart (JavaScript): the twin of plugins/rollout-restart, with
// the same config, annotations and actions (Stakater Reloader's rules; see
// plugins/README.md):
//
// 1. `reloader.stakater.com/ignore: "true"` (or `wasmwatch.io/ignore`) on
//    the changed object: nothing restarts.
// 2. The workload's own annotations are read when they hold any deciding
//    annotation for the object's kind, else the pod template's.
// 3. Exclude lists (exact names) win; then named reloads (each entry a
//    whole-name regex, an invalid one compared literally); then
//    search/match; then auto (any kind, or the kind's own); then, with
//    `autoReloadAll`, every referencing workload that does not say
//    `auto: "false"`.
//
// Each action: reason `ConfigMap shop/orders changed` (`created`,
// `deleted`), content hash `configmap/<name>:<digest>` (`...:deleted`).
// Config: {"reloadOnCreate": false, "reloadOnDelete": false, "autoReloadAll": false}.
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
  host,
  kindName,
  log,
  lookup,
  objectId,
  parseConfig,
  workloadKindName,
} from '../sdk/index.js';

const PLUGIN = 'rollout-restart';
/** @satisfies {Record<string, import('../sdk/index.js').FieldSpec>} */
const CONFIG = {
  reloadOnCreate: { type: 'boolean', default: false },
  reloadOnDelete: { type: 'boolean', default: false },
  autoReloadAll: { type: 'boolean', default: false },
  mode: { type: 'string', nullable: true },
  webhook: { type: 'object', nullable: true },
  alert: { type: 'object', nullable: true },
  annotations: { type: 'object', nullable: true },
};
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
 * @typedef {import('../sdk/index.js').ObjectKind} ObjectKind
 * @typedef {'ignore' | 'match' | 'search' | 'auto' | 'typedAuto' | 'reload' | 'exclude'} Ann
 */

/**
 * The annotations' names per kind (`cm`: for a ConfigMap): ours first,
 * then Reloader's, or the key `annotations` gives in its place (`n`, from
 * annotationNames).
 * @type {Record<Ann, (n: Record<string, string>, cm: boolean) => string[]>}
 */
const ANNOTATIONS = {
  ignore: (n) => ['wasmwatch.io/ignore', n.ignore],
  match: (n) => ['wasmwatch.io/match', n.match],
  search: (n) => ['wasmwatch.io/search', n.search],
  auto: (n) => ['wasmwatch.io/auto', n.auto],
  typedAuto: (n, cm) =>
    cm ? ['wasmwatch.io/auto-configmaps', n.configmapAuto] : ['wasmwatch.io/auto-secrets', n.secretAuto],
  reload: (n, cm) =>
    cm ? ['wasmwatch.io/reload-configmaps', n.configmapReload] : ['wasmwatch.io/reload-secrets', n.secretReload],
  exclude: (_, cm) =>
    cm
      ? ['wasmwatch.io/exclude-configmaps', 'configmaps.exclude.reloader.stakater.com/reload']
      : ['wasmwatch.io/exclude-secrets', 'secrets.exclude.reloader.stakater.com/reload'],
};

/**
 * @param {Record<string, string>} names
 * @param {KeyValue[]} list
 * @param {Ann} ann
 * @param {ObjectKind} kind
 */
function get(names, list, ann, kind) {
  for (const key of ANNOTATIONS[ann](names, kind === 'config-map')) {
    const v = lookup(list, key);
    if (v !== undefined) return v;
  }
  return undefined;
}

/** @type {(names: Record<string, string>, list: KeyValue[], ann: Ann, kind: ObjectKind) => boolean} */
const isTrue = (names, list, ann, kind) => get(names, list, ann, kind) === 'true';

// Whether `list` holds any annotation that decides about `kind`.
/** @type {(names: Record<string, string>, list: KeyValue[], kind: ObjectKind) => boolean} */
const relevant = (names, list, kind) =>
  /** @type {Ann[]} */ (['reload', 'search', 'auto', 'typedAuto']).some(
    (a) => get(names, list, a, kind) !== undefined,
  );

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
 * Why `workload` restarts for `event`, or undefined.
 * @param {{autoReloadAll: boolean}} config
 * @param {Record<string, string>} names
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @param {import('../sdk/index.js').WorkloadInfo} workload
 */
function decide(config, names, event, workload) {
  const kind = event.kind;
  let ann = workload.annotations;
  if (!relevant(names, workload.annotations, kind) && relevant(names, workload.templateAnnotations, kind)) {
    ann = workload.templateAnnotations;
  }
  const exclude = get(names, ann, 'exclude', kind);
  if (exclude !== undefined && exclude.split(',').some((e) => e.trim() === event.name)) return undefined;
  const reload = get(names, ann, 'reload', kind);
  if (reload !== undefined && named(reload, event.name)) return 'named';
  if (isTrue(names, ann, 'search', kind) && isTrue(names, event.annotations, 'match', kind)) return 'search/match';
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
  const names = annotationNames(section(config.annotations, ANNOTATION_NAMES));
  return { config, mode, names };
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
    workloads: workloads.map((w) => ({ kind: workloadKindName(w.kind), namespace: w.namespace, name: w.name })),
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
 * @param {import('../sdk/index.js').WorkloadRef} w
 * @param {string | undefined} info
 */
function alertMessage(event, w, info) {
  const type = event.kind === 'config-map' ? 'CONFIGMAP' : 'SECRET';
  const message =
    `Reloader detected changes in *${event.name}* of type *${type}* in namespace *${event.namespace}*. ` +
    `Hence reloaded *${w.name}* of type *${workloadKindName(w.kind)}* in namespace *${w.namespace}*`;
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
  const { config, mode, names } = settings(host.config());
  let what;
  switch (event.change) {
    case 'added':
      if (!config.reloadOnCreate) return [];
      what = 'created';
      break;
    case 'deleted':
      if (!config.reloadOnDelete) return [];
      what = 'deleted';
      break;
    default:
      what = 'changed';
  }
  if (isTrue(names, event.annotations, 'ignore', event.kind)) {
    log('debug', `${kindName(event)} ${objectId(event)} is ignored`);
    return [];
  }
  const doing = mode.name === 'webhook' ? 'would restart' : 'restarting';
  /** @type {import('../sdk/index.js').WorkloadRef[]} */
  const selected = [];
  for (const w of host.workloadsReferencing(event.kind, event.namespace, event.name)) {
    const why = decide(config, names, event, w);
    if (why === undefined) continue;
    const { kind, namespace, name } = w.workload;
    log('debug', `${doing} ${workloadKindName(kind)} ${namespace}/${name} (${why})`);
    selected.push(w.workload);
  }
  if (mode.name === 'webhook') {
    if (selected.length === 0 && !mode.always) return [];
    const body = mode.format === 'json' ? notification(event, selected) : RELOADER_WEBHOOK_BODY;
    return [postJson(mode.url, body)];
  }
  const reason = `${kindName(event)} ${objectId(event)} ${what}`;
  const version = event.change === 'deleted' ? 'deleted' : event.digest;
  const hash = `${kindName(event).toLowerCase()}/${event.name}:${version}`;
  const actions = selected.map((w) => action.restart(w, reason, hash));
  if (mode.name === 'alert') {
    for (const w of selected) {
      actions.push(alertAction(mode.url, mode.sink, alertMessage(event, w, mode.additionalInfo)));
    }
  }
  return actions;
}
