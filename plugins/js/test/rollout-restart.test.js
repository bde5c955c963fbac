// Unit tests of the JavaScript rollout-restart (rollout-restart/app.js)
// against a stand-in host (host.js): the cases of the Rust plugin's unit
// tests (plugins/rollout-restart/src/lib.rs) it can check from outside,
// with the Rust plugin's exact messages. The host's tests
// (host/runtime/tests/bundled_plugins.rs) run both components.
//   cd plugins/js && node --import ./test/register.js --test test/*.test.js
//
// RR_MODULE=URL runs the same cases against another module exporting
// `checkConfig` and `handle`: the built component transpiled by
// `jco transpile --map 'wasmwatch:plugin/host@0.4.0=<a module re-exporting
// ./host.js>'` (README.md, "Testing").
import assert from 'node:assert/strict';
import { test } from 'node:test';

const { checkConfig, handle } = await import(process.env.RR_MODULE ?? '../rollout-restart/app.js');
import { CONFIG_MAP, otherKind } from '../sdk/index.js';
import { reset, state } from './host.js';

const CSI = 'secrets-store.csi.x-k8s.io';

/** @returns {import('../sdk/index.js').ChangeEvent} */
function event(extra = {}) {
  return {
    kind: CONFIG_MAP,
    change: 'modified',
    namespace: 'shop',
    name: 'orders',
    uid: 'u-1',
    resourceVersion: '42',
    labels: [],
    annotations: [],
    data: [],
    valuesIncluded: true,
    changedKeys: ['a', 'b'],
    digest: 'd1',
    replay: false,
    ...extra,
  };
}

/** A SecretProviderClassPodStatus mounting class `spc`. */
function spcps(spc, extra = {}) {
  return event({
    kind: otherKind(CSI, 'v1', 'SecretProviderClassPodStatus'),
    name: 'api-7d9-shop-vault-db',
    data: spc === undefined ? [] : [{ key: 'status.secretProviderClassName', value: { tag: 'text', val: spc } }],
    ...extra,
  });
}

/**
 * @param {string} name
 * @param {{kind?: string, group?: string, referenced?: boolean, annotations?: Record<string, string>,
 *   uses?: [string, string | undefined][]}} [o]
 * @returns {import('../sdk/index.js').WorkloadInfo}
 */
function w(name, o = {}) {
  const kind = o.kind ?? 'Deployment';
  const group = o.group ?? (kind === 'CronJob' || kind === 'Job' ? 'batch' : 'apps');
  return {
    workload: { group, version: 'v1', kind, namespace: 'shop', name },
    labels: [],
    annotations: Object.entries(o.annotations ?? {}).map(([key, value]) => ({ key, value })),
    templateAnnotations: [],
    referenced: o.referenced ?? true,
    uses: (o.uses ?? []).map(([via, key]) => ({ via: /** @type {any} */ (via), key })),
  };
}

/** The names of the workloads `handle` restarts. */
function restarted(config, workloads, ev = event()) {
  reset(config, workloads);
  return handle(ev).map((a) => {
    assert.equal(a.tag, 'restart');
    return a.tag === 'restart' ? a.val.workload.name : '';
  });
}

const NAMED = { 'configmap.reloader.stakater.com/reload': 'ord.*' };
const AUTO = { 'reloader.stakater.com/auto': 'true' };

// only_a_named_reload_restarts_a_workload_that_does_not_reference_the_object
test('only a named reload restarts a workload that does not reference the object', () => {
  const all = [
    w('cron-unref', { kind: 'CronJob', referenced: false, annotations: NAMED }),
    w('cron-ref', { kind: 'CronJob', annotations: NAMED }),
    w('rollout-unref', { kind: 'Rollout', group: 'argoproj.io', referenced: false, annotations: AUTO }),
    w('rollout-ref', { kind: 'Rollout', group: 'argoproj.io', annotations: AUTO }),
    w('job-unref', { kind: 'Job', referenced: false }),
    w('job-ref', { kind: 'Job' }),
  ];
  assert.deepEqual(restarted('{"autoReloadAll": true}', all), ['cron-unref', 'cron-ref', 'rollout-ref', 'job-ref']);
  // Search/match needs a reference too.
  const search = { 'reloader.stakater.com/search': 'true' };
  const matching = event({ annotations: [{ key: 'reloader.stakater.com/match', value: 'true' }] });
  assert.deepEqual(
    restarted('{}', [w('s-unref', { referenced: false, annotations: search }), w('s-ref', { annotations: search })], matching),
    ['s-ref'],
  );
});

test('the restart: kind, reason, hash, no strategy', () => {
  reset('{}', [w('nightly', { kind: 'CronJob', annotations: AUTO })]);
  assert.deepEqual(handle(event()), [
    {
      tag: 'restart',
      val: {
        workload: { group: 'batch', version: 'v1', kind: 'CronJob', namespace: 'shop', name: 'nightly' },
        reason: 'ConfigMap shop/orders changed',
        contentHash: 'configmap/orders:d1',
        strategy: undefined,
      },
    },
  ]);
  assert.deepEqual(state.lookups, [[{ tag: 'config-map' }, 'shop', 'orders']]);
  assert.deepEqual(state.logs, [['debug', 'restarting CronJob shop/nightly (auto)']]);
  reset('{"reloadOnDelete": true}', [w('api', { kind: 'Deployment', annotations: AUTO })]);
  const [deleted] = handle(event({ kind: { tag: 'secret' }, change: 'deleted' }));
  assert.equal(deleted.tag === 'restart' && deleted.val.reason, 'Secret shop/orders deleted');
  assert.equal(deleted.tag === 'restart' && deleted.val.contentHash, 'secret/orders:deleted');
});

// key_aware_counts_only_the_keys_a_workload_uses, through handle.
test('keyAware restarts a workload that uses only some keys only when one changed', () => {
  const workloads = [
    w('env-c', { annotations: AUTO, uses: [['env', 'c']] }),
    w('volume-b', { annotations: AUTO, uses: [['env', 'c'], ['volume', 'b']] }),
    w('env-from', { annotations: AUTO, uses: [['env', 'c'], ['env-from', undefined]] }),
    w('unknown', { annotations: AUTO }),
    w('named-only', { referenced: false, annotations: NAMED }),
  ];
  assert.deepEqual(restarted('{"keyAware": true}', workloads), ['volume-b', 'env-from', 'unknown', 'named-only']);
  assert.ok(
    state.logs.some(
      ([level, m]) => level === 'debug' && m === 'not restarting Deployment shop/env-c: it uses none of the changed keys (a, b)',
    ),
    JSON.stringify(state.logs),
  );
  assert.deepEqual(restarted('{}', workloads), ['env-c', 'volume-b', 'env-from', 'unknown', 'named-only']);
});

// rollout_restart_ignored_workload_types_skip_jobs_and_cronjobs
test('ignoredWorkloadTypes skip jobs and cronjobs, named or not', () => {
  const workloads = [
    w('api', { annotations: AUTO }),
    w('nightly', { kind: 'CronJob', annotations: AUTO }),
    w('once', { kind: 'Job', referenced: false, annotations: { 'configmap.reloader.stakater.com/reload': 'orders' } }),
    // Another group's Job is not batch/v1's.
    w('other-job', { kind: 'Job', group: 'example.com', annotations: AUTO }),
  ];
  assert.deepEqual(restarted('{}', workloads), ['api', 'nightly', 'once', 'other-job']);
  assert.deepEqual(restarted('{"ignoredWorkloadTypes": ["jobs", "CronJobs"]}', workloads), ['api', 'other-job']);
  assert.ok(state.logs.some(([, m]) => m === 'not restarting CronJob shop/nightly: ignoredWorkloadTypes'));
  assert.deepEqual(restarted('{"ignoredWorkloadTypes": [" jobs "]}', workloads), ['api', 'nightly', 'other-job']);
});

/** check-config's error for `json`. */
function configError(json) {
  try {
    checkConfig(json);
  } catch (e) {
    return /** @type {any} */ (e).payload;
  }
  assert.fail(`accepted ${json}`);
}

// config_errors_name_the_field and the other config cases of the Rust
// plugin's unit tests, word for word.
test('config errors are the Rust plugin\'s', () => {
  for (const [json, want] of [
    ['{"mode":"notify"}', 'rollout-restart config: mode: unknown mode "notify", expected "restart", "webhook" or "alert"'],
    ['{"mode":"webhook"}', 'rollout-restart config: webhook.url is required with mode: webhook'],
    [
      '{"mode":"webhook","webhook":{"url":"ftp://h/x"}}',
      'rollout-restart config: webhook.url: "ftp://h/x" is not an http or https URL (it must start with http:// or https://)',
    ],
    ['{"mode":"webhook","webhook":{"url":"http:///x"}}', 'rollout-restart config: webhook.url: "http:///x" has no host'],
    [
      '{"mode":"webhook","webhook":{"url":"http://h/ x"}}',
      'rollout-restart config: webhook.url: "http://h/ x" contains blanks or control characters',
    ],
    [
      '{"mode":"webhook","webhook":{"url":"http://h","format":"xml"}}',
      'rollout-restart config: webhook.format: unknown format "xml", expected "json" or "reloader"',
    ],
    [
      '{"mode":"alert","alert":{"url":"http://h","sink":"discord"}}',
      'rollout-restart config: alert.sink: unknown sink "discord", expected "slack", "teams", "teams-workflow", "gchat" or "raw"',
    ],
    ['{"mode":"alert"}', 'rollout-restart config: alert.url is required with mode: alert'],
    [
      '{"webhook":{"url":"http://h"}}',
      'rollout-restart config: webhook is set but mode is "restart": set mode: webhook, or remove webhook',
    ],
    [
      '{"mode":"webhook","webhook":{"url":"http://h"},"alert":{"url":"http://h"}}',
      'rollout-restart config: alert is set but mode is "webhook": set mode: alert, or remove alert',
    ],
    [
      '{"annotations":{"search":"reloader.stakater.com/auto"}}',
      'rollout-restart config: annotations.search: "reloader.stakater.com/auto" is already the name of the auto annotation; each needs its own',
    ],
    [
      '{"annotations":{"ignore":"x/y","match":"x/y"}}',
      'rollout-restart config: annotations.match: "x/y" is already the name of the ignore annotation; each needs its own',
    ],
    [
      '{"annotations":{"configmapReload":"wasmwatch.io/exclude-configmaps"}}',
      'rollout-restart config: annotations.configmapReload: "wasmwatch.io/exclude-configmaps" is already the name of the exclude annotation; each needs its own',
    ],
    [
      '{"annotations":{"configmapReload":"secretproviderclass.reloader.stakater.com/auto"}}',
      'rollout-restart config: annotations.configmapReload: "secretproviderclass.reloader.stakater.com/auto" is already the name of the auto annotation; each needs its own',
    ],
    [
      '{"ignoredWorkloadTypes": ["deployments"]}',
      'rollout-restart config: ignoredWorkloadTypes: "deployments" is not a workload type Reloader ignores (jobs, cronjobs)',
    ],
  ]) {
    assert.equal(configError(json), want, json);
  }
  assert.ok(
    configError('{"mode":"webhook","webhook":{"url":"http://h","fromat":"json"}}').startsWith(
      'rollout-restart config: unknown field `fromat`, expected one of `url`, `format`, `always`',
    ),
  );
  assert.ok(
    configError('{"reloadOnUpdate": true}').startsWith(
      'rollout-restart config: unknown field `reloadOnUpdate`, expected one of `reloadOnCreate`, `reloadOnDelete`, `autoReloadAll`, `keyAware`, `mode`, `webhook`, `alert`, `annotations`, `ignoredWorkloadTypes`',
    ),
  );
  assert.ok(configError('{"keyAware": "yes"}').startsWith('rollout-restart config: invalid type: string "yes", expected a boolean'));
  assert.ok(configError('{"ignoredWorkloadTypes": [5]}').startsWith('rollout-restart config: invalid type: integer `5`, expected a string'));
  for (const bad of ['', 'a b', '-a', 'a/', '/a', 'A.io/x', 'a/b/c', 'x'.repeat(64)]) {
    const e = configError(JSON.stringify({ annotations: { search: bad } }));
    assert.ok(
      e.startsWith(`rollout-restart config: annotations.search: ${JSON.stringify(bad)} is not a valid annotation key`),
      e,
    );
  }
  checkConfig('{"keyAware": true, "ignoredWorkloadTypes": ["JOBS", "cronjobs"]}');
  checkConfig('{"annotations":{"auto":"a/auto","search":"reloader.stakater.com/auto"}}');
});

// a_csi_mount_status_stands_for_its_secret_provider_class and
// csi_restarts_follow_reloaders_secret_provider_class_annotations.
test('a CSI mount status stands for its SecretProviderClass', () => {
  const typed = { 'secretproviderclass.reloader.stakater.com/auto': 'true' };
  const workloads = [
    w('typed', { annotations: typed }),
    // Reloader's generic auto covers SecretProviderClasses too.
    w('generic', { annotations: AUTO }),
    // The Secret kind's auto does not.
    w('secret-auto', { annotations: { 'secret.reloader.stakater.com/auto': 'true' } }),
    // Mounting is needed for auto, not for a named reload.
    w('typed-unref', { referenced: false, annotations: typed }),
    w('named-unref', { referenced: false, annotations: { 'secretproviderclass.reloader.stakater.com/reload': 'vault-.*' } }),
    w('excluded', {
      annotations: { ...AUTO, 'secretproviderclasses.exclude.reloader.stakater.com/reload': 'vault-db' },
    }),
  ];
  reset('{}', workloads);
  const actions = handle(spcps('vault-db'));
  assert.deepEqual(state.lookups, [[otherKind(CSI, 'v1', 'SecretProviderClass'), 'shop', 'vault-db']]);
  assert.deepEqual(
    actions.map((a) => a.tag === 'restart' && [a.val.workload.name, a.val.reason, a.val.contentHash]),
    ['typed', 'generic', 'named-unref'].map((n) => [
      n,
      'SecretProviderClass shop/vault-db changed',
      'secretproviderclass/vault-db:d1',
    ]),
  );
  // Added and deleted mount statuses restart nothing, whatever the config.
  const both = '{"reloadOnCreate": true, "reloadOnDelete": true}';
  assert.deepEqual(restarted(both, workloads, spcps('vault-db', { change: 'added' })), []);
  assert.deepEqual(restarted(both, workloads, spcps('vault-db', { change: 'deleted' })), []);
  // The status's own annotations are not the class's: no ignore.
  const ignored = spcps('vault-db', { annotations: [{ key: 'reloader.stakater.com/ignore', value: 'true' }] });
  assert.deepEqual(restarted('{}', workloads, ignored), ['typed', 'generic', 'named-unref']);
  // Alerts name the class.
  reset('{"mode":"alert","alert":{"url":"http://h","sink":"raw"}}', [w('api', { annotations: typed })]);
  const [, alert] = handle(spcps('vault-db'));
  assert.equal(
    alert.tag === 'http' && new TextDecoder().decode(alert.val.body),
    'Reloader detected changes in vault-db of type SECRETPROVIDERCLASS in namespace shop. Hence reloaded api of type Deployment in namespace shop',
  );
  // No class named, or another kind: nothing, with a warning.
  reset('{}', workloads);
  assert.deepEqual(handle(spcps(undefined)), []);
  assert.deepEqual(handle(spcps('')), []);
  assert.deepEqual(handle(event({ kind: otherKind('example.com', 'v1', 'Policy') })), []);
  assert.deepEqual(state.lookups, []);
  assert.deepEqual(
    state.logs.map(([level, m]) => [level, m.replace(/:.*$/, '')]),
    [['warn', 'nothing to restart'], ['warn', 'nothing to restart'], ['warn', 'nothing to restart']],
  );
  assert.match(state.logs[0][1], /SecretProviderClassPodStatus shop\/api-7d9-shop-vault-db names no SecretProviderClass/);
  assert.equal(
    state.logs[2][1],
    'nothing to restart: example.com/Policy shop/orders: rollout-restart restarts for ConfigMaps, Secrets and SecretProviderClassPodStatuses only',
  );
});

// the_json_notification_describes_the_change_and_the_workloads
test('the JSON notification describes the change and the workloads', () => {
  reset('{"mode":"webhook","webhook":{"url":"http://h"}}', [
    w('orders', { annotations: AUTO }),
    w('api', { kind: 'StatefulSet', annotations: AUTO }),
  ]);
  const [post] = handle(event());
  assert.equal(
    post.tag === 'http' && new TextDecoder().decode(post.val.body),
    '{"kind":"ConfigMap","namespace":"shop","name":"orders","uid":"u-1","resourceVersion":"42","change":"modified","digest":"d1","changedKeys":["a","b"],"workloads":[{"kind":"Deployment","namespace":"shop","name":"orders"},{"kind":"StatefulSet","namespace":"shop","name":"api"}]}',
  );
  assert.deepEqual(state.logs.map(([, m]) => m), [
    'would restart Deployment shop/orders (auto)',
    'would restart StatefulSet shop/api (auto)',
  ]);
});
