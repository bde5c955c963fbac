// Test plugin: says what the 0.4.0 contract brought it, so a host test
// sees each field cross the component boundary (the Python
// testing/echo's twin; host/runtime/tests/wit_v3.rs). For every change it
// asks the host for the workloads referencing the object and answers, for
// each, a Normal Event `Workload` with `<apiVersion> <Kind>
// <namespace>/<name> referenced=<bool> uses=<via[:key],...>` and a restart
// of it with the strategy `restart-at`; and one Event `Object` with the
// object's kind (`<group>/<version>/<Kind>`) and its data keys.
import { action, apiVersion, describe, host } from '../../sdk/index.js';

/** @param {string} _json */
export function checkConfig(_json) {}

/** @param {import('../../sdk/index.js').ChangeEvent} event */
export function handle(event) {
  const t =
    event.kind.tag === 'other'
      ? event.kind.val
      : { group: '', version: 'v1', kind: event.kind.tag === 'config-map' ? 'ConfigMap' : 'Secret' };
  const keys = event.data.map((d) => d.key).join(',');
  const out = [action.eventNormal('Object', `${t.group}/${t.version}/${t.kind} ${keys}`)];
  for (const w of host.workloadsReferencing(event.kind, event.namespace, event.name)) {
    const uses = w.uses.map((u) => u.via + (u.key === undefined || u.key === null ? '' : `:${u.key}`)).join(',');
    out.push(action.eventNormal('Workload', `${apiVersion(w)} ${describe(w)} referenced=${w.referenced} uses=${uses}`));
    out.push(action.restart(w.workload, 'echo', `echo/${event.name}:1`, 'restart-at'));
  }
  return out;
}
