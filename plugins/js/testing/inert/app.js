// Test plugin: tries everything the host's zero-authority WASI imports must
// refuse, through the WASI imports themselves (componentize-js has no Node
// `fs` or `net`; this is what a hostile JavaScript author would call), and
// reports each outcome as an `event` action, in this order: `OpenFile`
// (/etc/passwd), `ListDir` (/), `Connect` (TCP to the config's `connect`,
// default 127.0.0.1:9), `Resolve` (the config's `resolve`, default
// localhost), `Environment`. The message is `denied: <error>` when the
// attempt failed (or the environment is empty), `GRANTED: <what>` when it
// succeeded. Same protocol as plugins/testing/inert (Rust) and
// plugins/python/testing/inert; host/runtime/tests/inert.rs checks all.

import { config } from 'wasmwatch:plugin/host@0.4.0';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import { instanceNetwork } from 'wasi:sockets/instance-network@0.2.12';
import { createTcpSocket } from 'wasi:sockets/tcp-create-socket@0.2.12';
import { resolveAddresses } from 'wasi:sockets/ip-name-lookup@0.2.12';
import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { action } from '../../sdk/index.js';

// componentize-js 0.23 bug: the bindings name a class for the `network`
// resource (wasi:sockets/network has no stable function, so it gets no
// module) but never define it, so `instanceNetwork()` throws a
// ReferenceError after the host call. The bindings run in a global of their
// own and keep a resource's handle under their own symbol, so any class
// defined there serves; a function's constructor reaches that global.
const bindingsGlobal = instanceNetwork.constructor('return this')();
bindingsGlobal['import_network_0_2_12$Network'] ??= class Network {};

// Runs one host call, naming it in the error it throws.
function step(name, call) {
  try {
    return call();
  } catch (e) {
    throw new Error(`${errorText(e)} (${name})`);
  }
}

function errorText(e) {
  if (e && typeof e === 'object' && 'payload' in e) {
    const p = e.payload;
    return typeof p === 'string' ? p : JSON.stringify(p);
  }
  if (e instanceof Error) return e.message;
  return String(e);
}

function outcome(reason, attempt) {
  let message;
  try {
    message = `GRANTED: ${attempt()}`;
  } catch (e) {
    message = `denied: ${errorText(e)}`;
  }
  return action.eventNormal(reason, message);
}

// The preopened directory holding `path`, and the path relative to it.
function preopenFor(path) {
  for (const [dir, at] of getDirectories()) {
    const base = at.endsWith('/') ? at : `${at}/`;
    if (path === at || at === '/' || path.startsWith(base)) {
      const rel = path.slice(at === '/' ? 1 : base.length) || '.';
      return [dir, rel];
    }
  }
  throw new Error(`no preopened directory holds ${path}`);
}

function openFile() {
  const [dir, rel] = preopenFor('/etc/passwd');
  const file = dir.openAt({ symlinkFollow: true }, rel, {}, { read: true });
  const [bytes] = file.read(4096n, 0n);
  return `read ${bytes.length} bytes of /etc/passwd`;
}

function listDir() {
  const [dir, rel] = preopenFor('/');
  const target = rel === '.' ? dir : dir.openAt({ symlinkFollow: true }, rel, { directory: true }, { read: true });
  const stream = target.readDirectory();
  const names = [];
  for (let entry = stream.readDirectoryEntry(); entry !== undefined; entry = stream.readDirectoryEntry()) {
    names.push(entry.name);
  }
  return `${names.length} entries: ${names.join(', ')}`;
}

function socketAddress(hostPort) {
  const i = hostPort.lastIndexOf(':');
  const octets = hostPort.slice(0, i).split('.').map(Number);
  if (i < 0 || octets.length !== 4 || octets.some((o) => !(o >= 0 && o <= 255))) {
    throw new Error(`not an IPv4 HOST:PORT: ${hostPort}`);
  }
  return { tag: 'ipv4', val: { port: Number(hostPort.slice(i + 1)), address: octets } };
}

// Calls `step` until it stops failing with `would-block`, waiting on
// `pollable` in between.
function blocking(pollable, step) {
  for (let i = 0; i < 1000; i++) {
    try {
      return step();
    } catch (e) {
      if (errorText(e) !== 'would-block') throw e;
      pollable.block();
    }
  }
  throw new Error('still blocked');
}

function connect(hostPort) {
  const address = socketAddress(hostPort);
  const network = step('instance-network', () => instanceNetwork());
  const socket = step('create-tcp-socket', () => createTcpSocket('ipv4'));
  step('start-connect', () => socket.startConnect(network, address));
  const pollable = socket.subscribe();
  step('finish-connect', () => blocking(pollable, () => socket.finishConnect()));
  return `connected to ${hostPort}`;
}

function resolve(name) {
  const network = step('instance-network', () => instanceNetwork());
  const stream = step('resolve-addresses', () => resolveAddresses(network, name));
  const pollable = stream.subscribe();
  const found = [];
  for (;;) {
    const next = step('resolve-next-address', () => blocking(pollable, () => stream.resolveNextAddress()));
    if (next === undefined) break;
    found.push(next.tag === 'ipv4' ? next.val.join('.') : next.val.map((n) => n.toString(16)).join(':'));
  }
  return `${name} is ${found.join(', ')}`;
}

function environment() {
  const vars = getEnvironment();
  if (vars.length === 0) throw new Error('empty');
  return vars.map(([k]) => k).join(',');
}

function setting(key, fallback) {
  try {
    const v = JSON.parse(config() || 'null')?.[key];
    return typeof v === 'string' ? v : fallback;
  } catch {
    return fallback;
  }
}

export function checkConfig(_json) {}

export function handle(_event) {
  const target = setting('connect', '127.0.0.1:9');
  const name = setting('resolve', 'localhost');
  return [
    outcome('OpenFile', openFile),
    outcome('ListDir', listDir),
    outcome('Connect', () => connect(target)),
    outcome('Resolve', () => resolve(name)),
    outcome('Environment', environment),
  ];
}
