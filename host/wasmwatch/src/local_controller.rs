//! The workload controllers of `wasmwatch local`'s embedded cluster.
//!
//! The test API server runs no controllers, and the local run's pods are
//! simulated (ready at once, on one node). This task stands in for the
//! Deployment, StatefulSet and DaemonSet controllers: it watches the three
//! kinds in every namespace and writes, through each object's `/status`,
//! the status a real controller reports once the pods of the object's
//! current generation are all running and ready — so `kubectl rollout
//! status` and `kubectl wait --for=condition=Available` work against the
//! local run, after a rollout restart too.
//!
//! The desired status is a pure function of the object ([`deployment_status`],
//! [`stateful_set_status`], [`daemon_set_status`]); [`status_patch`] turns it
//! into a merge patch when it differs from what the object reports. The
//! async shell ([`run`]) follows each kind with kube-rs's watcher and patches.
//!
//! What it models: every replica of the current pod template is ready and
//! available at once; Deployments report `Available` and `Progressing`
//! (`NewReplicaSetAvailable`) with the name of the new ReplicaSet;
//! StatefulSets honour `OnDelete` (pods are never deleted here, so they stay
//! at their revision) and a `RollingUpdate` partition; DaemonSets run on a
//! single node. Not modelled: paused Deployments, progress deadlines,
//! node selectors.
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, Deployment, DeploymentCondition, DeploymentStatus, StatefulSet,
    StatefulSetStatus,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A workload kind whose status this controller maintains.
pub trait Workload:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    type Status: PartialEq + Serialize;
    fn current_status(&self) -> Option<&Self::Status>;
    /// The status a real controller reports once every pod is ready.
    fn desired_status(&self, now: Timestamp) -> Self::Status;
}

impl Workload for Deployment {
    type Status = DeploymentStatus;
    fn current_status(&self) -> Option<&DeploymentStatus> {
        self.status.as_ref()
    }
    fn desired_status(&self, now: Timestamp) -> DeploymentStatus {
        deployment_status(self, now)
    }
}

impl Workload for StatefulSet {
    type Status = StatefulSetStatus;
    fn current_status(&self) -> Option<&StatefulSetStatus> {
        self.status.as_ref()
    }
    fn desired_status(&self, _now: Timestamp) -> StatefulSetStatus {
        stateful_set_status(self)
    }
}

impl Workload for DaemonSet {
    type Status = DaemonSetStatus;
    fn current_status(&self) -> Option<&DaemonSetStatus> {
        self.status.as_ref()
    }
    fn desired_status(&self, _now: Timestamp) -> DaemonSetStatus {
        daemon_set_status(self)
    }
}

/// The hash Kubernetes puts in ReplicaSet and ControllerRevision names:
/// FNV-1a (32 bit) of the pod template, its decimal digits mapped onto the
/// alphabet of `rand.SafeEncodeString`. (Kubernetes hashes a Go dump of the
/// template; this hashes its JSON, so the values differ, not the shape.)
pub fn template_hash(template: &PodTemplateSpec) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    for b in json {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string()
        .bytes()
        .map(|d| ALPHANUMS[usize::from(d) % ALPHANUMS.len()] as char)
        .collect()
}

/// Zero counts are omitted from workload status (`omitempty`).
fn non_zero(n: i32) -> Option<i32> {
    (n > 0).then_some(n)
}

/// A Deployment condition with status True, keeping the previous
/// condition's timestamps when nothing about it changed (transition time
/// when its status is unchanged, update time when its reason and message
/// are too), as the Deployment controller does.
fn deployment_condition(
    previous: Option<&DeploymentStatus>,
    type_: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> DeploymentCondition {
    let prev = previous
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_.as_deref() == Some(type_)))
        .filter(|c| c.status.as_deref() == Some("True"));
    let unchanged = prev.filter(|c| {
        c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(message.as_str())
    });
    DeploymentCondition {
        type_: Some(type_.into()),
        status: Some("True".into()),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(
            prev.and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone()),
        ),
        last_update_time: Some(
            unchanged
                .and_then(|c| c.last_update_time.clone())
                .unwrap_or_else(|| now.clone()),
        ),
    }
}

/// A Deployment whose new ReplicaSet has all `spec.replicas` pods ready and
/// available, and no old pods left.
pub fn deployment_status(d: &Deployment, now: Timestamp) -> DeploymentStatus {
    let replicas = d.spec.replicas.unwrap_or(1).max(0);
    let new_rs = format!("{}-{}", d.name_any(), template_hash(&d.spec.template));
    let previous = d.status.as_ref();
    let now = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: non_zero(replicas),
        updated_replicas: non_zero(replicas),
        ready_replicas: non_zero(replicas),
        available_replicas: non_zero(replicas),
        conditions: Some(vec![
            deployment_condition(
                previous,
                "Available",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
                &now,
            ),
            deployment_condition(
                previous,
                "Progressing",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_rs}\" has successfully progressed."),
                &now,
            ),
        ]),
        ..Default::default()
    }
}

/// A StatefulSet whose pods are all ready. With `RollingUpdate` the pods
/// from the partition ordinal up run the update revision (all of them
/// without a partition); with `OnDelete` they stay at the current revision
/// until deleted, which nothing does here.
pub fn stateful_set_status(s: &StatefulSet) -> StatefulSetStatus {
    let replicas = s.spec.replicas.unwrap_or(1).max(0);
    let update_revision = format!("{}-{}", s.name_any(), template_hash(&s.spec.template));
    let strategy = s.spec.update_strategy.as_ref();
    let on_delete = strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete");
    let partition = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .clamp(0, replicas);
    let current_revision = s
        .status
        .as_ref()
        .and_then(|s| s.current_revision.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| update_revision.clone());
    let (current_revision, current, updated) = if current_revision == update_revision {
        (update_revision.clone(), replicas, replicas)
    } else if on_delete {
        (current_revision, replicas, 0)
    } else if partition > 0 {
        (current_revision, partition, replicas - partition)
    } else {
        (update_revision.clone(), replicas, replicas)
    };
    StatefulSetStatus {
        observed_generation: s.metadata.generation,
        replicas,
        ready_replicas: non_zero(replicas),
        available_replicas: Some(replicas),
        current_replicas: non_zero(current),
        updated_replicas: non_zero(updated),
        current_revision: Some(current_revision),
        update_revision: Some(update_revision),
        collision_count: Some(0),
        ..Default::default()
    }
}

/// A DaemonSet on a one-node cluster: its one pod is updated and ready.
pub fn daemon_set_status(d: &DaemonSet) -> DaemonSetStatus {
    DaemonSetStatus {
        observed_generation: d.metadata.generation,
        desired_number_scheduled: 1,
        current_number_scheduled: 1,
        number_misscheduled: 0,
        number_ready: 1,
        number_available: Some(1),
        updated_number_scheduled: Some(1),
        ..Default::default()
    }
}

/// The JSON merge patch that sets `desired` as the object's status, or
/// `None` when it reports that already. Fields the current status has and
/// the desired one lacks are removed (set to null).
pub fn status_patch<S: PartialEq + Serialize>(current: Option<&S>, desired: &S) -> Option<Value> {
    if current == Some(desired) {
        return None;
    }
    let mut status = serde_json::to_value(desired).ok()?;
    let current = current.and_then(|c| serde_json::to_value(c).ok());
    if let (Some(Value::Object(current)), Value::Object(status)) = (current, &mut status) {
        for key in current.keys() {
            status.entry(key.clone()).or_insert(Value::Null);
        }
    }
    Some(serde_json::json!({ "status": status }))
}

/// Runs the three controllers until the task is dropped or aborted.
pub async fn run(client: Client) {
    tokio::join!(
        control::<Deployment>(client.clone()),
        control::<StatefulSet>(client.clone()),
        control::<DaemonSet>(client),
    );
}

/// Brings one object's status to the desired one.
async fn reconcile<K: Workload>(client: &Client, obj: &K) {
    let Some(patch) = status_patch(obj.current_status(), &obj.desired_status(Timestamp::now()))
    else {
        return;
    };
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api
        .patch_status(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        tracing::warn!(
            "local controller: cannot update the status of {} {ns}/{}: {e}",
            K::kind(&()),
            obj.name_any()
        );
    }
}

/// Reconciles every object of one kind, in every namespace, as kube-rs's
/// watcher reports it (list, then watch; relists and backs off on errors).
async fn control<K: Workload>(client: Client) {
    use futures_util::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let api: Api<K> = Api::all(client.clone());
    let objects = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures_util::pin_mut!(objects);
    while let Some(next) = objects.next().await {
        match next {
            Ok(obj) => reconcile(&client, &obj).await,
            Err(e) => tracing::debug!("local controller: {}: {e}", K::kind(&())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn deployment(generation: i64, replicas: i32, image: &str) -> Deployment {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "orders", "namespace": "shop", "generation": generation},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "orders"}},
                "template": {"metadata": {"labels": {"app": "orders"}},
                    "spec": {"containers": [{"name": "orders", "image": image}]}}},
            "status": {}
        }))
        .unwrap()
    }

    fn condition<'a>(s: &'a DeploymentStatus, type_: &str) -> &'a DeploymentCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_.as_deref() == Some(type_))
            .unwrap()
    }

    #[test]
    fn a_deployment_reports_its_replicas_ready_and_its_generation_observed() {
        let d = deployment(3, 3, "example/orders:1");
        let s = deployment_status(&d, at(1_000));
        assert_eq!(s.observed_generation, Some(3));
        for n in [
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
        ] {
            assert_eq!(n, Some(3));
        }
        assert_eq!(s.unavailable_replicas, None);
        let available = condition(&s, "Available");
        assert_eq!(available.status.as_deref(), Some("True"));
        assert_eq!(
            available.reason.as_deref(),
            Some("MinimumReplicasAvailable")
        );
        assert_eq!(available.last_transition_time, Some(Time(at(1_000))));
        let progressing = condition(&s, "Progressing");
        assert_eq!(progressing.status.as_deref(), Some("True"));
        assert_eq!(
            progressing.reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        let message = progressing.message.as_deref().unwrap();
        assert!(
            message.starts_with("ReplicaSet \"orders-")
                && message.ends_with("\" has successfully progressed."),
            "{message}"
        );
        assert_eq!(progressing.last_update_time, Some(Time(at(1_000))));
    }

    #[test]
    fn a_deployment_status_is_stable_and_a_new_template_bumps_only_progressing() {
        let mut d = deployment(1, 3, "example/orders:1");
        let first = deployment_status(&d, at(1_000));
        d.status = Some(first.clone());
        // Nothing changed: the same status (no patch), old timestamps.
        assert_eq!(deployment_status(&d, at(2_000)), first);
        assert_eq!(status_patch(Some(&first), &first), None);

        // A rollout restart: new template, new generation.
        let mut restarted = deployment(2, 3, "example/orders:1");
        restarted.spec.template.metadata = Some(
            serde_json::from_value(json!({"labels": {"app": "orders"},
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}}))
            .unwrap(),
        );
        restarted.status = Some(first.clone());
        let second = deployment_status(&restarted, at(3_000));
        assert_eq!(second.observed_generation, Some(2));
        let (p1, p2) = (
            condition(&first, "Progressing"),
            condition(&second, "Progressing"),
        );
        assert_ne!(p1.message, p2.message, "a new ReplicaSet name");
        assert_eq!(p2.last_transition_time, Some(Time(at(1_000))));
        assert_eq!(p2.last_update_time, Some(Time(at(3_000))));
        assert_eq!(
            condition(&second, "Available"),
            condition(&first, "Available")
        );
    }

    #[test]
    fn a_deployment_scaled_to_zero_omits_its_counts_and_the_patch_removes_them() {
        let mut d = deployment(2, 0, "x");
        d.status = Some(deployment_status(&deployment(1, 3, "x"), at(1)));
        let s = deployment_status(&d, at(2));
        assert_eq!(
            (s.replicas, s.updated_replicas, s.available_replicas),
            (None, None, None)
        );
        let patch = status_patch(d.status.as_ref(), &s).unwrap();
        assert_eq!(patch["status"]["replicas"], Value::Null);
        assert!(
            patch["status"]
                .as_object()
                .unwrap()
                .contains_key("replicas")
        );
        assert_eq!(patch["status"]["observedGeneration"], json!(2));
    }

    #[test]
    fn spec_replicas_defaults_to_one() {
        let mut d = deployment(1, 3, "x");
        d.spec.replicas = None;
        assert_eq!(deployment_status(&d, at(1)).ready_replicas, Some(1));
    }

    fn stateful_set(generation: i64, image: &str, strategy: Value) -> StatefulSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "shop", "generation": generation},
            "spec": {"replicas": 2, "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}}, "updateStrategy": strategy,
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": image}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_rolling_update_stateful_set_moves_every_pod_to_the_update_revision() {
        let rolling = json!({"type": "RollingUpdate"});
        let mut s = stateful_set(1, "web:1", rolling.clone());
        let first = stateful_set_status(&s);
        assert_eq!(first.observed_generation, Some(1));
        assert_eq!(first.replicas, 2);
        assert_eq!(first.ready_replicas, Some(2));
        assert_eq!(first.updated_replicas, Some(2));
        assert_eq!(first.current_revision, first.update_revision);
        assert!(
            first
                .update_revision
                .as_deref()
                .unwrap()
                .starts_with("web-")
        );
        s.status = Some(first.clone());
        assert_eq!(
            status_patch(s.status.as_ref(), &stateful_set_status(&s)),
            None
        );

        let mut updated = stateful_set(2, "web:2", rolling);
        updated.status = Some(first.clone());
        let second = stateful_set_status(&updated);
        assert_eq!(second.observed_generation, Some(2));
        assert_ne!(second.update_revision, first.update_revision);
        assert_eq!(second.current_revision, second.update_revision);
        assert_eq!(second.updated_replicas, Some(2));
    }

    #[test]
    fn a_partition_or_on_delete_keeps_pods_at_the_current_revision() {
        let first =
            stateful_set_status(&stateful_set(1, "web:1", json!({"type": "RollingUpdate"})));
        let mut partitioned = stateful_set(
            2,
            "web:2",
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}),
        );
        partitioned.status = Some(first.clone());
        let s = stateful_set_status(&partitioned);
        assert_eq!(s.current_revision, first.current_revision);
        assert_ne!(s.update_revision, first.update_revision);
        assert_eq!((s.current_replicas, s.updated_replicas), (Some(1), Some(1)));

        let mut on_delete = stateful_set(2, "web:2", json!({"type": "OnDelete"}));
        on_delete.status = Some(first.clone());
        let s = stateful_set_status(&on_delete);
        assert_eq!(s.current_revision, first.current_revision);
        assert_eq!((s.current_replicas, s.updated_replicas), (Some(2), None));
    }

    #[test]
    fn a_daemon_set_runs_one_updated_available_pod() {
        let d: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "shop", "generation": 4},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}}}
        }))
        .unwrap();
        let s = daemon_set_status(&d);
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.desired_number_scheduled, 1);
        assert_eq!(s.updated_number_scheduled, Some(1));
        assert_eq!(s.number_available, Some(1));
        assert_eq!(s.number_ready, 1);
    }

    #[test]
    fn template_hashes_are_stable_and_use_the_safe_alphabet() {
        let a = deployment(1, 1, "a");
        let b = deployment(1, 1, "b");
        let hash = |d: &Deployment| template_hash(&d.spec.template);
        assert_eq!(hash(&a), hash(&a.clone()));
        assert_ne!(hash(&a), hash(&b));
        assert!(
            hash(&a)
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
            "{}",
            hash(&a)
        );
    }
}
