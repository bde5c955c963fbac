//! Builders for the actions a plugin returns. The host checks each one
//! against the plugin's capabilities before executing it.
use crate::{
    Action, BusPublish, EmitEvent, EventType, Header, HttpCall, HttpMethod, RefreshService,
    RestartStrategy, RestartWorkload, WorkloadRef,
};

/// One HTTP call to `url`, with `headers` (name, value) and an optional
/// body. Needs an `http` grant matching `url`; the host refuses `Host`,
/// `Content-Length`, `Transfer-Encoding` and `Connection` headers.
pub fn http(
    method: HttpMethod,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Action {
    Action::Http(HttpCall {
        method,
        url: url.into(),
        headers: headers
            .iter()
            .map(|(name, value)| Header {
                name: (*name).into(),
                value: (*value).into(),
            })
            .collect(),
        body,
    })
}

/// [`http`] with a JSON body and header `content-type: application/json`.
pub fn http_json(method: HttpMethod, url: &str, json: impl Into<Vec<u8>>) -> Action {
    http(
        method,
        url,
        &[("content-type", "application/json")],
        Some(json.into()),
    )
}

/// `method path` on every ready pod of Service `namespace/service`, over
/// http; `port: None` takes each endpoint's first port. Needs `refresh`.
pub fn refresh_service(
    namespace: &str,
    service: &str,
    method: HttpMethod,
    port: Option<u16>,
    path: &str,
) -> Action {
    Action::RefreshService(RefreshService {
        namespace: namespace.into(),
        service: service.into(),
        method,
        port,
        path: path.into(),
        tls: false,
    })
}

/// A JSON message on bus connection `connection` (a `buses` entry of the
/// manifest) to `destination` (AMQP exchange or NATS subject), with header
/// `content-type: application/json`. Needs `bus: [connection/destination]`.
pub fn publish_json(
    connection: &str,
    destination: &str,
    routing_key: &str,
    json: impl Into<Vec<u8>>,
) -> Action {
    Action::Publish(BusPublish {
        connection: connection.into(),
        destination: destination.into(),
        routing_key: routing_key.into(),
        headers: vec![Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        payload: json.into(),
    })
}

/// Roll `workload`'s pods. The host records `content_hash` and never
/// restarts the same workload twice for the same hash. Needs `restart`
/// (and, for kinds other than the apps/v1 ones, the kind granted:
/// `restart: {namespaces: [...], kinds: [batch/v1/CronJob]}`). The
/// plugin's `delivery.restartStrategy` applies.
pub fn restart(
    workload: WorkloadRef,
    reason: impl Into<String>,
    content_hash: impl Into<String>,
) -> Action {
    Action::Restart(RestartWorkload {
        workload,
        reason: reason.into(),
        content_hash: content_hash.into(),
        strategy: None,
    })
}

/// [`restart`] with `strategy` instead of the plugin's
/// `delivery.restartStrategy` (`RestartAt`: an Argo Rollout's
/// `spec.restartAt`, refused for other kinds). A workload's
/// `wasmwatch.io/reload-strategy` annotation still wins.
pub fn restart_with(
    workload: WorkloadRef,
    reason: impl Into<String>,
    content_hash: impl Into<String>,
    strategy: RestartStrategy,
) -> Action {
    Action::Restart(RestartWorkload {
        workload,
        reason: reason.into(),
        content_hash: content_hash.into(),
        strategy: Some(strategy),
    })
}

/// A Normal Kubernetes Event on the changed object. Needs `events`.
pub fn event_normal(reason: &str, message: impl Into<String>) -> Action {
    Action::Event(EmitEvent {
        event_type: EventType::Normal,
        reason: reason.into(),
        message: message.into(),
    })
}

/// A Warning Kubernetes Event on the changed object. Needs `events`.
pub fn event_warning(reason: &str, message: impl Into<String>) -> Action {
    Action::Event(EmitEvent {
        event_type: EventType::Warning,
        reason: reason.into(),
        message: message.into(),
    })
}
