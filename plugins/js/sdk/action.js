// Builders for the actions a plugin returns, as the bindings expect them
// (`{tag, val}` variants, camelCase record fields, kebab-case enums). The
// host checks each one against the plugin's capabilities before executing
// it.

const encoder = new TextEncoder();

/** @param {string | Uint8Array | ArrayLike<number>} body */
function bytes(body) {
  if (typeof body === 'string') return encoder.encode(body);
  if (body instanceof Uint8Array) return body;
  return Uint8Array.from(body);
}

/**
 * `method path` on every ready pod of Service `namespace/service`; `port`
 * `undefined` takes each endpoint's first port. Needs `refresh`.
 * @param {string} namespace
 * @param {string} service
 * @param {import('./index.js').HttpMethod} method
 * @param {number | undefined} port
 * @param {string} path
 * @param {boolean} [tls] use https to reach the pods (default false)
 * @returns {import('./index.js').Action}
 */
export function refreshService(namespace, service, method, port, path, tls = false) {
  return {
    tag: 'refresh-service',
    val: { namespace, service, method, port: port ?? undefined, path, tls },
  };
}

/**
 * A JSON message on bus connection `connection` (a `buses` entry of the
 * manifest) to `destination` (AMQP exchange or NATS subject), with header
 * `content-type: application/json`. `json` is JSON text or bytes; any other
 * value is serialised with JSON.stringify. Needs `bus: [connection/destination]`.
 * @param {string} connection
 * @param {string} destination
 * @param {string} routingKey
 * @param {string | Uint8Array | object} json
 * @returns {import('./index.js').Action}
 */
export function publishJson(connection, destination, routingKey, json) {
  const payload =
    typeof json === 'string' || json instanceof Uint8Array ? bytes(json) : bytes(JSON.stringify(json));
  return {
    tag: 'publish',
    val: {
      connection,
      destination,
      routingKey,
      headers: [{ name: 'content-type', value: 'application/json' }],
      payload,
    },
  };
}

/** The restart strategies of WIT 0.4.0's `restart-strategy`. */
const STRATEGIES = ['annotations', 'env-vars', 'restart-at'];

/**
 * Roll `workload`'s pods (a WorkloadRef: `{group, version, kind,
 * namespace, name}`). The host records `contentHash` and never restarts the
 * same workload twice for the same hash. Needs `restart` (and, for kinds
 * other than the apps/v1 ones, the kind granted: `restart: {namespaces:
 * [...], kinds: [batch/v1/CronJob]}`).
 *
 * `strategy` (`'annotations'`, `'env-vars'` or `'restart-at'`: an Argo
 * Rollout's `spec.restartAt`, refused for other kinds) replaces the
 * plugin's `delivery.restartStrategy` for this restart; left out, that one
 * applies. A workload's `wasmwatch.io/reload-strategy` annotation still
 * wins.
 * @param {import('./index.js').WorkloadRef} workload
 * @param {string} reason
 * @param {string} contentHash
 * @param {import('./index.js').RestartStrategy} [strategy]
 * @returns {import('./index.js').Action}
 */
export function restart(workload, reason, contentHash, strategy) {
  if (strategy !== undefined && !STRATEGIES.includes(strategy)) {
    throw new TypeError(`restart: unknown strategy ${JSON.stringify(strategy)}, expected one of ${STRATEGIES.join(', ')}`);
  }
  const { group, version, kind, namespace, name } = workload;
  return {
    tag: 'restart',
    val: {
      workload: { group, version, kind, namespace, name },
      reason,
      contentHash,
      strategy,
    },
  };
}

/**
 * A Normal Kubernetes Event on the changed object. Needs `events`.
 * @param {string} reason UpperCamelCase, e.g. `Refreshed`
 * @param {string} message
 * @returns {import('./index.js').Action}
 */
export function eventNormal(reason, message) {
  return { tag: 'event', val: { eventType: 'normal', reason, message } };
}

/**
 * A Warning Kubernetes Event on the changed object. Needs `events`.
 * @param {string} reason
 * @param {string} message
 * @returns {import('./index.js').Action}
 */
export function eventWarning(reason, message) {
  return { tag: 'event', val: { eventType: 'warning', reason, message } };
}

/**
 * One HTTP call. Needs an `http` grant covering `url`.
 * @param {import('./index.js').HttpMethod} method
 * @param {string} url
 * @param {{headers?: import('./index.js').Header[], body?: string | Uint8Array}} [options]
 * @returns {import('./index.js').Action}
 */
export function http(method, url, options = {}) {
  return {
    tag: 'http',
    val: {
      method,
      url,
      headers: options.headers ?? [],
      body: options.body === undefined ? undefined : bytes(options.body),
    },
  };
}

/**
 * One HTTP call with a JSON body (`content-type: application/json`), as the
 * Rust SDK's `http_json`: `httpJson('post', url, JSON.stringify(note))`.
 * Needs an `http` grant covering `url`.
 * @param {import('./index.js').HttpMethod} method
 * @param {string} url
 * @param {string | Uint8Array} json
 * @returns {import('./index.js').Action}
 */
export function httpJson(method, url, json) {
  return http(method, url, {
    headers: [{ name: 'content-type', value: 'application/json' }],
    body: json,
  });
}
