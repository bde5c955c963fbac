//! The executors behind the pipeline: one [`Execute`] that sends each
//! action to the HTTP, bus or Kubernetes executor, and records the host's
//! own Events (Refreshed, RefreshPublished, RefreshFailed; Restarted and
//! Reloaded for restarts that happened) off the delivery path.
use std::sync::Arc;

use wasmwatch_core::Action;
use wasmwatch_core::action::EventType;

use crate::pipeline::{BoxFuture, Execute};
use crate::{ExecError, Origin};

/// The executors behind the pipeline.
pub struct Executors {
    pub http: crate::http::HttpExecutor,
    pub buses: wasmwatch_bus::Buses,
    pub kube: Arc<crate::workload::KubeExecutor>,
    /// The host's own Events (Refreshed, RefreshPublished, RefreshFailed),
    /// off the delivery path.
    pub events: crate::recorder::EventRecorder,
}

impl Execute for Executors {
    fn execute<'a>(
        &'a self,
        origin: &'a Origin,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<(), ExecError>> {
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
                    .map(|_| ()),
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
                    .map(|_| ()),
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
                    let outcome = self.kube.restart(workload, content_hash, reason).await?;
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
                    Ok(())
                }
                Action::Event {
                    event_type,
                    reason,
                    message,
                } => self.kube.event(origin, *event_type, reason, message).await,
            }
        })
    }

    fn succeeded(&self, origins: &[Origin], action: &Action) {
        // Restarts record their own Events (only when a restart
        // happened); Event actions are Events already.
        let reason = match action {
            Action::Http { .. } | Action::RefreshService { .. } => "Refreshed",
            Action::Publish { .. } => "RefreshPublished",
            Action::Restart { .. } | Action::Event { .. } => return,
        };
        for origin in origins {
            let message = format!("{} (plugin {})", describe_action(action), origin.plugin);
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
            .record(origin, EventType::Warning, "RefreshFailed", message);
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
