//! The executors behind the pipeline: one [`Execute`] that sends each
//! action to the HTTP, bus or Kubernetes executor, and records the host's
//! own Events off the delivery path, each naming what was done:
//!
//! | action | done | failed for good |
//! |---|---|---|
//! | `refreshService` | `Refreshed` on the Service (`… of Service ns/svc: 3 pods answered`), once per refresh however many changes it carried | `RefreshFailed` |
//! | `http` (a webhook) | `WebhookCalled` (`POST https://… answered 200`) | `WebhookFailed` |
//! | `publish` | `RefreshPublished` | `RefreshFailed` |
//! | `restart` | `Reloaded` on the workload in Stakater Reloader's words (only when the template was patched; one per object whose content the patch recorded) | `RefreshFailed`; and `ReloadFail` (Warning, Reloader's words) on the workload for every failed attempt, retried or not |
//! | `event` | the Event itself (written by the action, not aggregated) | `RefreshFailed` |
//! | (none: the plugin call failed through its retries) | | `PluginFailed` (`plugin P failed: …; the change is dead-lettered`) |
//!
//! Every Event of the table but the plugins' own goes through
//! [`crate::recorder::EventRecorder`], which aggregates repeats: one
//! Event per object, type, reason, plugin and message (up to 10 messages
//! per object, type, reason and plugin in 10 minutes, then one
//! `(combined from similar events)` Event) whose `count` and
//! `lastTimestamp` grow, written at most once per 5 s per Event.
use std::sync::Arc;
use std::time::Duration;

use wasmwatch_core::Action;
use wasmwatch_core::action::{EventType, RestartStrategy, WorkloadRef};

use crate::pipeline::{BoxFuture, Execute, Executed};
use crate::{ExecError, Origin};

/// The executors behind the pipeline.
pub struct Executors {
    pub http: crate::http::HttpExecutor,
    pub buses: wasmwatch_bus::Buses,
    pub kube: Arc<crate::workload::KubeExecutor>,
    /// The host's own Events (Refreshed, WebhookCalled, RefreshPublished,
    /// Restarted, Reloaded, ReloadFail, RefreshFailed, WebhookFailed), off
    /// the delivery path and aggregated.
    pub events: crate::recorder::EventRecorder,
    /// Told of each restart attempt as Stakater Reloader counts
    /// `reloader_reload_executed_total`: see [`OnReload`].
    pub on_reload: Option<OnReload>,
    /// Per plugin (by name): how its restarts roll workloads (the
    /// manifest's `delivery.restartStrategy`; absent: annotations).
    pub restart_strategies: std::collections::HashMap<String, RestartStrategy>,
}

/// Called once per restart attempt (one workload, however many objects it
/// is for) with the workload and `true` when the attempt patched its pod
/// template, `false` when it failed (every failed attempt: each retried
/// one and the last). An attempt that found the template already at every
/// content is not counted, as Reloader does not count `NotUpdated`. It
/// must not wait (it runs on the delivery path): a counter.
pub type OnReload = Box<dyn Fn(&WorkloadRef, bool) + Send + Sync>;

impl Executors {
    /// Restarts of one workload, each for the change of one object: one
    /// patch recording every content. When it patched the template: per
    /// object whose content it recorded, `Reloaded` on the workload (in
    /// Stakater Reloader's words, [`reloaded_message`]) and `Restarted` on
    /// the object. An attempt that failed: `ReloadFail` on the workload
    /// ([`reload_fail_message`]), each attempt, retried or not. Each
    /// attempt that patched or failed is told to `on_reload`.
    async fn restart(&self, restarts: &[(Origin, Action)]) -> Result<Executed, ExecError> {
        let mut contents = Vec::new();
        let mut reasons: Vec<&str> = Vec::new();
        let mut origins = Vec::new();
        let mut workload = None;
        // The last restart's own choice (WIT 0.3.0), over its plugin's.
        let mut chosen = None;
        for (origin, action) in restarts {
            let Action::Restart {
                workload: w,
                reason,
                content_hash,
                strategy,
            } = action
            else {
                continue;
            };
            workload.get_or_insert(w);
            chosen = *strategy;
            let unkeyed =
                crate::workload::unkeyed_content_hash(content_hash, origin.unkeyed_digest.as_ref());
            let reloader =
                crate::workload::reloader_hash_for(content_hash, origin.reloader_hash.as_ref());
            contents.push((content_hash.as_str(), unkeyed, reloader));
            origins.push(origin);
            if !reasons.contains(&reason.as_str()) {
                reasons.push(reason);
            }
        }
        let Some(workload) = workload else {
            return Ok(Executed::default());
        };
        let hashes: Vec<crate::workload::Content<'_>> = contents
            .iter()
            .map(|(hash, unkeyed, reloader)| crate::workload::Content {
                hash,
                unkeyed: unkeyed.as_deref(),
                reloader: *reloader,
            })
            .collect();
        let reason = reasons.join("; ");
        let strategy = chosen
            .or_else(|| {
                origins
                    .last()
                    .and_then(|o| self.restart_strategies.get(&o.plugin))
                    .copied()
            })
            .unwrap_or_default();
        let written = match self
            .kube
            .restart_contents(workload, &hashes, &reason, strategy)
            .await
        {
            Ok(written) => written,
            Err(error) => {
                if let Some(on_reload) = &self.on_reload {
                    on_reload(workload, false);
                }
                self.events.record_workload(
                    workload,
                    EventType::Warning,
                    "ReloadFail",
                    reload_fail_message(workload, &error),
                );
                return Err(error);
            }
        };
        if !written.contains(&true) {
            return Ok(Executed::default());
        }
        if let Some(on_reload) = &self.on_reload {
            on_reload(workload, true);
        }
        // Recorded (and aggregated) off the delivery path, like the other
        // host Events.
        // On the workload only (issue 35): a `Restarted` on each changed
        // object cost a write per change; failures still go on the object.
        for (origin, _) in origins.iter().zip(&written).filter(|(_, w)| **w) {
            self.events.record_workload(
                workload,
                EventType::Normal,
                "Reloaded",
                reloaded_message(origin, workload),
            );
        }
        Ok(Executed::default())
    }
}

/// Stakater Reloader's message of the `Reloaded` Event on a workload it
/// updated for a change of `origin`'s object (its `handler/upgrade.go`):
/// `Changes detected in 'orders-config' of type 'CONFIGMAP' in namespace
/// 'shop', Updated 'orders' of type 'Deployment' in namespace 'shop'`.
pub fn reloaded_message(origin: &Origin, workload: &WorkloadRef) -> String {
    format!(
        "Changes detected in '{}' of type '{}' in namespace '{}', Updated '{}' of type '{}' in namespace '{}'",
        origin.name,
        origin.kind.kind_name().to_uppercase(),
        origin.namespace,
        workload.name,
        crate::workload::kind_name(&workload.kind),
        workload.namespace
    )
}

/// Stakater Reloader's message of the `ReloadFail` Warning Event on a
/// workload whose update failed: `Update for 'orders' of type 'Deployment'
/// in namespace 'shop' failed with error <error>`, the error without the
/// `restart of Deployment shop/orders: ` it starts with (the message names
/// the workload already).
pub fn reload_fail_message(workload: &WorkloadRef, error: &ExecError) -> String {
    let kind = crate::workload::kind_name(&workload.kind);
    let error = error.to_string();
    let prefix = format!(
        "restart of {kind} {}/{}: ",
        workload.namespace, workload.name
    );
    format!(
        "Update for '{}' of type '{kind}' in namespace '{}' failed with error {}",
        workload.name,
        workload.namespace,
        error.strip_prefix(&prefix).unwrap_or(&error)
    )
}

impl Execute for Executors {
    fn execute<'a>(
        &'a self,
        origin: &'a Origin,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        Box::pin(async move {
            match action {
                Action::Http {
                    method,
                    url,
                    headers,
                    body,
                } => self
                    .http
                    .call(*method, url, headers, body.as_deref())
                    .await
                    .map(|status| Executed {
                        status: Some(status),
                        ..Executed::default()
                    }),
                Action::RefreshService {
                    namespace,
                    service,
                    method,
                    port,
                    path,
                    tls,
                } => self
                    .http
                    .refresh_service(namespace, service, *method, *port, path, *tls)
                    .await
                    .map(|report| Executed {
                        pods: Some(report.called),
                        ..Executed::default()
                    }),
                Action::Publish {
                    connection,
                    destination,
                    routing_key,
                    headers,
                    payload,
                } => self
                    .buses
                    .publish(connection, destination, routing_key, headers, payload)
                    .await
                    .map(|()| Executed::default())
                    .map_err(|e| {
                        if e.retryable() {
                            ExecError::Retryable(e.to_string())
                        } else {
                            ExecError::Permanent(e.to_string())
                        }
                    }),
                Action::Restart { .. } => {
                    self.restart(std::slice::from_ref(&(origin.clone(), action.clone())))
                        .await
                }
                Action::Event {
                    event_type,
                    reason,
                    message,
                } => self
                    .kube
                    .event(origin, *event_type, reason, message)
                    .await
                    .map(|()| Executed::default()),
            }
        })
    }

    fn execute_restarts<'a>(
        &'a self,
        restarts: &'a [(Origin, Action)],
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        Box::pin(self.restart(restarts))
    }

    fn throttled(&self, origin: &Origin, action: &Action, wait: Duration, cooldown: Duration) {
        self.events.record(
            origin,
            EventType::Warning,
            "Throttled",
            format!(
                "{} waits {:.1}s: it acts at most once per {}s (delivery.cooldown, or the \
                 workload's pause-period annotation); changes meanwhile merge and the last \
                 content wins (plugin {})",
                describe_action(action),
                wait.as_secs_f64(),
                cooldown.as_secs_f64(),
                origin.plugin
            ),
        );
    }

    fn succeeded(&self, origins: &[Origin], action: &Action, executed: &Executed) {
        // Restarts record their own Events (only when a restart
        // happened); Event actions are Events already.
        let Some((reason, what)) = success_event(action, executed) else {
            return;
        };
        // A refresh is told on the app it refreshed, once however many
        // changes it carried, and aggregates per app there (as Reloader's
        // `Reloaded` does on the workload; issue 35): not an Event per
        // changed object, which cost an API write per change.
        if let Action::RefreshService {
            namespace, service, ..
        } = action
        {
            // Refreshes of one target from two plugins coalesce: name
            // each plugin once.
            let mut plugins: Vec<&str> = Vec::new();
            for o in origins {
                if !plugins.contains(&o.plugin.as_str()) {
                    plugins.push(&o.plugin);
                }
            }
            if plugins.is_empty() {
                return;
            }
            let plugin = plugins.join(", ");
            let plugin = plugin.as_str();
            self.events.record_on(
                crate::recorder::service_reference(
                    namespace,
                    service,
                    self.http.service_uid(namespace, service),
                ),
                plugin,
                EventType::Normal,
                reason,
                format!("{what} (plugin {plugin})"),
            );
            return;
        }
        for origin in origins {
            let message = format!("{what} (plugin {})", origin.plugin);
            self.events
                .record(origin, EventType::Normal, reason, message);
        }
    }

    fn dead_letter(&self, origin: &Origin, action: &Action, error: &ExecError) {
        // A plugin call that failed through its retries (the decide
        // stage's dead letter): its own reason, the failure as it is.
        if let Action::Event { reason, .. } = action
            && reason == PLUGIN_FAILED
        {
            self.events.record(
                origin,
                EventType::Warning,
                PLUGIN_FAILED,
                format!("{error}; the change is dead-lettered"),
            );
            return;
        }
        let message = format!(
            "{} by plugin {} failed for good: {error}",
            action.type_name(),
            origin.plugin
        );
        self.events
            .record(origin, EventType::Warning, failure_reason(action), message);
    }
}

/// The reason and phrase of the host's Event about a successful action;
/// `None` for actions that record their own (restarts) or are Events.
///
/// A plain `http` action is a webhook, not a refresh: `WebhookCalled`,
/// with the status it was answered with. `Refreshed` stays what it is
/// for Spring's watcher, a refresh of every ready pod of a Service.
pub fn success_event(action: &Action, executed: &Executed) -> Option<(&'static str, String)> {
    let what = describe_action(action);
    match action {
        Action::RefreshService { .. } => Some((
            "Refreshed",
            match executed.pods {
                Some(0) => format!("{what}: no ready pod to call"),
                Some(1) => format!("{what}: 1 pod answered"),
                Some(n) => format!("{what}: {n} pods answered"),
                None => what,
            },
        )),
        Action::Http { .. } => Some((
            "WebhookCalled",
            match executed.status {
                Some(status) => format!("{what} answered {status}"),
                None => what,
            },
        )),
        Action::Publish { .. } => Some(("RefreshPublished", what)),
        Action::Restart { .. } | Action::Event { .. } => None,
    }
}

/// The reason of the Warning Event about an action that failed for good.
/// The reason of the Warning Event about a plugin call that failed through
/// its retries (dead-lettered before any action).
pub const PLUGIN_FAILED: &str = "PluginFailed";

pub fn failure_reason(action: &Action) -> &'static str {
    match action {
        Action::Http { .. } => "WebhookFailed",
        _ => "RefreshFailed",
    }
}

/// One action as a phrase, for reports and Events.
pub fn describe_action(action: &Action) -> String {
    match action {
        Action::RefreshService {
            namespace,
            service,
            method,
            path,
            ..
        } => format!(
            "{} {path} on every ready pod of Service {namespace}/{service}",
            format!("{method:?}").to_uppercase()
        ),
        Action::Http { method, url, .. } => {
            // Webhook URLs carry their secret: Events and logs show it redacted.
            format!(
                "{} {}",
                format!("{method:?}").to_uppercase(),
                crate::http::redact_url(url)
            )
        }
        Action::Publish {
            connection,
            destination,
            ..
        } => format!("publish to {connection}/{destination}"),
        Action::Restart { workload, .. } => format!(
            "rollout restart of {} {}/{}",
            workload.kind, workload.namespace, workload.name
        ),
        Action::Event { reason, .. } => format!("Event {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmwatch_core::ObjectKind;
    use wasmwatch_core::action::WorkloadKind;

    fn origin(kind: ObjectKind, name: &str) -> Origin {
        Origin {
            kind,
            namespace: "shop".into(),
            name: name.into(),
            uid: "u".into(),
            resource_version: "7".into(),
            plugin: "rollout-restart".into(),
            unkeyed_digest: None,
            reloader_hash: None,
        }
    }

    fn workload(kind: WorkloadKind, name: &str) -> WorkloadRef {
        WorkloadRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    /// Byte for byte what Reloader v1.4.21 writes (handler/upgrade.go).
    #[test]
    fn reloaded_is_in_reloaders_words() {
        assert_eq!(
            reloaded_message(
                &origin(ObjectKind::ConfigMap, "orders-config"),
                &workload(WorkloadKind::Deployment, "orders")
            ),
            "Changes detected in 'orders-config' of type 'CONFIGMAP' in namespace 'shop', \
             Updated 'orders' of type 'Deployment' in namespace 'shop'"
        );
        assert_eq!(
            reloaded_message(
                &origin(ObjectKind::Secret, "token"),
                &workload(WorkloadKind::StatefulSet, "ledger")
            ),
            "Changes detected in 'token' of type 'SECRET' in namespace 'shop', \
             Updated 'ledger' of type 'StatefulSet' in namespace 'shop'"
        );
    }

    #[test]
    fn reload_fail_is_in_reloaders_words_without_repeating_the_workload() {
        let w = workload(WorkloadKind::DaemonSet, "agent");
        let conflict = ExecError::Retryable(
            "restart of DaemonSet shop/agent: conflict (409) when patching the pod template: \
             the object has been modified"
                .into(),
        );
        assert_eq!(
            reload_fail_message(&w, &conflict),
            "Update for 'agent' of type 'DaemonSet' in namespace 'shop' failed with error \
             conflict (409) when patching the pod template: the object has been modified"
        );
        // An error about something else keeps all its words.
        let other = ExecError::Permanent("no answer".into());
        assert_eq!(
            reload_fail_message(&w, &other),
            "Update for 'agent' of type 'DaemonSet' in namespace 'shop' failed with error no answer"
        );
    }
}
