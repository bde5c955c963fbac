// A stand-in for the host interface `wasmwatch:plugin/host@0.4.0`, so the
// SDK and the plugins run under plain Node.js (see register.js). Tests set
// `state` and read what the plugin asked and logged.

export const state = {
  /** The plugin's config (JSON text). */
  config: '{}',
  /** What workloadsReferencing answers, whatever it is asked. */
  workloads: [],
  /** @type {import('../sdk/index.js').ServiceInfo[]} */
  services: [],
  /** Every workloadsReferencing call: [kind, namespace, name]. */
  lookups: [],
  /** Every log line: [level, message]. */
  logs: [],
};

/** Resets `state` to an empty host with `config`. */
export function reset(config = '{}', workloads = []) {
  Object.assign(state, { config, workloads, services: [], lookups: [], logs: [] });
}

export function log(level, message) {
  state.logs.push([level, message]);
}

export function config() {
  return state.config;
}

export function workloadsReferencing(kind, namespace, name) {
  state.lookups.push([kind, namespace, name]);
  return structuredClone(state.workloads);
}

export function service(namespace, name) {
  return state.services.find((s) => s.namespace === namespace && s.name === name);
}

export function readyEndpoints() {
  return [];
}

export function servicesWithLabels(namespace, labels) {
  return state.services.filter(
    (s) => s.namespace === namespace && labels.every((l) => s.labels.some((k) => k.key === l.key && k.value === l.value)),
  );
}
