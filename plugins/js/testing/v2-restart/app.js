// Test plugin: a JavaScript component of the world
// `wasmwatch:plugin/plugin@0.2.0` (world.wit), without the SDK (which is
// 0.4.0), for the host's tests of the 0.2.0 contract now that
// js/rollout-restart is a 0.4.0 component. On a modification or resync it
// restarts every workload `workloads-referencing` returns (a 0.2.0 plugin
// sees only the apps/v1 workloads whose pod templates reference the
// object), with rollout-restart's reason and content hash: `ConfigMap
// shop/orders changed`, `configmap/orders:<digest>`. No config.

import { workloadsReferencing } from 'wasmwatch:plugin/host@0.2.0';

/** @param {string} json */
export function checkConfig(json) {
  const trimmed = (json ?? '').trim();
  if (trimmed !== '' && trimmed !== 'null' && trimmed !== '{}') {
    throw 'v2-restart config: takes no config';
  }
}

export function handle(event) {
  if (event.change !== 'modified' && event.change !== 'resynced') return [];
  // 0.2.0: `kind` is the enum, a string.
  const kind = event.kind === 'config-map' ? 'ConfigMap' : 'Secret';
  return workloadsReferencing(event.kind, event.namespace, event.name).map((w) => ({
    tag: 'restart',
    val: {
      // 0.2.0: {kind: 'deployment' | 'stateful-set' | 'daemon-set', namespace, name}.
      workload: w.workload,
      reason: `${kind} ${event.namespace}/${event.name} changed`,
      contentHash: `${kind.toLowerCase()}/${event.name}:${event.digest}`,
    },
  }));
}
