// Types of the host interface `wasmwatch:plugin/host@0.2.0` as
// componentize-js binds it (wit/plugin.wit), for editors and `tsc --checkJs`.
// The record and enum types are the SDK's (index.js typedefs), written out
// here because an ambient module cannot import relative paths.
declare module 'wasmwatch:plugin/host@0.2.0' {
  type ObjectKind = 'config-map' | 'secret';
  type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error';
  type KeyValue = { key: string; value: string };
  type WorkloadKind = 'deployment' | 'stateful-set' | 'daemon-set';
  type WorkloadRef = { kind: WorkloadKind; namespace: string; name: string };
  type WorkloadInfo = {
    workload: WorkloadRef;
    labels: KeyValue[];
    annotations: KeyValue[];
    templateAnnotations: KeyValue[];
  };
  type ServicePort = { name: string | undefined; port: number };
  type ServiceInfo = {
    namespace: string;
    name: string;
    labels: KeyValue[];
    annotations: KeyValue[];
    ports: ServicePort[];
  };
  type Endpoint = { address: string; pod: string | undefined; ports: ServicePort[] };

  /** Writes a line to the host's log, tagged with the plugin's name. */
  export function log(level: LogLevel, message: string): void;
  /** The plugin's `config` from the manifest, as JSON text. */
  export function config(): string;
  /** The Deployments, StatefulSets and DaemonSets in `namespace` whose pod templates reference the object. */
  export function workloadsReferencing(kind: ObjectKind, namespace: string, name: string): WorkloadInfo[];
  /** One Service, if it exists. */
  export function service(namespace: string, name: string): ServiceInfo | undefined;
  /** The ready endpoints (pods) of a Service. */
  export function readyEndpoints(namespace: string, service: string): Endpoint[];
  /** The Services in `namespace` that carry all of the given labels. */
  export function servicesWithLabels(namespace: string, labels: KeyValue[]): ServiceInfo[];
}
