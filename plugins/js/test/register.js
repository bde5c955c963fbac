// `node --import ./test/register.js --test test/`: resolves the host
// interface `wasmwatch:plugin/host@0.4.0` to ./host.js, so the SDK and the
// plugins load under Node.js without the component (no componentize-js).
import { register } from 'node:module';

register(
  'data:text/javascript,' +
    encodeURIComponent(`
const HOST = ${JSON.stringify(new URL('./host.js', import.meta.url).href)};
export async function resolve(specifier, context, next) {
  if (specifier === 'wasmwatch:plugin/host@0.4.0') return { url: HOST, shortCircuit: true };
  return next(specifier, context);
}
`),
);
