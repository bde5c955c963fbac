// Unit tests of the SDK's helpers (sdk/), without the component:
//   cd plugins/js && node --import ./test/register.js --test test/*.test.js
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  CONFIG_MAP,
  SECRET,
  PluginError,
  action,
  annotationPrefix,
  apiVersion,
  describe,
  isConfigMap,
  isKind,
  isSecret,
  isWorkloadKind,
  kindName,
  objectId,
  otherKind,
  parseConfig,
  targetApps,
  text,
  usesAnyOf,
  usesOnlyKeys,
  workloadKindName,
} from '../sdk/index.js';
import { reset, state } from './host.js';

/** @returns {import('../sdk/index.js').ChangeEvent} */
function event(kind = CONFIG_MAP, extra = {}) {
  return {
    kind,
    change: 'modified',
    namespace: 'shop',
    name: 'orders',
    uid: 'u-1',
    resourceVersion: '42',
    labels: [],
    annotations: [],
    data: [
      { key: 'a', value: { tag: 'text', val: 'x' } },
      { key: 'b', value: { tag: 'binary', val: new Uint8Array([1]) } },
      { key: 'c', value: undefined },
    ],
    valuesIncluded: true,
    changedKeys: ['a', 'b'],
    digest: 'd1',
    replay: false,
    ...extra,
  };
}

const SPCPS = otherKind('secrets-store.csi.x-k8s.io', 'v1', 'SecretProviderClassPodStatus');

const deployment = { group: 'apps', version: 'v1', kind: 'Deployment', namespace: 'shop', name: 'api' };

/** @returns {import('../sdk/index.js').WorkloadInfo} */
function info(uses, referenced = true) {
  return {
    workload: deployment,
    labels: [],
    annotations: [],
    templateAnnotations: [],
    referenced,
    uses: uses.map(([via, key]) => ({ via, key })),
  };
}

test('event kinds: config-map, secret and other', () => {
  assert.deepEqual(CONFIG_MAP, { tag: 'config-map' });
  assert.deepEqual(SECRET, { tag: 'secret' });
  const cm = event();
  assert.ok(isConfigMap(cm) && !isSecret(cm));
  assert.equal(kindName(cm), 'ConfigMap');
  assert.ok(isKind(cm, '', 'ConfigMap'));
  assert.ok(!isKind(cm, 'apps', 'ConfigMap'));
  const secret = event(SECRET);
  assert.ok(isSecret(secret) && !isConfigMap(secret));
  assert.equal(kindName(secret), 'Secret');
  assert.ok(isKind(secret, '', 'Secret') && !isKind(secret, '', 'ConfigMap'));
  const csi = event(SPCPS);
  assert.ok(!isConfigMap(csi) && !isSecret(csi));
  assert.equal(kindName(csi), 'SecretProviderClassPodStatus');
  assert.ok(isKind(csi, 'secrets-store.csi.x-k8s.io', 'SecretProviderClassPodStatus'));
  assert.ok(!isKind(csi, '', 'SecretProviderClassPodStatus'));
  assert.equal(objectId(csi), 'shop/orders');
});

test('text gives text values only', () => {
  const ev = event();
  assert.equal(text(ev, 'a'), 'x');
  assert.equal(text(ev, 'b'), undefined);
  assert.equal(text(ev, 'c'), undefined);
  assert.equal(text(ev, 'd'), undefined);
});

test('workload kinds by group, version and kind', () => {
  assert.ok(isWorkloadKind(deployment, 'apps', 'v1', 'Deployment'));
  assert.ok(isWorkloadKind(info([]), 'apps', 'v1', 'Deployment'));
  assert.ok(!isWorkloadKind(deployment, 'apps', 'v1beta1', 'Deployment'));
  assert.ok(!isWorkloadKind(deployment, '', 'v1', 'Deployment'));
  assert.equal(apiVersion(deployment), 'apps/v1');
  assert.equal(apiVersion({ ...deployment, group: '' }), 'v1');
  assert.equal(describe(deployment), 'Deployment shop/api');
  assert.equal(describe(info([])), 'Deployment shop/api');
  assert.equal(workloadKindName('stateful-set'), 'StatefulSet');
  assert.equal(workloadKindName('CronJob'), 'CronJob');
});

// As key_aware_counts_only_the_keys_a_workload_uses (plugins/rollout-restart).
test('usesOnlyKeys and usesAnyOf as the Rust SDK', () => {
  const changed = ['a', 'b'];
  const envC = info([['env', 'c']]);
  assert.ok(usesOnlyKeys(envC));
  assert.ok(!usesAnyOf(envC, changed));
  assert.ok(usesAnyOf(info([['env', 'c'], ['volume', 'b']]), changed));
  assert.ok(usesAnyOf(info([['env', 'c'], ['env-from', undefined]]), changed));
  assert.ok(!usesOnlyKeys(info([['volume', undefined]])));
  assert.ok(usesAnyOf(info([['volume', undefined]]), changed));
  // Uses not known, or selected by name only: the whole object.
  assert.ok(!usesOnlyKeys(info([])));
  assert.ok(usesAnyOf(info([]), changed));
  assert.ok(!usesOnlyKeys(info([['env', 'c']], false)));
  assert.ok(usesAnyOf(info([['env', 'c']], false), changed));
});

test('restart copies the workload and takes an optional strategy', () => {
  const extra = { ...deployment, labels: [] };
  const plain = action.restart(extra, 'why', 'h');
  assert.deepEqual(plain, {
    tag: 'restart',
    val: { workload: deployment, reason: 'why', contentHash: 'h', strategy: undefined },
  });
  const rollout = { group: 'argoproj.io', version: 'v1alpha1', kind: 'Rollout', namespace: 'shop', name: 'web' };
  for (const strategy of /** @type {const} */ (['annotations', 'env-vars', 'restart-at'])) {
    const a = action.restart(rollout, 'why', 'h', strategy);
    assert.equal(a.tag, 'restart');
    assert.equal(a.tag === 'restart' && a.val.strategy, strategy);
  }
  assert.throws(() => action.restart(rollout, 'why', 'h', /** @type {any} */ ('rolling')), /unknown strategy "rolling"/);
});

test('the other action builders', () => {
  assert.deepEqual(action.eventNormal('Seen', 'm'), { tag: 'event', val: { eventType: 'normal', reason: 'Seen', message: 'm' } });
  assert.deepEqual(action.eventWarning('Bad', 'm'), { tag: 'event', val: { eventType: 'warning', reason: 'Bad', message: 'm' } });
  assert.deepEqual(action.refreshService('shop', 'api', 'post', undefined, '/actuator/refresh'), {
    tag: 'refresh-service',
    val: { namespace: 'shop', service: 'api', method: 'post', port: undefined, path: '/actuator/refresh', tls: false },
  });
  const p = action.publishJson('rabbit', 'springCloudBus', '#', { a: 1 });
  assert.equal(p.tag === 'publish' && new TextDecoder().decode(p.val.payload), '{"a":1}');
  const h = action.http('post', 'http://h', { body: 'x' });
  assert.deepEqual(h.tag === 'http' && [...(h.val.body ?? [])], [120]);
  const j = action.httpJson('post', 'http://h', '{}');
  assert.deepEqual(j.tag === 'http' && j.val.headers, [{ name: 'content-type', value: 'application/json' }]);
  assert.deepEqual(j.tag === 'http' && [...(j.val.body ?? [])], [123, 125]);
});

test('spring target apps: none for other kinds', () => {
  reset();
  assert.equal(annotationPrefix(CONFIG_MAP), 'spring.cloud.kubernetes.configmap');
  assert.equal(annotationPrefix(SECRET), 'spring.cloud.kubernetes.secret');
  assert.equal(annotationPrefix(SPCPS), undefined);
  assert.deepEqual(targetApps(event(SPCPS)).names(), []);
  assert.deepEqual(targetApps(event()).names(), ['orders']);
  const named = event(SECRET, { annotations: [{ key: 'spring.cloud.kubernetes.secret.apps', value: 'a, b,a' }] });
  assert.deepEqual(targetApps(named).names(), ['a', 'b']);
  state.services = [{ namespace: 'shop', name: 'web', labels: [{ key: 'app', value: 'web' }], annotations: [], ports: [] }];
  const labelled = event(CONFIG_MAP, {
    annotations: [{ key: 'spring.cloud.kubernetes.configmap.labels', value: 'app=web' }],
  });
  assert.deepEqual(targetApps(labelled).names(), ['web']);
});

test('parseConfig: serde-like errors, array items', () => {
  const spec = {
    flag: { type: /** @type {const} */ ('boolean'), default: false },
    list: { type: /** @type {const} */ ('array'), items: /** @type {const} */ ('string'), default: [] },
  };
  assert.deepEqual(parseConfig('p', '', spec), { flag: false, list: [] });
  assert.deepEqual(parseConfig('p', '{"list":["a"]}', spec), { flag: false, list: ['a'] });
  const err = (/** @type {string} */ json) => {
    try {
      parseConfig('p', json, spec);
    } catch (e) {
      assert.ok(e instanceof PluginError);
      return e.payload;
    }
    assert.fail(`accepted ${json}`);
  };
  assert.equal(err('{"x":1}'), 'p config: unknown field `x`, expected one of `flag`, `list`');
  assert.equal(err('{"flag":"yes"}'), 'p config: invalid type: string "yes", expected a boolean (field `flag`)');
  assert.equal(err('{"list":["a",5]}'), 'p config: invalid type: integer `5`, expected a string (field `list`)');
  assert.equal(err('{"list":null}'), 'p config: invalid type: null, expected a sequence (field `list`)');
});
