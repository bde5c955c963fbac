//! The executors behind the pipeline: one [`Execute`] that sends each
//! action to the HTTP, bus or Kubernetes executor, and records the host's
//! own Events off the delivery path, each naming what was done:
//!
//! | action | done | failed for good |
//! |---|---|---|
//! | `refreshService` | `Refreshed` (`… of Service ns/svc: 3 pods answered`) | `RefreshFailed` |
//! | `http` (a webhook) | `WebhookCalled` (`POST https://… answered 200`) | `WebhookFailed` |
//! | `publish` | `RefreshPublished` | `RefreshFailed` |
//! | `restart` | `Restarted` on the object, `Reloaded` on the workload (only when the template was patched) | `RefreshFailed` |
//! | `event` | the Event itself | `RefreshFailed` |
use std::sync::Arc;

use wasmwatch_core::Action;
use wasmwatch_core::action::EventType;

use crate::pipeline::{BoxFuture, Execute, Executed};
use crate::{ExecError, Origin};

/// The executors behind the pipeline.
pub struct Executors {
    pub http: crate::http::HttpExecutor,
    pub buses: wasmwatch_bus::Buses,
    pub kube: Arc<crate::workload::KubeExecutor>,
    /// The host's own Events (Refreshed, WebhookCalled, RefreshPublished,
    /// RefreshFailed, WebhookFailed), off the delivery path.
    pub events: crate::recorder::EventRecorder,
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
                Action::Restart {
                    workload,
                    reason,
                    content_hash,
                } => {
                    let unkeyed = crate::workload::unkeyed_content_hash(
                        content_hash,
                        origin.unkeyed_digest.as_ref(),
                    );
                    let outcome = self
                        .kube
                        .restart_also_at(workload, content_hash, unkeyed.as_deref(), reason)
                        .await?;
                    if outcome == crate::workload::RestartOutcome::Restarted {
                        let message = format!("{reason} (plugin {})", origin.plugin);
                        if let Err(e) = self
                            .kube
                            .workload_event(workload, EventType::Normal, "Reloaded", &message)
                            .await
                        {
                            tracing::warn!("cannot record the restart Event: {e}");
                        }
                        let message = format!(
                            "rollout restart of {:?} {}/{} (plugin {})",
                            workload.kind, workload.namespace, workload.name, origin.plugin
                        );
                        if let Err(e) = self
                            .kube
                            .event(origin, EventType::Normal, "Restarted", &message)
                            .await
                        {
                            tracing::warn!("cannot record the restart Event: {e}");
                        }
                    }
                    Ok(Executed::default())
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

    fn succeeded(&self, origins: &[Origin], action: &Action, executed: &Executed) {
        // Restarts record their own Events (only when a restart
        // happened); Event actions are Events already.
        let Some((reason, what)) = success_event(action, executed) else {
            return;
        };
        for origin in origins {
            let message = format!("{what} (plugin {})", origin.plugin);
            self.events
                .record(origin, EventType::Normal, reason, message);
        }
    }

    fn dead_letter(&self, origin: &Origin, action: &Action, error: &ExecError) {
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
            format!("{} {url}", format!("{method:?}").to_uppercase())
        }
        Action::Publish {
            connection,
            destination,
            ..
        } => format!("publish to {connection}/{destination}"),
        Action::Restart { workload, .. } => format!(
            "rollout restart of {:?} {}/{}",
            workload.kind, workload.namespace, workload.name
        ),
        Action::Event { reason, .. } => format!("Event {reason}"),
    }
}
