// {{name}}: a wasmwatch plugin (WIT world wasmwatch:plugin/plugin@0.4.0).
// `handle` is called once per change of a selected ConfigMap or Secret (or
// another kind the manifest watches), in a fresh sandbox; what it returns
// is checked against the manifest's capabilities and executed by the host.
import { action, kindName, objectId, parseConfig } from './sdk/index.js';

export function checkConfig(json) {
  // Unknown fields are refused at start-up.
  parseConfig('{{name}}', json, {});
}

export function handle(event) {
  return [action.eventNormal('Changed', `${kindName(event)} ${objectId(event)} changed`)];
}
