// Target apps the way the Spring Cloud Kubernetes Configuration Watcher
// finds them (as plugins/sdk/src/spring.rs):
//
// 1. `spring.cloud.kubernetes.configmap.apps` (for Secrets
//    `spring.cloud.kubernetes.secret.apps`): comma-separated app names,
//    which are also Service names; else
// 2. `spring.cloud.kubernetes.configmap.labels` / `...secret.labels`
//    (`k=v,k2=v2`): the Services in the object's namespace carrying all of
//    these labels (host `servicesWithLabels`); else
// 3. the app named like the object.
//
// An object of another kind than ConfigMap and Secret (WIT 0.4.0 `other`)
// has no target apps: the Spring watcher does not know such kinds.

import { service, servicesWithLabels } from 'wasmwatch:plugin/host@0.4.0';

/**
 * `spring.cloud.kubernetes.configmap` or `spring.cloud.kubernetes.secret`;
 * `undefined` for other kinds, which the Spring watcher does not know.
 * @param {import('./index.js').ObjectKind} kind
 * @returns {string | undefined}
 */
export function annotationPrefix(kind) {
  switch (kind.tag) {
    case 'config-map':
      return 'spring.cloud.kubernetes.configmap';
    case 'secret':
      return 'spring.cloud.kubernetes.secret';
    default:
      return undefined;
  }
}

/**
 * `k=v, k2=v2` -> labels; entries without `=` are skipped.
 * @param {string} selector
 * @returns {import('./index.js').KeyValue[]}
 */
export function parseLabels(selector) {
  const out = [];
  for (const kv of selector.split(',')) {
    const i = kv.indexOf('=');
    if (i < 0) continue;
    out.push({ key: kv.slice(0, i).trim(), value: kv.slice(i + 1).trim() });
  }
  return out;
}

/** How the target apps of a change were named. */
export class SpringApps {
  /**
   * @param {'named' | 'labelled' | 'object-name'} how
   * @param {string[]} names the app names (`named`, `object-name`)
   * @param {import('./index.js').ServiceInfo[]} services the matching Services (`labelled`)
   */
  constructor(how, names, services) {
    /** Listed in the `...apps` annotation, the Services matching `...labels`, or the object's name. */
    this.how = how;
    this.appNames = names;
    this.labelledServices = services;
  }

  /**
   * The apps' Services in `namespace`; apps without a Service are dropped
   * (what an HTTP refresh needs).
   * @param {string} namespace
   * @returns {import('./index.js').ServiceInfo[]}
   */
  services(namespace) {
    if (this.how === 'labelled') return this.labelledServices;
    const out = [];
    for (const app of this.appNames) {
      const svc = service(namespace, app);
      if (svc !== undefined) out.push(svc);
    }
    return out;
  }

  /**
   * The apps' names, each once, in order, whether or not a Service exists
   * (what a bus message needs: its consumers subscribe by themselves).
   * @returns {string[]}
   */
  names() {
    const all = this.how === 'labelled' ? this.labelledServices.map((s) => s.name) : this.appNames;
    return [...new Set(all)];
  }
}

/**
 * Resolves the target apps of `event` (asks the host only for the labels
 * annotation). An object of another kind than ConfigMap and Secret has
 * none (`named`, no names).
 * @param {import('./index.js').ChangeEvent} event
 * @returns {SpringApps}
 */
export function targetApps(event) {
  const prefix = annotationPrefix(event.kind);
  if (prefix === undefined) return new SpringApps('named', [], []);
  const find = (/** @type {string} */ key) => event.annotations.find((kv) => kv.key === key)?.value;
  const apps = find(`${prefix}.apps`);
  if (apps !== undefined) {
    const names = apps
      .split(',')
      .map((a) => a.trim())
      .filter((a) => a !== '');
    return new SpringApps('named', names, []);
  }
  const selector = find(`${prefix}.labels`);
  if (selector !== undefined) {
    return new SpringApps('labelled', [], servicesWithLabels(event.namespace, parseLabels(selector)));
  }
  return new SpringApps('object-name', [event.name], []);
}
