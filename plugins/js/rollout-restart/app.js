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

import { action, host, kindName, log, lookup, objectId, parseConfig, workloadKindName } from '../sdk/index.js';

const PLUGIN = 'rollout-restart';
/** @satisfies {Record<string, import('../sdk/index.js').FieldSpec>} */
const CONFIG = {
  reloadOnCreate: { type: 'boolean', default: false },
  reloadOnDelete: { type: 'boolean', default: false },
  autoReloadAll: { type: 'boolean', default: false },
};

/**
 * @typedef {import('../sdk/index.js').KeyValue} KeyValue
 * @typedef {import('../sdk/index.js').ObjectKind} ObjectKind
 * @typedef {'ignore' | 'match' | 'search' | 'auto' | 'typedAuto' | 'reload' | 'exclude'} Ann
 */

// The annotations' names per kind (`cm`: for a ConfigMap): ours first,
// then Reloader's.
/** @type {Record<Ann, (cm: boolean) => string[]>} */
const ANNOTATIONS = {
  ignore: () => ['wasmwatch.io/ignore', 'reloader.stakater.com/ignore'],
  match: () => ['wasmwatch.io/match', 'reloader.stakater.com/match'],
  search: () => ['wasmwatch.io/search', 'reloader.stakater.com/search'],
  auto: () => ['wasmwatch.io/auto', 'reloader.stakater.com/auto'],
  typedAuto: (cm) =>
    cm
      ? ['wasmwatch.io/auto-configmaps', 'configmap.reloader.stakater.com/auto']
      : ['wasmwatch.io/auto-secrets', 'secret.reloader.stakater.com/auto'],
  reload: (cm) =>
    cm
      ? ['wasmwatch.io/reload-configmaps', 'configmap.reloader.stakater.com/reload']
      : ['wasmwatch.io/reload-secrets', 'secret.reloader.stakater.com/reload'],
  exclude: (cm) =>
    cm
      ? ['wasmwatch.io/exclude-configmaps', 'configmaps.exclude.reloader.stakater.com/reload']
      : ['wasmwatch.io/exclude-secrets', 'secrets.exclude.reloader.stakater.com/reload'],
};

/**
 * @param {KeyValue[]} list
 * @param {Ann} ann
 * @param {ObjectKind} kind
 */
function get(list, ann, kind) {
  for (const key of ANNOTATIONS[ann](kind === 'config-map')) {
    const v = lookup(list, key);
    if (v !== undefined) return v;
  }
  return undefined;
}

/** @type {(list: KeyValue[], ann: Ann, kind: ObjectKind) => boolean} */
const isTrue = (list, ann, kind) => get(list, ann, kind) === 'true';

// Whether `list` holds any annotation that decides about `kind`.
/** @type {(list: KeyValue[], kind: ObjectKind) => boolean} */
const relevant = (list, kind) =>
  /** @type {Ann[]} */ (['reload', 'search', 'auto', 'typedAuto']).some((a) => get(list, a, kind) !== undefined);

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
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @param {import('../sdk/index.js').WorkloadInfo} workload
 */
function decide(config, event, workload) {
  const kind = event.kind;
  let ann = workload.annotations;
  if (!relevant(workload.annotations, kind) && relevant(workload.templateAnnotations, kind)) {
    ann = workload.templateAnnotations;
  }
  const exclude = get(ann, 'exclude', kind);
  if (exclude !== undefined && exclude.split(',').some((e) => e.trim() === event.name)) return undefined;
  const reload = get(ann, 'reload', kind);
  if (reload !== undefined && named(reload, event.name)) return 'named';
  if (isTrue(ann, 'search', kind) && isTrue(event.annotations, 'match', kind)) return 'search/match';
  if (isTrue(ann, 'auto', kind) || isTrue(ann, 'typedAuto', kind)) return 'auto';
  const optedOut = get(ann, 'auto', kind) === 'false' || get(ann, 'typedAuto', kind) === 'false';
  if (config.autoReloadAll && !optedOut) return 'autoReloadAll';
  return undefined;
}

/** @param {string} json */
export function checkConfig(json) {
  parseConfig(PLUGIN, json, CONFIG);
}

/**
 * @param {import('../sdk/index.js').ChangeEvent} event
 * @returns {import('../sdk/index.js').Action[]}
 */
export function handle(event) {
  const config = parseConfig(PLUGIN, host.config(), CONFIG);
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
  if (isTrue(event.annotations, 'ignore', event.kind)) {
    log('debug', `${kindName(event)} ${objectId(event)} is ignored`);
    return [];
  }
  const reason = `${kindName(event)} ${objectId(event)} ${what}`;
  const version = event.change === 'deleted' ? 'deleted' : event.digest;
  const hash = `${kindName(event).toLowerCase()}/${event.name}:${version}`;
  const actions = [];
  for (const w of host.workloadsReferencing(event.kind, event.namespace, event.name)) {
    const why = decide(config, event, w);
    if (why === undefined) continue;
    const { kind, namespace, name } = w.workload;
    log('debug', `restarting ${workloadKindName(kind)} ${namespace}/${name} (${why})`);
    actions.push(action.restart(w.workload, reason, hash));
  }
  return actions;
}
