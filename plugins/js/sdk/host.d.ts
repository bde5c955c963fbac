// Types of the host interface `wasmwatch:plugin/host@0.4.0` as
// componentize-js binds it (wit/0.4.0/plugin.wit), for editors and
// `tsc --checkJs`. The record, variant and enum types are the SDK's
// (index.js typedefs), written out here because an ambient module cannot
// import relative paths.
declare module 'wasmwatch:plugin/host@0.4.0' {
  type ObjectType = { group: string; version: string; kind: string };
  /** `config-map`, `secret`, or a kind by group, version and kind. */
  type ObjectKind =
    | { tag: 'config-map'; val?: undefined }
    | { tag: 'secret'; val?: undefined }
    | { tag: 'other'; val: ObjectType };
  type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error';
  type KeyValue = { key: string; value: string };
  /** A workload by API group (`apps`; the core group is ""), version and kind (`Deployment`). */
  type WorkloadRef = { group: string; version: string; kind: string; namespace: string; name: string };
  type UseVia = 'env' | 'env-from' | 'volume';
  /** One use of the object by a pod template; `key` undefined: the whole object. */
  type ObjectUse = { via: UseVia; key: string | undefined };
  type WorkloadInfo = {
    workload: WorkloadRef;
    labels: KeyValue[];
    annotations: KeyValue[];
    templateAnnotations: KeyValue[];
    /** False: returned only because a reload annotation names the object. */
    referenced: boolean;
    /** How the pod template uses the object (empty when not referenced). */
    uses: ObjectUse[];
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
  /**
   * The workloads in `namespace`, of any kind the host watches, whose pod
   * templates reference the object, then those whose reload annotation
   * names the object without a reference (`referenced` false).
   */
  export function workloadsReferencing(kind: ObjectKind, namespace: string, name: string): WorkloadInfo[];
  /** One Service, if it exists. */
  export function service(namespace: string, name: string): ServiceInfo | undefined;
  /** The ready endpoints (pods) of a Service. */
  export function readyEndpoints(namespace: string, service: string): Endpoint[];
  /** The Services in `namespace` that carry all of the given labels. */
  export function servicesWithLabels(namespace: string, labels: KeyValue[]): ServiceInfo[];
}
