//! Kubernetes executors: rollout restarts
//! ([`Action::Restart`](wasmwatch_core::Action::Restart)) and Events
//! ([`Action::Event`](wasmwatch_core::Action::Event), and the host's own
//! Events about restarts and dead letters).
//!
//! ```text
//! restart(workload, hash) ─▶ GET the workload ─▶ template annotation == hash? ─▶ AlreadyAtContent
//!                                                   │ no
//!                                                   ▼
//!     merge PATCH {metadata.resourceVersion (precondition),
//!                  spec.template.metadata.annotations: {<key>: hash, restartedAt: now}} ─▶ Restarted
//!
//! event(origin, ..) ─▶ POST core/v1 Event in the object's namespace
//! ```
//!
//! ## Restarts are recorded on the workload
//!
//! A restart sets two annotations on the pod template (see "Kinds" for
//! where it is): `kubectl.kubernetes.io/restartedAt`
//! (RFC 3339, as `kubectl rollout restart` does) and one annotation per
//! referenced object holding the action's full content hash (for example
//! `config-hash.wasmwatch.io/configmap.orders: configmap/orders:3f2a…`).
//! Changing the template makes the workload's controller roll its pods.
//! Before patching, the executor reads the workload: when the template
//! already holds the same content hash under that key, the restart is
//! [`RestartOutcome::AlreadyAtContent`] and nothing is written. The state
//! lives on the workload itself, so the same content never restarts a
//! workload twice, whichever replica acts, after a failover, a resync or a
//! redelivered change; a content that changes back (A → B → A) restarts
//! each time, since the annotation then holds B.
//!
//! Reloader's records count as ours (issue 34 §3): a workload whose
//! `STAKATER_<NAME>_<KIND>` variable, or whose
//! [`LAST_RELOADED_FROM_ANNOTATION`] naming the object, holds Reloader's
//! hash of the content ([`Content::reloader`]) is already at it, so a
//! cluster moving from Reloader restarts nothing on any delivery path.
//!
//! The patch carries the resourceVersion the executor read, so a workload
//! changed in between is not patched on stale knowledge: the API server
//! answers 409, and the executor reads and compares again at once (up to
//! [`CONFLICT_REREADS`] times, then the pipeline retries with backoff).
//! Kept on purpose (issue 34 §5): a restart's merge patch of annotations
//! would apply without it, but two restarts of one content racing (an old
//! leader's request landing after its successor's, or two objects' changes
//! of one workload) would then roll the workload twice; with it the second
//! re-reads, finds the content recorded and writes nothing. On a real
//! cluster the Deployment controller's status write after a restart makes
//! the next restart's patch conflict: that costs a re-read (a few
//! milliseconds), no longer a retry after the pipeline's backoff (0.88 s
//! measured on kube-apiserver 1.32).
//!
//! ## Kinds
//!
//! Every kind goes through the dynamic API (`Api<DynamicObject>`). The
//! apps/v1 kinds, batch/v1 CronJob and Job, and argoproj.io/v1alpha1
//! Rollout are known; another kind is looked up through API discovery (its
//! plural and scope, remembered), must be namespaced, and has its pod
//! template at `spec.template` — one without a pod template there fails for
//! good, naming the path.
//!
//! - Deployment, StatefulSet, DaemonSet, Rollout, other kinds: the pod
//!   template at `spec.template`.
//! - CronJob: the job template's pod template
//!   (`spec.jobTemplate.spec.template`). No Job is started (Reloader starts
//!   one at once; see plugins/reloader-spec.md §4.1): the next scheduled
//!   run gets the new config, and its pods carry the record. The same
//!   content patches once.
//! - Job: its pod template cannot change. With the Job's annotation
//!   [`RECREATE_JOB_ANNOTATION`]` = "true"` the Job is deleted (uid and
//!   version as preconditions, propagation Background) and created again
//!   under its name with the content recorded on its template, without the
//!   generated selector and labels (Reloader's re-creation, §4.2, made
//!   opt-in); otherwise a permanent failure says how to opt in. A create
//!   that fails after the delete is retried a few times, then logged with
//!   the Job's manifest.
//! - Rollout with strategy restart-at (a WIT 0.3.0 restart's own, or
//!   Reloader's [`ROLLOUT_STRATEGY_ANNOTATION`]` = "restart"` on the
//!   Rollout): a merge patch of `spec.restartAt` (now) recording the
//!   content hashes on the Rollout's own annotations (same keys); the
//!   template is not changed. restart-at of any other kind fails for good.
//!
//! Built-in kinds (API groups without a dot) take the env-vars strategy's
//! strategic merge patch; custom resources have none, so their container
//! list is read, changed and written whole in a JSON merge patch, the
//! version read being the precondition.
//!
//! ## Annotation keys
//!
//! The content hash is `<object>:<content>` (the rollout-restart plugin
//! sends `configmap/<name>:<digest>`, `secret/<name>:<digest>`); the object
//! is what precedes the last `:`. An annotation key is `prefix/name` where
//! the name part is at most 63 characters of `[A-Za-z0-9._-]`, starting and
//! ending alphanumeric, while object names may have 253 characters. So the
//! key is [`HASH_ANNOTATION_PREFIX`]`/` followed by:
//!
//! - `<kind>.<name>` for an object `<kind>/<name>` (kind `[a-z0-9]+`, name a
//!   lowercase DNS subdomain as ConfigMap and Secret names are) when that
//!   fits in 63 characters: readable, e.g. `configmap.orders`;
//! - otherwise `<slug>_<sha256>`: a readable slug (the object lowercased,
//!   `/` as `.`, other characters as `-`, cut to 42 characters) then `_` and
//!   the first 20 hex digits (80 bits) of the SHA-256 of the object. The
//!   `_` never occurs in the first form (it is not allowed in Kubernetes
//!   object names), so the two forms never collide;
//! - `content` for a hash without an object (no `:`, or nothing before it):
//!   one key, so such hashes restart on every change of hash without adding
//!   an annotation per content.
//!
//! The mapping is deterministic: every replica and every version computes
//! the same key for the same object ([`hash_annotation_key`]).
//!
//! ## Events
//!
//! core/v1 Events, created directly (`Api<Event>`) in the object's
//! namespace, in the shape client-go's recorder gives them and with the
//! fields events.k8s.io/v1 requires of new Events: `involvedObject` (with
//! uid and resourceVersion when known), reason (cut to 128 bytes), message
//! (cut to 1024 bytes on a character boundary), type, `source.component`,
//! `reportingComponent`, `reportingInstance`, `action` (the reason),
//! `firstTimestamp`, `lastTimestamp`, `eventTime`, `count`, and a unique
//! name `<object>.<hex>` like client-go's. The host's own Events repeat
//! as a growing `count` on one Event ([`crate::recorder`] patches count,
//! `lastTimestamp` and message, as client-go's correlator does): a burst of
//! thousands of changes writes a handful of Events. Not kube's
//! `kube::runtime::events::Recorder`: it writes events.k8s.io/v1 Events,
//! which our test API server stores apart from core/v1 ones (it does not
//! convert between the two), so `kubectl get events` would not list them
//! there.
//!
//! ## Failures
//!
//! Every message names the workload (`Deployment shop/orders`) or the object.
//!
//! - [`ExecError::Retryable`]: 409 Conflict (the workload changed since it
//!   was read; an Event name taken), 408, 429, 5xx, connection failures, and
//!   no answer within the executor's timeout (30 s by default).
//! - [`ExecError::Permanent`]: 404 (the workload, or the namespace, does
//!   not exist), 403 (the message says to check wasmwatch's RBAC rules),
//!   422 and other 4xx, invalid arguments (empty names, empty reasons).
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, Preconditions, PropagationPolicy,
};
use kube::discovery::Scope;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{debug, info};
use wasmwatch_core::action::{
    EventType, RESTART_STRATEGY_ANNOTATION, RestartStrategy, WorkloadKind, WorkloadRef,
};

use crate::{ExecError, Origin, error_chain};

/// The prefix of the pod-template annotations that record content hashes.
pub const HASH_ANNOTATION_PREFIX: &str = "config-hash.wasmwatch.io";
/// The annotation `kubectl rollout restart` sets on the pod template.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";

/// The workload annotation that lets the executor re-create a Job (delete
/// it, then create a copy) to restart it: `"true"`.
pub const RECREATE_JOB_ANNOTATION: &str = "wasmwatch.io/recreate-job";
/// Reloader's annotation on an Argo Rollout: `restart` restarts it through
/// `spec.restartAt`, anything else (`rollout`, the default) changes its pod
/// template (a new revision).
pub const ROLLOUT_STRATEGY_ANNOTATION: &str = "reloader.stakater.com/rollout-strategy";
/// The kind whose `spec.restartAt` the restart-at strategy sets.
const ROLLOUT_KIND: &str = "argoproj.io/v1alpha1/Rollout";
/// The labels the API server puts on a Job's pod template (and the selector
/// it generates from them), removed from the copy that re-creates it.
const JOB_GENERATED_LABELS: [&str; 4] = [
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "job-name",
];
/// Creates of a re-created Job tried before giving up.
const JOB_CREATE_ATTEMPTS: u64 = 5;

/// Default bound on each API request.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest name part of an annotation key.
const MAX_KEY_NAME: usize = 63;
/// Hex digits of SHA-256 in a hashed key name.
const KEY_HASH_HEX: usize = 20;
/// Limits kube-apiserver enforces on new Events.
const MAX_EVENT_MESSAGE: usize = 1024;
const MAX_EVENT_REASON: usize = 128;
const MAX_REPORTING_INSTANCE: usize = 128;
/// Longest object name (DNS subdomain).
const MAX_NAME: usize = 253;
/// Workload uids remembered for Events (cleared when full).
const MAX_REMEMBERED_UIDS: usize = 4096;

/// What [`KubeExecutor::restart`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartOutcome {
    /// The pod template was patched: the workload rolls its pods.
    Restarted,
    /// The template already records this content: nothing was written.
    AlreadyAtContent,
}

/// Restarts workloads and records Events through the Kubernetes API.
pub struct KubeExecutor {
    client: kube::Client,
    /// `source.component`, `reportingComponent` and the field manager.
    component: String,
    /// `reportingInstance`: this replica.
    instance: String,
    timeout: Duration,
    /// Workload uids seen by `restart`, for the `involvedObject` of
    /// workload Events (`kubectl describe` matches Events by uid).
    uids: Mutex<HashMap<WorkloadRef, String>>,
    /// The resources of kinds found through discovery.
    resources: Mutex<HashMap<WorkloadKind, ApiResource>>,
    /// Read a workload's namespace before restarting it (see
    /// [`KubeExecutor::reading_namespaces`]).
    reads_namespaces: bool,
}

/// Where a workload kind is served and how it is restarted.
struct Target {
    resource: ApiResource,
    /// JSON pointer of the pod template: `/spec/template`, or
    /// `/spec/jobTemplate/spec/template` for a CronJob.
    template: &'static str,
    /// Has strategic merge patches (built-in kinds).
    strategic: bool,
    /// batch Job: re-created, not patched.
    job: bool,
    /// Argo Rollout: may be restarted through `spec.restartAt`.
    rollout: bool,
}

impl KubeExecutor {
    /// `component` names the reporter of Events (`wasmwatch`), `instance`
    /// this replica (its identity, e.g. the Pod name).
    pub fn new(client: kube::Client, component: &str, instance: &str) -> KubeExecutor {
        KubeExecutor {
            client,
            component: component.to_string(),
            instance: truncate(instance, MAX_REPORTING_INSTANCE).to_string(),
            timeout: DEFAULT_TIMEOUT,
            uids: Mutex::new(HashMap::new()),
            resources: Mutex::new(HashMap::new()),
            reads_namespaces: false,
        }
    }

    /// Reads a workload's namespace before restarting it, and restarts
    /// nothing in one being deleted (see [`KubeExecutor::restart_with`]).
    /// Needs RBAC `get` on `namespaces`, which only a cluster-wide install
    /// grants (a Role cannot): `wasmwatch run` turns it on when it watches
    /// every namespace. A namespace that cannot be read counts as live.
    pub fn reading_namespaces(mut self, reads: bool) -> Self {
        self.reads_namespaces = reads;
        self
    }

    /// Bounds each API request (default 30 s); a request without an answer
    /// by then is a retryable failure.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Restarts `workload` for `content_hash` unless its pod template
    /// already records that content (see the module docs). `reason` is
    /// logged.
    pub async fn restart(
        &self,
        workload: &WorkloadRef,
        content_hash: &str,
        reason: &str,
    ) -> Result<RestartOutcome, ExecError> {
        self.restart_for_all(workload, &[(content_hash, None)], reason)
            .await
    }

    /// One restart of `workload` for several contents (each a content hash
    /// with its [`unkeyed_content_hash`]): one read, then one patch that
    /// records every content the template does not record yet. Already at
    /// every content: nothing is written. Issue 20's burst control: two
    /// objects changed together roll the workload once.
    pub async fn restart_for_all(
        &self,
        workload: &WorkloadRef,
        contents: &[(&str, Option<&str>)],
        reason: &str,
    ) -> Result<RestartOutcome, ExecError> {
        let written = self
            .restart_with(workload, contents, reason, RestartStrategy::Annotations)
            .await?;
        Ok(if written.contains(&true) {
            RestartOutcome::Restarted
        } else {
            RestartOutcome::AlreadyAtContent
        })
    }

    /// One restart of `workload` for `contents` with `strategy` unless the
    /// workload's annotations say otherwise ([`RESTART_STRATEGY_ANNOTATION`];
    /// on a Rollout, [`ROLLOUT_STRATEGY_ANNOTATION`]), saying per content
    /// (in the order of `contents`) whether the restart recorded it
    /// (`true`) or the workload already did (`false`): the workload was
    /// restarted when any is true, and the Events about it name only those
    /// objects. The newest record of the object decides whether it is at
    /// the content: our annotation (on the template, or a Rollout's
    /// `restartAt` record on its metadata) when there is one, else the
    /// variable (ours or Reloader's), else Reloader's `last-reloaded-from`;
    /// a restart writes its strategy's record and keeps the other one of
    /// the object, if there is one, in step. So switching strategies, or
    /// from Reloader, restarts nothing by itself, and a record only an
    /// older writer kept never hides a change. See the module docs for the
    /// kinds.
    ///
    /// A write answered 409 (the workload changed since it was read: on a
    /// real cluster mostly its controller's status write after a rollout)
    /// reads and compares again at once, up to [`CONFLICT_REREADS`] times,
    /// before the conflict goes to the pipeline's backoff.
    pub async fn restart_with(
        &self,
        workload: &WorkloadRef,
        contents: &[(&str, Option<&str>)],
        reason: &str,
        strategy: RestartStrategy,
    ) -> Result<Vec<bool>, ExecError> {
        let contents: Vec<Content<'_>> = contents
            .iter()
            .map(|&(hash, unkeyed)| Content {
                hash,
                unkeyed,
                reloader: None,
            })
            .collect();
        self.restart_contents(workload, &contents, reason, strategy)
            .await
    }

    /// [`KubeExecutor::restart_with`], each content with what else records
    /// it ([`Content`]).
    pub async fn restart_contents(
        &self,
        workload: &WorkloadRef,
        contents: &[Content<'_>],
        reason: &str,
        strategy: RestartStrategy,
    ) -> Result<Vec<bool>, ExecError> {
        let mut rereads = 0;
        loop {
            match self
                .restart_once(workload, contents, reason, strategy)
                .await
            {
                Err(e) if is_conflict(&e) && rereads < CONFLICT_REREADS => {
                    debug!("{e}; reading the workload again");
                    rereads += 1;
                }
                result => return result,
            }
        }
    }

    async fn restart_once(
        &self,
        workload: &WorkloadRef,
        contents: &[Content<'_>],
        reason: &str,
        strategy: RestartStrategy,
    ) -> Result<Vec<bool>, ExecError> {
        let what = format!("restart of {}", describe(workload));
        if workload.namespace.is_empty() || workload.name.is_empty() {
            return Err(ExecError::Permanent(format!(
                "{what}: the workload needs a namespace and a name"
            )));
        }
        if contents.is_empty() || contents.iter().any(|c| c.hash.is_empty()) {
            return Err(ExecError::Permanent(format!(
                "{what}: the content hash is empty"
            )));
        }
        if let Some(why) = workload.kind.problem() {
            return Err(ExecError::Permanent(format!(
                "{what}: not a valid workload kind: {why}"
            )));
        }
        let target = self.target(workload, &what).await?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &workload.namespace, &target.resource);
        let current = self
            .request(&what, "reading the workload", api.get(&workload.name))
            .await?;
        if let Some(why) = self.being_deleted(workload, &current).await {
            // A namespace's teardown deletes its ConfigMaps before its
            // Deployments (with `reloadOnDelete` each deletion restarted
            // a dying workload): nothing to refresh there.
            info!(%what, "not restarted: {why}");
            return Ok(vec![false; contents.len()]);
        }
        if let Some(uid) = &current.metadata.uid {
            self.remember_uid(workload, uid);
        }
        let strategy = effective_strategy(&what, &target, &current, strategy);
        if strategy == RestartStrategy::RestartAt && !target.rollout {
            return Err(ExecError::Permanent(format!(
                "{what}: strategy restart-at restarts Argo Rollouts only \
                 ({ROLLOUT_KIND}); use annotations or env-vars"
            )));
        }
        let template = current.data.pointer(target.template);
        if strategy != RestartStrategy::RestartAt && !template.is_some_and(Value::is_object) {
            let hint = if target.rollout {
                " (a Rollout with spec.workloadRef has none: restart the workload it references)"
            } else {
                ""
            };
            return Err(ExecError::Permanent(format!(
                "{what}: it has no pod template at {}{hint}",
                dotted(target.template)
            )));
        }
        let pod_spec = template.and_then(|t| t.get("spec"));
        let recorded_annotations = template.and_then(|t| t.pointer("/metadata/annotations"));
        // restart-at's record, on the Rollout itself.
        let recorded_on_workload = current
            .metadata
            .annotations
            .as_ref()
            .filter(|_| target.rollout);
        let mut env: Vec<(String, String, String)> = Vec::new();
        let mut annotations = serde_json::Map::new();
        let mut previous = Vec::new();
        let mut written = vec![false; contents.len()];
        for (content, written) in contents.iter().zip(&mut written) {
            let (content_hash, unkeyed) = (&content.hash, &content.unkeyed);
            let key = hash_annotation_key(content_hash);
            let recorded = recorded_annotations
                .and_then(|a| a.get(&key))
                .and_then(Value::as_str);
            let on_workload = recorded_on_workload
                .and_then(|a| a.get(&key))
                .map(String::as_str);
            let mut variable = env_var_for(pod_spec, content_hash);
            let in_env = variable.as_ref().is_some_and(|v| {
                v.current.as_deref().is_some_and(|cur| {
                    Some(cur) == digest_of(content_hash)
                        || (unkeyed.is_some() && Some(cur) == unkeyed.and_then(digest_of))
                        || Some(cur) == content.reloader
                })
            });
            let by_reloader = content.reloader.is_some_and(|hash| {
                let record = recorded_annotations
                    .and_then(|a| a.get(LAST_RELOADED_FROM_ANNOTATION))
                    .and_then(Value::as_str);
                reloaded_from(record, content_hash, &workload.namespace, hash)
            });
            // The newest record decides: ours on the annotations when there
            // is one (a restart keeps a variable of the object in step
            // with it, below), else the variable (ours or Reloader's), else
            // Reloader's `last-reloaded-from`. A record that only an older
            // writer kept (Reloader's variable after we restarted for
            // another content) must not hide a change back to its content.
            let annotated = recorded.is_some() || on_workload.is_some();
            let has_variable = variable.as_ref().is_some_and(|v| v.current.is_some());
            let at_content = if annotated {
                records_content(recorded, content_hash, *unkeyed)
                    || records_content(on_workload, content_hash, *unkeyed)
            } else if has_variable {
                in_env
            } else {
                by_reloader
            };
            if at_content {
                debug!(
                    kind = ?workload.kind,
                    namespace = %workload.namespace,
                    name = %workload.name,
                    %key,
                    content_hash,
                    "restart: the workload already runs this content"
                );
                continue;
            }
            *written = true;
            if let (Some(v), Some(hash)) = (&mut variable, content.reloader)
                && content_hash.starts_with("configmap/")
            {
                // Reloader's own value, so that a switch back to Reloader
                // restarts nothing either (see `RestartStrategy::EnvVars`).
                v.value = hash.to_string();
            }
            match (strategy, variable) {
                (RestartStrategy::EnvVars, Some(v)) => {
                    previous.push(v.current.clone().unwrap_or_default());
                    if recorded.is_some() {
                        // Our annotation of the object, kept in step.
                        annotations.insert(key, json!(content_hash));
                    }
                    env.push((v.container, v.name, v.value));
                }
                // Hashes not of a ConfigMap or Secret have no variable;
                // restart-at records every content on the Rollout.
                (strategy, variable) => {
                    previous.push(recorded.or(on_workload).unwrap_or("").to_string());
                    annotations.insert(key, json!(content_hash));
                    if strategy == RestartStrategy::Annotations
                        && let Some(v) = variable.filter(|v| v.current.is_some())
                    {
                        // The object's variable (Reloader's, or ours from
                        // env-vars), kept in step.
                        env.push((v.container, v.name, v.value));
                    }
                }
            }
        }
        if annotations.is_empty() && env.is_empty() {
            return Ok(written);
        }
        let keys: Vec<String> = annotations.keys().cloned().collect();
        let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let mut metadata = json!({});
        if let Some(rv) = &current.metadata.resource_version {
            // A precondition: 409 if the workload changed since the GET.
            metadata["resourceVersion"] = json!(rv);
        }
        let params = PatchParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        if strategy == RestartStrategy::RestartAt {
            // Argo Rollouts restarts the pods created before restartAt; the
            // template (and so the revision) stays as it is.
            metadata["annotations"] = Value::Object(annotations);
            let patch = json!({"metadata": metadata, "spec": {"restartAt": now}});
            self.request(
                &what,
                "setting spec.restartAt",
                api.patch(&workload.name, &params, &Patch::Merge(&patch)),
            )
            .await?;
            info!(
                kind = ?workload.kind,
                namespace = %workload.namespace,
                name = %workload.name,
                keys = %keys.join(","),
                reason,
                previous = %previous.join(","),
                "restart: spec.restartAt set"
            );
            return Ok(written);
        }
        if target.job {
            if !annotations.is_empty() {
                annotations.insert(RESTARTED_AT_ANNOTATION.to_string(), json!(now));
            }
            return self
                .recreate_job(workload, &what, &api, &current, &env, annotations, reason)
                .await
                .map(|()| written);
        }
        if !env.is_empty() {
            if strategy == RestartStrategy::Annotations {
                annotations.insert(RESTARTED_AT_ANNOTATION.to_string(), json!(now));
            }
            return self
                .patch_env(
                    workload,
                    &what,
                    &api,
                    &target,
                    &current,
                    env,
                    annotations,
                    reason,
                )
                .await
                .map(|()| written);
        }
        annotations.insert(RESTARTED_AT_ANNOTATION.to_string(), json!(now));
        let patch = json!({
            "metadata": metadata,
            "spec": nest(
                &target.template["/spec".len()..],
                json!({"metadata": {"annotations": annotations}}),
            ),
        });
        self.request(
            &what,
            "patching the pod template",
            api.patch(&workload.name, &params, &Patch::Merge(&patch)),
        )
        .await?;
        info!(
            kind = ?workload.kind,
            namespace = %workload.namespace,
            name = %workload.name,
            keys = %keys.join(","),
            reason,
            previous = %previous.join(","),
            "restart: pod template patched"
        );
        Ok(written)
    }

    /// The `env-vars` strategy's patch, setting each variable in its
    /// container, plus any annotations for hashes without a variable; the
    /// version read is a precondition, as for annotations. Built-in kinds
    /// get a strategic merge patch (containers and their `env` merge by
    /// name); custom resources, which have no strategic merge patch, a
    /// JSON merge patch of the whole container list as read and changed
    /// (the precondition keeps a concurrent change from being lost).
    #[expect(
        clippy::too_many_arguments,
        reason = "private: the restart's parts, each a plain value"
    )]
    async fn patch_env(
        &self,
        workload: &WorkloadRef,
        what: &str,
        api: &Api<DynamicObject>,
        target: &Target,
        current: &DynamicObject,
        env: Vec<(String, String, String)>,
        annotations: serde_json::Map<String, Value>,
        reason: &str,
    ) -> Result<(), ExecError> {
        let mut template = if target.strategic {
            let mut containers: Vec<(String, Vec<Value>)> = Vec::new();
            for (container, name, value) in &env {
                let entry = json!({"name": name, "value": value});
                match containers.iter_mut().find(|(c, _)| c == container) {
                    Some((_, vars)) => vars.push(entry),
                    None => containers.push((container.clone(), vec![entry])),
                }
            }
            let containers: Vec<Value> = containers
                .into_iter()
                .map(|(name, env)| json!({"name": name, "env": env}))
                .collect();
            json!({"spec": {"containers": containers}})
        } else {
            let mut containers = current
                .data
                .pointer(&format!("{}/spec/containers", target.template))
                .cloned()
                .unwrap_or_else(|| json!([]));
            set_env(&mut containers, &env);
            json!({"spec": {"containers": containers}})
        };
        if !annotations.is_empty() {
            template["metadata"] = json!({"annotations": annotations});
        }
        let mut metadata = json!({});
        if let Some(rv) = &current.metadata.resource_version {
            metadata["resourceVersion"] = json!(rv);
        }
        let patch = json!({
            "metadata": metadata,
            "spec": nest(&target.template["/spec".len()..], template),
        });
        let params = PatchParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        let patch = if target.strategic {
            Patch::Strategic(&patch)
        } else {
            Patch::Merge(&patch)
        };
        self.request(
            what,
            "patching the pod template",
            api.patch(&workload.name, &params, &patch),
        )
        .await?;
        let names: Vec<&str> = env.iter().map(|(_, n, _)| n.as_str()).collect();
        info!(
            kind = ?workload.kind,
            namespace = %workload.namespace,
            name = %workload.name,
            variables = %names.join(","),
            reason,
            "restart: pod template patched (env-vars)"
        );
        Ok(())
    }

    /// A Job's pod template cannot change: with the workload annotation
    /// [`RECREATE_JOB_ANNOTATION`]` = "true"`, the Job is deleted (its
    /// version and uid as preconditions, propagation Background: its pods
    /// go) and a copy created under the same name, with the content
    /// recorded on its template (so the same content does not re-create it
    /// again) and without what the API server generated (uid, version,
    /// status, the controller-uid selector and template labels), as
    /// Reloader does. Without the annotation: a permanent failure saying
    /// how to opt in.
    #[expect(
        clippy::too_many_arguments,
        reason = "private: the restart's parts, each a plain value"
    )]
    async fn recreate_job(
        &self,
        workload: &WorkloadRef,
        what: &str,
        api: &Api<DynamicObject>,
        current: &DynamicObject,
        env: &[(String, String, String)],
        annotations: serde_json::Map<String, Value>,
        reason: &str,
    ) -> Result<(), ExecError> {
        let opted_in = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECREATE_JOB_ANNOTATION))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        if !opted_in {
            return Err(ExecError::Permanent(format!(
                "{what}: a Job's pod template cannot change, so restarting it means deleting \
                 the Job (and its pods) and creating it again; wasmwatch does that only for \
                 Jobs annotated {RECREATE_JOB_ANNOTATION}: \"true\""
            )));
        }
        let copy = job_copy(current, env, annotations);
        let delete = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        self.request(
            what,
            "deleting the Job to re-create it",
            api.delete(&workload.name, &delete),
        )
        .await?;
        let params = PostParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        // The Job is gone: a retry of the action would find nothing to
        // re-create, so the create is retried here (409: the old Job is
        // still being deleted).
        let mut attempt = 0;
        let created = loop {
            attempt += 1;
            match self
                .request(what, "creating the Job again", api.create(&params, &copy))
                .await
            {
                Ok(created) => break created,
                Err(e) if e.is_retryable() && attempt < JOB_CREATE_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
                Err(e) => {
                    tracing::error!(
                        manifest = %serde_json::to_string(&copy).unwrap_or_default(),
                        "{what}: the Job was deleted but could not be created again: {e}"
                    );
                    return Err(ExecError::Permanent(format!(
                        "{e}; the Job was deleted and not created again (its manifest is in \
                         wasmwatch's log)"
                    )));
                }
            }
        };
        if let Some(uid) = &created.metadata.uid {
            self.remember_uid(workload, uid);
        }
        info!(
            kind = ?workload.kind,
            namespace = %workload.namespace,
            name = %workload.name,
            reason,
            "restart: Job deleted and created again"
        );
        Ok(())
    }

    /// A Kubernetes Event on the changed object.
    pub async fn event(
        &self,
        origin: &Origin,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ExecError> {
        self.event_at(origin, event_type, reason, message, Timestamp::now())
            .await
    }

    /// [`KubeExecutor::event`] stamped with `at`, when what it reports
    /// happened (a queued Event is written later).
    pub async fn event_at(
        &self,
        origin: &Origin,
        event_type: EventType,
        reason: &str,
        message: &str,
        at: Timestamp,
    ) -> Result<(), ExecError> {
        let object = self.object_reference(origin);
        let what = format!(
            "event {reason:?} on {} {}/{}",
            origin.kind.as_str(),
            origin.namespace,
            origin.name
        );
        self.emit(
            &what,
            object,
            Some(&origin.plugin),
            event_type,
            reason,
            message,
            at,
        )
        .await
    }

    /// A Kubernetes Event of the host itself on a Lease (the state Lease
    /// it could not read, for one).
    pub async fn lease_event(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<String>,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ExecError> {
        let object = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            uid,
            resource_version: None,
            field_path: None,
        };
        let what = format!("event {reason:?} on Lease {namespace}/{name}");
        self.emit(
            &what,
            object,
            None,
            event_type,
            reason,
            message,
            Timestamp::now(),
        )
        .await
    }

    /// A Kubernetes Event on a workload (its uid when `restart` saw it).
    pub async fn workload_event(
        &self,
        workload: &WorkloadRef,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ExecError> {
        let uid = self
            .uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(workload)
            .cloned();
        let object = ObjectReference {
            api_version: Some(workload.kind.api_version()),
            kind: Some(kind_name(&workload.kind).into()),
            name: Some(workload.name.clone()),
            namespace: Some(workload.namespace.clone()),
            uid,
            resource_version: None,
            field_path: None,
        };
        let what = format!("event {reason:?} on {}", describe(workload));
        self.emit(
            &what,
            object,
            None,
            event_type,
            reason,
            message,
            Timestamp::now(),
        )
        .await
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "private: the Event's fields, each a plain value"
    )]
    async fn emit(
        &self,
        what: &str,
        object: ObjectReference,
        plugin: Option<&str>,
        event_type: EventType,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) -> Result<(), ExecError> {
        let namespace = object.namespace.clone().unwrap_or_default();
        let name = object.name.clone().unwrap_or_default();
        if namespace.is_empty() || name.is_empty() {
            return Err(ExecError::Permanent(format!(
                "{what}: the object needs a namespace and a name"
            )));
        }
        if reason.is_empty() {
            return Err(ExecError::Permanent(format!(
                "{what}: an Event needs a reason"
            )));
        }
        let reason = truncate(reason, MAX_EVENT_REASON);
        let annotations = plugin.filter(|p| !p.is_empty()).map(|p| {
            [("wasmwatch.io/plugin".to_string(), p.to_string())]
                .into_iter()
                .collect()
        });
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name(&name)),
                namespace: Some(namespace.clone()),
                annotations,
                ..Default::default()
            },
            involved_object: object,
            reason: Some(reason.to_string()),
            message: Some(truncate_message(message)),
            type_: Some(
                match event_type {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.instance.clone()),
            // Required (with eventTime) by kube-apiserver for new-style Events.
            action: Some(reason.to_string()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let params = PostParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        self.request(what, "creating the Event", api.create(&params, &event))
            .await?;
        debug!(%what, "event recorded");
        Ok(())
    }

    /// Where `workload`'s kind is served and where its pod template is.
    /// The kinds of
    /// [`RESTARTABLE_KINDS`](wasmwatch_core::capability::RESTARTABLE_KINDS) are known; another kind is looked
    /// up through discovery (once per kind: its plural and scope), and its
    /// pod template is taken at `spec.template`.
    async fn target(&self, workload: &WorkloadRef, what: &str) -> Result<Target, ExecError> {
        let (group, version, kind) = workload.kind.gvk();
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let known = matches!(
            (group, version, kind),
            ("apps", "v1", "Deployment" | "StatefulSet" | "DaemonSet")
                | ("batch", "v1", "CronJob" | "Job")
                | ("argoproj.io", "v1alpha1", "Rollout")
        );
        let resource = if known {
            ApiResource::from_gvk(&gvk)
        } else {
            let cached = self
                .resources
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&workload.kind)
                .cloned();
            match cached {
                Some(r) => r,
                None => self.discover(&gvk, what).await?,
            }
        };
        if !known {
            let mut resources = self.resources.lock().unwrap_or_else(|e| e.into_inner());
            if resources.len() >= MAX_REMEMBERED_UIDS {
                resources.clear();
            }
            resources.insert(workload.kind.clone(), resource.clone());
        }
        Ok(Target {
            template: template_pointer(group, kind),
            // Built-in kinds (groups without a dot) have strategic merge
            // patches; custom resources do not.
            strategic: !group.contains('.'),
            job: group == "batch" && kind == "Job",
            rollout: group == "argoproj.io" && kind == "Rollout",
            resource,
        })
    }

    /// The resource of a kind the executor does not know, by discovery.
    async fn discover(&self, gvk: &GroupVersionKind, what: &str) -> Result<ApiResource, ExecError> {
        let doing = format!("looking up kind {} in API discovery", gvk.kind);
        let found = tokio::time::timeout(
            self.timeout,
            kube::discovery::pinned_kind(&self.client, gvk),
        )
        .await;
        let (resource, caps) = match found {
            Ok(Ok(found)) => found,
            Ok(Err(kube::Error::Discovery(_))) => {
                return Err(ExecError::Permanent(format!(
                    "{what}: the API server serves no kind {} in {}",
                    gvk.kind,
                    gvk.api_version()
                )));
            }
            Ok(Err(e)) => return Err(classify_error(what, &doing, &e)),
            Err(_) => {
                return Err(ExecError::Retryable(format!(
                    "{what}: no answer from the API server within {:?} when {doing}",
                    self.timeout
                )));
            }
        };
        if caps.scope != Scope::Namespaced {
            return Err(ExecError::Permanent(format!(
                "{what}: kind {} is not namespaced, so it is not a workload",
                gvk.kind
            )));
        }
        Ok(resource)
    }

    fn remember_uid(&self, workload: &WorkloadRef, uid: &str) {
        let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        if uids.get(workload).is_some_and(|u| u == uid) {
            return;
        }
        if uids.len() >= MAX_REMEMBERED_UIDS {
            uids.clear();
        }
        uids.insert(workload.clone(), uid.to_string());
    }

    /// Runs one API request within the executor's timeout and classifies
    /// its failure.
    /// Why `workload` (as read: `current`) must not be restarted: it is
    /// being deleted, or its namespace is (kube-apiserver still accepts
    /// patches there; read only [`KubeExecutor::reading_namespaces`]). A
    /// namespace that cannot be read counts as live.
    async fn being_deleted(
        &self,
        workload: &WorkloadRef,
        current: &DynamicObject,
    ) -> Option<String> {
        if current.metadata.deletion_timestamp.is_some() {
            return Some("the workload is being deleted".into());
        }
        if !self.reads_namespaces {
            return None;
        }
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let ns = tokio::time::timeout(self.timeout, namespaces.get_opt(&workload.namespace))
            .await
            .ok()?
            .ok()??;
        let terminating = ns.metadata.deletion_timestamp.is_some()
            || ns.status.and_then(|s| s.phase).as_deref() == Some("Terminating");
        terminating.then(|| format!("namespace {} is being deleted", workload.namespace))
    }

    async fn request<T>(
        &self,
        what: &str,
        doing: &str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ExecError> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify_error(what, doing, &e)),
            Err(_) => Err(ExecError::Retryable(format!(
                "{what}: no answer from the API server within {:?} when {doing}",
                self.timeout
            ))),
        }
    }

    /// The `involvedObject` of an Event on the changed object (as
    /// [`KubeExecutor::event`] writes it).
    pub fn object_reference(&self, origin: &Origin) -> ObjectReference {
        let api_version = match origin.kind {
            wasmwatch_core::ObjectKind::Custom(k) => k.api_version(),
            _ => "v1",
        };
        ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(origin.kind.kind_name().into()),
            name: Some(origin.name.clone()),
            namespace: Some(origin.namespace.clone()),
            uid: non_empty(&origin.uid),
            resource_version: non_empty(&origin.resource_version),
            field_path: None,
        }
    }

    /// The `involvedObject` of an Event on a workload, with its uid when
    /// `restart` saw it (as [`KubeExecutor::workload_event`] writes it).
    pub fn workload_reference(&self, workload: &WorkloadRef) -> ObjectReference {
        let uid = self
            .uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(workload)
            .cloned();
        ObjectReference {
            api_version: Some(workload.kind.api_version()),
            kind: Some(kind_name(&workload.kind).into()),
            name: Some(workload.name.clone()),
            namespace: Some(workload.namespace.clone()),
            uid,
            resource_version: None,
            field_path: None,
        }
    }

    /// Creates an Event that stands for `count` occurrences, the first at
    /// `first` and the last at `last` (the recorder's aggregation, see
    /// [`crate::recorder`]), otherwise shaped as [`KubeExecutor::event`]'s;
    /// returns its name, for [`KubeExecutor::patch_event`].
    pub async fn create_event(
        &self,
        e: &crate::recorder::NewEvent<'_>,
    ) -> Result<String, ExecError> {
        let namespace = e.object.namespace.clone().unwrap_or_default();
        let object_name = e.object.name.clone().unwrap_or_default();
        let what = format!(
            "event {:?} on {} {namespace}/{object_name}",
            e.reason,
            e.object.kind.as_deref().unwrap_or_default()
        );
        if namespace.is_empty() || object_name.is_empty() {
            return Err(ExecError::Permanent(format!(
                "{what}: the object needs a namespace and a name"
            )));
        }
        if e.reason.is_empty() {
            return Err(ExecError::Permanent(format!(
                "{what}: an Event needs a reason"
            )));
        }
        let reason = truncate(e.reason, MAX_EVENT_REASON);
        let annotations = e.plugin.filter(|p| !p.is_empty()).map(|p| {
            [("wasmwatch.io/plugin".to_string(), p.to_string())]
                .into_iter()
                .collect()
        });
        let name = event_name(&object_name);
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                annotations,
                ..Default::default()
            },
            involved_object: e.object.clone(),
            reason: Some(reason.to_string()),
            message: Some(truncate_message(e.message)),
            type_: Some(
                match e.event_type {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(reason.to_string()),
            first_timestamp: Some(Time(e.first)),
            last_timestamp: Some(Time(e.last.max(e.first))),
            // When it was first observed (required of new-style Events).
            event_time: Some(MicroTime(e.first)),
            count: Some(i32::try_from(e.count.max(1)).unwrap_or(i32::MAX)),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let params = PostParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        self.request(&what, "creating the Event", api.create(&params, &event))
            .await?;
        debug!(%what, count = e.count, "event recorded");
        Ok(name)
    }

    /// Adds occurrences to an Event [`KubeExecutor::create_event`] wrote: a
    /// JSON merge PATCH of `count` (the new total), `lastTimestamp` and
    /// `message`, the fields client-go's recorder patches. A missing Event
    /// (expired after the API server's Event TTL, or deleted) and a refused
    /// patch (RBAC rules without `patch` on events) are answers, not
    /// errors: the caller creates a new Event.
    pub async fn patch_event(
        &self,
        namespace: &str,
        name: &str,
        count: u32,
        last: Timestamp,
        message: &str,
    ) -> Result<crate::recorder::EventPatched, ExecError> {
        use crate::recorder::EventPatched;
        let what = format!("event {namespace}/{name}");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({
            "count": i32::try_from(count.max(1)).unwrap_or(i32::MAX),
            "lastTimestamp": Time(last),
            "message": truncate_message(message),
        });
        let params = PatchParams {
            field_manager: Some(self.component.clone()),
            ..Default::default()
        };
        let answer = tokio::time::timeout(
            self.timeout,
            api.patch(name, &params, &Patch::Merge(&patch)),
        )
        .await;
        match answer {
            Ok(Ok(_)) => {
                debug!(%what, count, "event updated");
                Ok(EventPatched::Patched)
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(EventPatched::NotFound),
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                Ok(EventPatched::Forbidden(status.message.clone()))
            }
            Ok(Err(e)) => Err(classify_error(&what, "patching the Event", &e)),
            Err(_) => Err(ExecError::Retryable(format!(
                "{what}: no answer from the API server within {:?} when patching the Event",
                self.timeout
            ))),
        }
    }
}

/// How a 409 reads in an [`ExecError`].
const CONFLICT: &str = "conflict (409)";

/// Re-reads of a workload whose restart met a 409, before the conflict is
/// an error (see [`KubeExecutor::restart_with`]).
pub const CONFLICT_REREADS: u32 = 3;

/// Whether `e` is a 409 (see [`classify_error`]).
fn is_conflict(e: &ExecError) -> bool {
    matches!(e, ExecError::Retryable(m) if m.contains(CONFLICT))
}

/// The failure class of a kube error (see the module docs).
fn classify_error(what: &str, doing: &str, e: &kube::Error) -> ExecError {
    match e {
        kube::Error::Api(status) => {
            let code = status.code;
            let detail = if status.message.is_empty() {
                status.reason.clone()
            } else {
                status.message.clone()
            };
            match code {
                404 => {
                    ExecError::Permanent(format!("{what}: not found (404) when {doing}: {detail}"))
                }
                403 if detail.contains("because it is being terminated") => {
                    ExecError::Permanent(format!(
                        "{what}: refused (403) when {doing}: the namespace is being deleted \
                         (NamespaceLifecycle admits nothing new there; this is not RBAC): {detail}"
                    ))
                }
                403 => ExecError::Permanent(format!(
                    "{what}: forbidden (403) when {doing}: {detail}; check the RBAC rules of wasmwatch's ServiceAccount"
                )),
                409 => ExecError::Retryable(format!("{what}: {CONFLICT} when {doing}: {detail}")),
                408 | 429 | 500..=599 => ExecError::Retryable(format!(
                    "{what}: API server answered {code} when {doing}: {detail}"
                )),
                _ => ExecError::Permanent(format!(
                    "{what}: API server answered {code} when {doing}: {detail}"
                )),
            }
        }
        kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => {
            ExecError::Permanent(format!("{what}: invalid request when {doing}: {e}"))
        }
        _ => ExecError::Retryable(format!("{what}: {doing} failed: {}", error_chain(e))),
    }
}

/// The JSON pointer of a kind's pod template.
pub(crate) fn template_pointer(group: &str, kind: &str) -> &'static str {
    if group == "batch" && kind == "CronJob" {
        "/spec/jobTemplate/spec/template"
    } else {
        "/spec/template"
    }
}

/// `/spec/template` as `spec.template`.
fn dotted(pointer: &str) -> String {
    pointer.trim_start_matches('/').replace('/', ".")
}

/// `value` at `pointer` (`/template` → `{"template": value}`).
fn nest(pointer: &str, value: Value) -> Value {
    pointer
        .rsplit('/')
        .filter(|s| !s.is_empty())
        .fold(value, |inner, key| json!({ key: inner }))
}

/// The strategy a restart uses: the plugin's (`strategy`), unless the
/// workload's [`RESTART_STRATEGY_ANNOTATION`] names another; on an Argo
/// Rollout, Reloader's [`ROLLOUT_STRATEGY_ANNOTATION`] `restart` means
/// restart-at and any other value a template change (the annotations
/// strategy when restart-at was asked for).
fn effective_strategy(
    what: &str,
    target: &Target,
    current: &DynamicObject,
    strategy: RestartStrategy,
) -> RestartStrategy {
    let annotations = current.metadata.annotations.as_ref();
    let mut strategy = match annotations.and_then(|a| a.get(RESTART_STRATEGY_ANNOTATION)) {
        None => strategy,
        Some(v) => RestartStrategy::parse(v).unwrap_or_else(|| {
            tracing::warn!(
                "{what}: annotation {RESTART_STRATEGY_ANNOTATION}: {v:?} is neither \
                 `annotations` nor `env-vars`; using {strategy:?}"
            );
            strategy
        }),
    };
    if target.rollout
        && let Some(v) = annotations.and_then(|a| a.get(ROLLOUT_STRATEGY_ANNOTATION))
    {
        if v.trim() == "restart" {
            strategy = RestartStrategy::RestartAt;
        } else if strategy == RestartStrategy::RestartAt {
            strategy = RestartStrategy::Annotations;
        }
    }
    strategy
}

/// Sets each `(container, variable, value)` in a container list as read:
/// the variable's value replaced (a `valueFrom` dropped) or the variable
/// appended; other containers and variables stay as they are.
fn set_env(containers: &mut Value, env: &[(String, String, String)]) {
    let Some(list) = containers.as_array_mut() else {
        return;
    };
    for (container, name, value) in env {
        let Some(c) = list
            .iter_mut()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(container.as_str()))
        else {
            continue;
        };
        if !c.get("env").is_some_and(Value::is_array) {
            c["env"] = json!([]);
        }
        let vars = c["env"].as_array_mut().expect("an array");
        match vars
            .iter_mut()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name.as_str()))
        {
            Some(var) => *var = json!({"name": name, "value": value}),
            None => vars.push(json!({"name": name, "value": value})),
        }
    }
}

/// The Job that re-creates `current`: its name, labels, annotations and
/// owners, its spec with `env` and `annotations` applied to the pod
/// template, and without what the API server generated (uid, version,
/// status; unless `spec.manualSelector`, the selector and the template
/// labels it matches).
fn job_copy(
    current: &DynamicObject,
    env: &[(String, String, String)],
    annotations: serde_json::Map<String, Value>,
) -> DynamicObject {
    let manual = current.data.pointer("/spec/manualSelector") == Some(&json!(true));
    let mut data = current.data.clone();
    if let Some(o) = data.as_object_mut() {
        o.remove("status");
    }
    let mut labels = current.metadata.labels.clone();
    if !manual {
        if let Some(spec) = data.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("selector");
        }
        if let Some(l) = data
            .pointer_mut("/spec/template/metadata/labels")
            .and_then(Value::as_object_mut)
        {
            for k in JOB_GENERATED_LABELS {
                l.remove(k);
            }
        }
        if let Some(l) = labels.as_mut() {
            for k in JOB_GENERATED_LABELS {
                l.remove(k);
            }
        }
    }
    if let Some(template) = data.pointer_mut("/spec/template") {
        if !annotations.is_empty() {
            if !template.get("metadata").is_some_and(Value::is_object) {
                template["metadata"] = json!({});
            }
            let meta = &mut template["metadata"];
            if !meta.get("annotations").is_some_and(Value::is_object) {
                meta["annotations"] = json!({});
            }
            let a = meta["annotations"].as_object_mut().expect("an object");
            a.extend(annotations);
        }
        if let Some(containers) = template.pointer_mut("/spec/containers") {
            set_env(containers, env);
        }
    }
    DynamicObject {
        types: current.types.clone(),
        metadata: ObjectMeta {
            name: current.metadata.name.clone(),
            namespace: current.metadata.namespace.clone(),
            labels,
            annotations: current.metadata.annotations.clone(),
            owner_references: current.metadata.owner_references.clone(),
            ..Default::default()
        },
        data,
    }
}

/// The digest part of a content hash (`configmap/orders:<digest>`).
/// One content a restart is for, with the forms other writers record the
/// same content in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Content<'a> {
    /// The action's content hash (`configmap/<name>:<digest>`).
    pub hash: &'a str,
    /// The same content as versions before keyed Secret digests wrote it
    /// ([`unkeyed_content_hash`]).
    pub unkeyed: Option<&'a str>,
    /// Reloader's hash of the content ([`reloader_hash_for`]): a workload
    /// whose `STAKATER_<NAME>_<KIND>` variable, or whose
    /// [`LAST_RELOADED_FROM_ANNOTATION`] naming the object, holds it is at
    /// this content.
    pub reloader: Option<&'a str>,
}

/// Reloader's annotations-strategy record on a pod template: JSON
/// `{"type":"CONFIGMAP"|"SECRET","name","namespace","hash",...}` of the
/// last object it restarted the workload for.
pub const LAST_RELOADED_FROM_ANNOTATION: &str = "reloader.stakater.com/last-reloaded-from";

/// Reloader's hash of the content `content_hash` is for, from the
/// decision's origin (digest, Reloader's hash): only when the content hash
/// holds that digest (a plugin's own content hash is another content).
pub fn reloader_hash_for<'a>(
    content_hash: &str,
    reloader_hash: Option<&'a (String, String)>,
) -> Option<&'a str> {
    let (digest, hash) = reloader_hash?;
    (!digest.is_empty() && digest_of(content_hash) == Some(digest.as_str()))
        .then_some(hash.as_str())
}

/// Whether `record`, a template's [`LAST_RELOADED_FROM_ANNOTATION`], names
/// the object of `content_hash` (in `namespace`) with Reloader's `hash` of
/// its content. `wasmwatch run --dry-run` asks the same of its cached
/// workloads.
pub fn reloaded_from(
    record: Option<&str>,
    content_hash: &str,
    namespace: &str,
    hash: &str,
) -> bool {
    let Some((kind, name)) = content_hash
        .rsplit_once(':')
        .and_then(|(object, _)| object.split_once('/'))
    else {
        return false;
    };
    let kind = match kind {
        "configmap" => "CONFIGMAP",
        "secret" => "SECRET",
        "secretproviderclass" => "SECRETPROVIDERCLASS",
        _ => return false,
    };
    let Some(source) = record.and_then(|raw| serde_json::from_str::<Value>(raw).ok()) else {
        return false;
    };
    let field = |f: &str| source.get(f).and_then(Value::as_str);
    field("type") == Some(kind)
        && field("name") == Some(name)
        && field("hash") == Some(hash)
        && field("namespace").is_none_or(|ns| ns.is_empty() || ns == namespace)
}

fn digest_of(content_hash: &str) -> Option<&str> {
    content_hash.rsplit_once(':').map(|(_, d)| d)
}

/// Reloader's variable name for an object (its `ConvertToEnvVarName`):
/// `STAKATER_` + the name upper-cased, `[A-Z0-9]` kept, every run of other
/// characters after a kept one as one `_`, + `_CONFIGMAP` or `_SECRET`.
/// `db-creds.v2` → `STAKATER_DB_CREDS_V2_SECRET`.
pub fn reloader_env_name(kind: &str, name: &str) -> String {
    let mut out = String::from("STAKATER_");
    let mut last_valid = false;
    for c in name.bytes().map(|b| b.to_ascii_uppercase()) {
        if c.is_ascii_uppercase() || c.is_ascii_digit() {
            out.push(c as char);
            last_valid = true;
        } else {
            if last_valid {
                out.push('_');
            }
            last_valid = false;
        }
    }
    out.push('_');
    out.push_str(&kind.to_ascii_uppercase());
    out
}

/// The variable the `env-vars` strategy sets for one content hash.
struct EnvVar {
    container: String,
    name: String,
    value: String,
    /// Its value in that container now, if set.
    current: Option<String>,
}

/// For a hash of a ConfigMap or Secret (`configmap/<name>:<digest>`), the
/// variable and the container it goes in: the first container that mounts
/// a volume of the object, else the first whose `env`/`envFrom` uses it,
/// else the first container (Reloader's rule; an init container's use
/// also picks the first container). `None` for other hashes or a template
/// without containers.
fn env_var_for(pod_spec: Option<&Value>, content_hash: &str) -> Option<EnvVar> {
    let (object, digest) = content_hash.rsplit_once(':')?;
    let (kind, name) = object.split_once('/')?;
    let (volume_source, name_field, key_ref, env_from) = match kind {
        "configmap" => ("configMap", "name", "configMapKeyRef", "configMapRef"),
        "secret" => ("secret", "secretName", "secretKeyRef", "secretRef"),
        _ => return None,
    };
    let spec = pod_spec?;
    let containers = spec.get("containers")?.as_array()?;
    let first = containers.first()?.get("name")?.as_str()?;
    let str_at = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    // Volumes built from the object (plain or projected).
    let volumes: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| {
            str_at(v, &format!("/{volume_source}/{name_field}")).as_deref() == Some(name)
                || v.pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .is_some_and(|sources| {
                        sources.iter().any(|s| {
                            str_at(s, &format!("/{volume_source}/name")).as_deref() == Some(name)
                        })
                    })
        })
        .filter_map(|v| str_at(v, "/name"))
        .collect();
    let mounts = |c: &Value| {
        c.get("volumeMounts")
            .and_then(Value::as_array)
            .is_some_and(|ms| {
                ms.iter()
                    .any(|m| str_at(m, "/name").is_some_and(|n| volumes.contains(&n)))
            })
    };
    let uses_env = |c: &Value| {
        let env = c.get("env").and_then(Value::as_array).is_some_and(|env| {
            env.iter()
                .any(|e| str_at(e, &format!("/valueFrom/{key_ref}/name")).as_deref() == Some(name))
        });
        env || c
            .get("envFrom")
            .and_then(Value::as_array)
            .is_some_and(|ef| {
                ef.iter()
                    .any(|e| str_at(e, &format!("/{env_from}/name")).as_deref() == Some(name))
            })
    };
    let container = containers
        .iter()
        .find(|c| mounts(c))
        .or_else(|| containers.iter().find(|c| uses_env(c)))
        .and_then(|c| c.get("name")?.as_str())
        .unwrap_or(first)
        .to_string();
    let var = reloader_env_name(kind, name);
    let current = containers
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(container.as_str()))
        .and_then(|c| c.get("env")?.as_array())
        .and_then(|env| {
            env.iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(var.as_str()))
        })
        .and_then(|e| e.get("value")?.as_str())
        .map(str::to_string);
    Some(EnvVar {
        container,
        name: var,
        value: digest.to_string(),
        current,
    })
}

/// Whether a pod template whose [`hash_annotation_key`] annotation is
/// `recorded` already runs `content_hash`: a restart then writes nothing
/// ([`RestartOutcome::AlreadyAtContent`]); `unkeyed` is the same content as
/// versions before keyed Secret digests wrote it. `wasmwatch run --dry-run`
/// asks the same of its cached workloads.
pub fn records_content(recorded: Option<&str>, content_hash: &str, unkeyed: Option<&str>) -> bool {
    recorded.is_some() && (recorded == Some(content_hash) || recorded == unkeyed)
}

/// `content_hash` with the keyed digest of `unkeyed_digest` (keyed, plain)
/// replaced by the plain one: how versions before keyed Secret digests
/// wrote the same content on pod templates (the bundled rollout-restart
/// sends `secret/<name>:<digest>`). `None` when the hash does not hold
/// the keyed digest.
pub fn unkeyed_content_hash(
    content_hash: &str,
    unkeyed_digest: Option<&(String, String)>,
) -> Option<String> {
    let (keyed, plain) = unkeyed_digest?;
    (!keyed.is_empty() && content_hash.contains(keyed.as_str()))
        .then(|| content_hash.replace(keyed.as_str(), plain))
}

/// The annotation key recording content hashes of the object `content_hash`
/// is about (see the module docs).
pub fn hash_annotation_key(content_hash: &str) -> String {
    let object = content_hash
        .rsplit_once(':')
        .map_or("", |(object, _)| object);
    format!("{HASH_ANNOTATION_PREFIX}/{}", key_name(object))
}

fn key_name(object: &str) -> String {
    if object.is_empty() {
        return "content".to_string();
    }
    if let Some((kind, name)) = object.split_once('/')
        && !kind.is_empty()
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && is_lower_dns_subdomain(name)
        && kind.len() + 1 + name.len() <= MAX_KEY_NAME
    {
        return format!("{kind}.{name}");
    }
    let digest = hex::encode(Sha256::digest(object.as_bytes()));
    let slug: String = object
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            '/' => '.',
            _ => '-',
        })
        .take(MAX_KEY_NAME - 1 - KEY_HASH_HEX)
        .collect();
    let slug = slug.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let slug = if slug.is_empty() { "object" } else { slug };
    format!("{slug}_{}", &digest[..KEY_HASH_HEX])
}

/// `[a-z0-9]([-a-z0-9.]*[a-z0-9])?` (length is checked by the caller).
fn is_lower_dns_subdomain(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-' || b == b'.')
        }
        _ => false,
    }
}

/// `<object>.<hex>` as client-go names Events: unique per process (a
/// strictly increasing nanosecond clock), cut to a valid name length.
fn event_name(object: &str) -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(Timestamp::now().as_nanosecond()).unwrap_or(0);
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or(0);
    let stamp = now.max(previous + 1);
    let suffix = format!(".{stamp:x}");
    let base = truncate(object, MAX_NAME - suffix.len())
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{base}{suffix}")
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The message within kube-apiserver's 1024 bytes; a cut one ends in `…`.
fn truncate_message(message: &str) -> String {
    if message.len() <= MAX_EVENT_MESSAGE {
        return message.to_string();
    }
    let mark = "…";
    format!(
        "{}{mark}",
        truncate(message, MAX_EVENT_MESSAGE - mark.len())
    )
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The Kubernetes kind of a workload (`Deployment`, `CronJob`).
pub fn kind_name(kind: &WorkloadKind) -> &str {
    kind.kind()
}

/// `Deployment shop/orders`, `batch/v1/CronJob shop/nightly`.
fn describe(w: &WorkloadRef) -> String {
    format!("{} {}/{}", w.kind, w.namespace, w.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_names_are_reloaders() {
        assert_eq!(
            reloader_env_name("configmap", "orders"),
            "STAKATER_ORDERS_CONFIGMAP"
        );
        assert_eq!(
            reloader_env_name("secret", "db-creds.v2"),
            "STAKATER_DB_CREDS_V2_SECRET"
        );
        // Leading junk dropped, a run of it one `_`, a trailing run too.
        assert_eq!(
            reloader_env_name("configmap", "-a--b-"),
            "STAKATER_A_B__CONFIGMAP"
        );
    }

    #[test]
    fn the_variable_goes_in_the_container_that_uses_the_object() {
        let spec = serde_json::json!({
            "volumes": [{"name": "cfg", "projected": {"sources": [{"configMap": {"name": "mounted"}}]}},
                        {"name": "sec", "secret": {"secretName": "db"}}],
            "containers": [
                {"name": "sidecar", "env": [{"name": "STAKATER_ORDERS_CONFIGMAP", "value": "old"}]},
                {"name": "app", "envFrom": [{"configMapRef": {"name": "orders"}}],
                 "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]},
                {"name": "db", "volumeMounts": [{"name": "sec", "mountPath": "/s"}],
                 "env": [{"name": "STAKATER_DB_SECRET", "value": "d1"}]},
            ]
        });
        let at = |hash: &str| {
            let v = env_var_for(Some(&spec), hash).unwrap();
            (v.container, v.name, v.value, v.current)
        };
        assert_eq!(
            at("configmap/orders:d2"),
            (
                "app".into(),
                "STAKATER_ORDERS_CONFIGMAP".into(),
                "d2".into(),
                None
            ),
            "envFrom, not the sidecar that merely has a variable of that name"
        );
        assert_eq!(at("configmap/mounted:x").0, "app", "a projected volume");
        assert_eq!(
            at("secret/db:d1"),
            (
                "db".into(),
                "STAKATER_DB_SECRET".into(),
                "d1".into(),
                Some("d1".into())
            )
        );
        assert_eq!(
            at("configmap/unused:x").0,
            "sidecar",
            "else the first container"
        );
        assert!(env_var_for(Some(&spec), "deleted").is_none());
        assert!(env_var_for(Some(&spec), "service/x:1").is_none());
    }

    /// kube-apiserver's rule for an annotation key's name part.
    fn valid_name_part(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= MAX_KEY_NAME
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    }

    fn name_part(hash: &str) -> String {
        let key = hash_annotation_key(hash);
        let (prefix, name) = key.split_once('/').unwrap();
        assert_eq!(prefix, HASH_ANNOTATION_PREFIX);
        assert!(valid_name_part(name), "{key:?} from {hash:?} is not valid");
        name.to_string()
    }

    #[test]
    fn annotation_keys_are_valid_readable_and_deterministic() {
        assert_eq!(name_part("configmap/orders:abc"), "configmap.orders");
        assert_eq!(name_part("secret/db-creds:deleted"), "secret.db-creds");
        // The object is what precedes the last ':'.
        assert_eq!(name_part("configmap/a:b:c"), name_part("configmap/a:b:d"));
        assert_ne!(name_part("configmap/a:x"), name_part("secret/a:x"));
        assert_eq!(name_part("digest-only"), "content");
        assert_eq!(name_part(":digest"), "content");
        // 63 characters still fit as they are.
        let fits = format!("configmap/{}", "a".repeat(53));
        assert_eq!(
            name_part(&format!("{fits}:d")),
            format!("configmap.{}", "a".repeat(53))
        );
        let odd = [
            format!("configmap/{}:d", "a".repeat(54)),
            format!("configmap/{}:d", "x.".repeat(126) + "y"),
            "ConfigMap/Orders:d".to_string(),
            "configmap/-bad-:d".to_string(),
            "a/b/c:d".to_string(),
            "///:d".to_string(),
            "ünïcödé/名前:d".to_string(),
            "configmap/:d".to_string(),
            "/x:d".to_string(),
        ];
        let mut seen = std::collections::HashSet::new();
        for hash in &odd {
            let name = name_part(hash);
            assert!(name.contains('_'), "{name}");
            assert_eq!(name, name_part(hash), "deterministic");
            assert!(seen.insert(name), "distinct objects, distinct keys");
        }
        let long = name_part(&format!("configmap/{}:d", "a".repeat(54)));
        assert!(long.starts_with("configmap.aaaa"), "{long}");
        // Two long names differing only after the slug still differ.
        let a = name_part(&format!("configmap/{}-1:d", "a".repeat(60)));
        let b = name_part(&format!("configmap/{}-2:d", "a".repeat(60)));
        assert_ne!(a, b);
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
        let m = truncate_message(&"é".repeat(1000));
        assert!(
            m.len() <= MAX_EVENT_MESSAGE && m.ends_with('…'),
            "{}",
            m.len()
        );
        assert_eq!(truncate_message("short"), "short");
        let exact = "a".repeat(MAX_EVENT_MESSAGE);
        assert_eq!(truncate_message(&exact), exact);
    }

    #[test]
    fn event_names_are_unique_and_valid() {
        let a = event_name("orders");
        let b = event_name("orders");
        assert_ne!(a, b);
        assert!(a.starts_with("orders."), "{a}");
        let long = event_name(&format!("{}-x", "a.".repeat(125)));
        assert!(long.len() <= MAX_NAME, "{}", long.len());
        let (base, _) = long.rsplit_once('.').unwrap();
        assert!(
            base.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{long}"
        );
    }

    #[test]
    fn failure_classes() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure("deployments.apps \"web\" ...", "Reason")
                    .with_code(code)
                    .boxed(),
            )
        };
        let class = |code| classify_error("restart of Deployment ns/web", "doing", &api(code));
        for code in [409, 408, 429, 500, 503, 504] {
            assert!(class(code).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 410, 422] {
            assert!(!class(code).is_retryable(), "{code}");
        }
        let forbidden = class(403).to_string();
        assert!(
            forbidden.contains("RBAC") && forbidden.contains("Deployment ns/web"),
            "{forbidden}"
        );
        assert!(class(404).to_string().contains("not found"));
    }
}
