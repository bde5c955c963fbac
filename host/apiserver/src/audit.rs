//! The request log: every request the server answered, described the way
//! kube-apiserver's authorizer sees it (its `RequestInfo`), so that a test can
//! compare what a client really did with the RBAC rules it will run under.
//!
//! A resource request (a path under `/api/v1/...` or `/apis/{g}/{v}/...` that
//! names a resource) becomes a [`Request`]: Kubernetes authorization verb,
//! API group, resource, subresource, namespace and name.
//!
//! - `GET` on an object: `get`; on a collection: `list`; with `?watch=true`
//!   (or `1`) or under the legacy `/watch/` prefix: `watch`. A named
//!   `GET ...?watch=true` is recorded as `watch` because this server serves
//!   it as a watch (kube-apiserver's `RequestInfo` would say `get`).
//! - `POST`: `create`; `PUT`: `update`; `PATCH`: `patch`; `DELETE` on an
//!   object: `delete`, on a collection: `deletecollection`. Other methods:
//!   the method in lower case.
//! - A `list` or `watch` of a collection whose field selector requires
//!   `metadata.name=X` (or `==`) counts as a request for the object named
//!   `X`, as Kubernetes authorizes it (so `resourceNames` rules apply).
//! - `/api/v1/namespaces/{ns}` is the namespace `ns` in namespace `ns`, as in
//!   Kubernetes.
//!
//! Everything else the server answers (discovery: `/api`, `/apis`,
//! `/api/v1`, `/apis/{g}[/{v}]`; `/version`; `/openapi/...`; health
//! endpoints; unknown paths) is a [`NonResourceRequest`] with its lower-case
//! method and path, in a separate list. The fault switches (`/_faults/...`)
//! are outside the API and are not recorded.
//!
//! Requests are recorded when they are answered (a watch: when its stream
//! starts), with the response status, also when an injected fault answered
//! them; with code 0 when an injected fault closed the connection without
//! an answer ([`crate::FaultAnswer::Drop`], [`crate::FaultAnswer::DropAfter`]). Each list keeps its newest entries up to a capacity
//! ([`crate::Config::request_log`]); the log counts what it dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// One resource request, as Kubernetes authorization sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// get, list, watch, create, update, patch, delete or deletecollection.
    pub verb: String,
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource's plural (`configmaps`, `leases`, ...).
    pub resource: String,
    /// `status`, ... when the path names a subresource.
    pub subresource: Option<String>,
    /// `None`: a cluster-scoped resource or a request across all namespaces.
    pub namespace: Option<String>,
    /// The object's name (from the path or the field selector).
    pub name: Option<String>,
    /// The response status; 0 when the connection was closed without one
    /// (an injected [`crate::FaultAnswer::Drop`] or `DropAfter`).
    pub code: u16,
    /// The `User-Agent` header, if any.
    pub user_agent: Option<String>,
}

impl Request {
    /// Whether the verb changes something (anything but get, list, watch).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }

    /// The resource as an RBAC rule names it: `resource` or
    /// `resource/subresource`.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// A request outside the resource API (discovery, version, openapi, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NonResourceRequest {
    /// The HTTP method in lower case (`get`, `post`, ...), as RBAC's
    /// nonResourceURLs rules name it.
    pub verb: String,
    pub path: String,
    pub code: u16,
    pub user_agent: Option<String>,
}

/// One call of a mutating admission webhook ([`crate::admission`]), for
/// tests that count or inspect them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WebhookCall {
    /// The MutatingWebhookConfiguration's name.
    pub configuration: String,
    /// The webhook's name (`webhooks[].name`).
    pub webhook: String,
    /// `CREATE` or `UPDATE`.
    pub operation: String,
    /// The API group of the object written; empty for the core group.
    pub group: String,
    /// The resource's plural (`deployments`).
    pub resource: String,
    /// `status` or `scale` for a write through a subresource.
    pub subresource: Option<String>,
    /// The request's namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// The object's name; empty for a create with `generateName`.
    pub name: String,
    /// The request was a dry run.
    pub dry_run: bool,
    /// `allowed` (no patch), `patched`, `denied`, `failed` (the request
    /// failed: the call under `failurePolicy: Fail`, or a patch that does
    /// not apply) or `ignored` (the call failed under `failurePolicy:
    /// Ignore`; the request went on).
    pub outcome: String,
    /// Why, for `denied`, `failed` and `ignored`: the message the request
    /// failed (or would have failed) with.
    pub error: Option<String>,
}

/// What a request is, before it is answered.
#[derive(Debug, Clone)]
pub(crate) enum Attributes {
    Resource(Request),
    NonResource(NonResourceRequest),
}

impl Attributes {
    /// Classifies a request like kube-apiserver's `RequestInfoFactory`.
    pub(crate) fn of(
        method: &hyper::Method,
        path: &str,
        query: &HashMap<String, String>,
        user_agent: Option<String>,
    ) -> Attributes {
        let lower = method.as_str().to_ascii_lowercase();
        match resource_request(method, path, query) {
            Some(mut r) => {
                r.user_agent = user_agent;
                Attributes::Resource(r)
            }
            None => Attributes::NonResource(NonResourceRequest {
                verb: lower,
                path: path.to_string(),
                code: 0,
                user_agent,
            }),
        }
    }
}

fn resource_request(
    method: &hyper::Method,
    path: &str,
    query: &HashMap<String, String>,
) -> Option<Request> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if parts.len() < 3 {
        return None;
    }
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[2..]),
        "apis" if parts.len() >= 4 => (parts[1], &parts[3..]),
        _ => return None,
    };
    let (mut verb, rest) = match rest.first() {
        Some(&"watch") if rest.len() >= 2 => ("watch".to_string(), &rest[1..]),
        Some(&"watch") => return None,
        _ => (
            match method.as_str() {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                other => return Some(other_method(other, group, rest)),
            }
            .to_string(),
            rest,
        ),
    };
    let (namespace, parts) = namespaced(rest);
    let mut name = parts.get(1).map(|s| s.to_string());
    let subresource = parts.get(2).map(|s| s.to_string());
    let watch_param = query.get("watch").is_some_and(|v| v == "true" || v == "1");
    if verb == "get" && watch_param {
        verb = "watch".into();
    }
    if name.is_none() && verb == "get" {
        verb = "list".into();
    }
    if name.is_none() && (verb == "list" || verb == "watch") {
        name = query
            .get("fieldSelector")
            .and_then(|s| exact_name(s))
            .map(str::to_string);
    }
    if name.is_none() && verb == "delete" {
        verb = "deletecollection".into();
    }
    Some(Request {
        verb,
        group: group.to_string(),
        resource: parts.first()?.to_string(),
        subresource,
        namespace,
        name,
        code: 0,
        user_agent: None,
    })
}

/// A request with a method Kubernetes gives no verb: the method in lower
/// case, on what the path names.
fn other_method(method: &str, group: &str, rest: &[&str]) -> Request {
    let (namespace, parts) = namespaced(rest);
    Request {
        verb: method.to_ascii_lowercase(),
        group: group.to_string(),
        resource: parts.first().unwrap_or(&"").to_string(),
        subresource: parts.get(2).map(|s| s.to_string()),
        namespace,
        name: parts.get(1).map(|s| s.to_string()),
        code: 0,
        user_agent: None,
    }
}

/// `namespaces/{ns}/{resource}/...` → (ns, [resource, ...]); a namespace's
/// own path (`namespaces/{ns}[/status|/finalize]`) is in that namespace.
fn namespaced<'a>(rest: &'a [&'a str]) -> (Option<String>, &'a [&'a str]) {
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        let ns = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            return (ns, &rest[2..]);
        }
        return (ns, rest);
    }
    (None, rest)
}

/// The name a field selector requires (`metadata.name=X` or `==X` among
/// its comma-separated terms), if it is a valid path segment.
fn exact_name(selector: &str) -> Option<&str> {
    selector
        .split(',')
        .find_map(|term| {
            let (key, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .filter(|(k, _)| !k.ends_with('!'))?;
            (key.trim() == "metadata.name").then_some(value.trim())
        })
        .filter(|n| !n.is_empty() && *n != "." && *n != ".." && !n.contains(['/', '%']))
}

/// The bounded log behind [`crate::ServerHandle::requests`].
#[derive(Debug)]
pub(crate) struct RequestLog {
    capacity: usize,
    inner: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    resource: VecDeque<Request>,
    non_resource: VecDeque<NonResourceRequest>,
    webhooks: VecDeque<WebhookCall>,
    dropped: u64,
}

impl RequestLog {
    pub(crate) fn new(capacity: usize) -> RequestLog {
        RequestLog {
            capacity,
            inner: Mutex::new(Entries::default()),
        }
    }

    /// Whether anything is recorded (capacity 0: nothing).
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, attributes: Attributes, code: u16) {
        if !self.enabled() {
            return;
        }
        let mut e = self.lock();
        let full = match &attributes {
            Attributes::Resource(_) => e.resource.len() >= self.capacity,
            Attributes::NonResource(_) => e.non_resource.len() >= self.capacity,
        };
        if full {
            e.dropped += 1;
        }
        match attributes {
            Attributes::Resource(mut r) => {
                r.code = code;
                if full {
                    e.resource.pop_front();
                }
                e.resource.push_back(r);
            }
            Attributes::NonResource(mut n) => {
                n.code = code;
                if full {
                    e.non_resource.pop_front();
                }
                e.non_resource.push_back(n);
            }
        }
    }

    /// Record one webhook call (kept like requests, the newest
    /// [`crate::Config::request_log`] of them).
    pub(crate) fn record_webhook(&self, call: WebhookCall) {
        if !self.enabled() {
            return;
        }
        let mut e = self.lock();
        if e.webhooks.len() >= self.capacity {
            e.webhooks.pop_front();
            e.dropped += 1;
        }
        e.webhooks.push_back(call);
    }

    pub(crate) fn webhook_calls(&self) -> Vec<WebhookCall> {
        self.lock().webhooks.iter().cloned().collect()
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        self.lock().resource.iter().cloned().collect()
    }

    pub(crate) fn non_resource_requests(&self) -> Vec<NonResourceRequest> {
        self.lock().non_resource.iter().cloned().collect()
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    pub(crate) fn clear(&self) {
        let mut e = self.lock();
        e.resource.clear();
        e.non_resource.clear();
        e.webhooks.clear();
        e.dropped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Method;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// (verb, group, resource, subresource, namespace, name)
    fn info(
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> Option<(String, String, String, String, String, String)> {
        match Attributes::of(&method, path, &q(query), None) {
            Attributes::Resource(r) => Some((
                r.verb,
                r.group,
                r.resource,
                r.subresource.unwrap_or_default(),
                r.namespace.unwrap_or_else(|| "-".into()),
                r.name.unwrap_or_else(|| "-".into()),
            )),
            Attributes::NonResource(_) => None,
        }
    }

    fn t(
        v: &str,
        g: &str,
        r: &str,
        s: &str,
        ns: &str,
        n: &str,
    ) -> Option<(String, String, String, String, String, String)> {
        Some((v.into(), g.into(), r.into(), s.into(), ns.into(), n.into()))
    }

    #[test]
    fn verbs_as_kubernetes_authorizes_them() {
        let cms = "/api/v1/namespaces/ns/configmaps";
        assert_eq!(
            info(Method::GET, cms, &[]),
            t("list", "", "configmaps", "", "ns", "-")
        );
        assert_eq!(
            info(Method::GET, cms, &[("watch", "true")]),
            t("watch", "", "configmaps", "", "ns", "-")
        );
        assert_eq!(
            info(Method::GET, &format!("{cms}/a"), &[]),
            t("get", "", "configmaps", "", "ns", "a")
        );
        assert_eq!(
            info(Method::POST, cms, &[]),
            t("create", "", "configmaps", "", "ns", "-")
        );
        assert_eq!(
            info(Method::PUT, &format!("{cms}/a"), &[]),
            t("update", "", "configmaps", "", "ns", "a")
        );
        assert_eq!(
            info(Method::PATCH, &format!("{cms}/a"), &[]),
            t("patch", "", "configmaps", "", "ns", "a")
        );
        assert_eq!(
            info(Method::DELETE, &format!("{cms}/a"), &[]),
            t("delete", "", "configmaps", "", "ns", "a")
        );
        assert_eq!(
            info(Method::DELETE, cms, &[]),
            t("deletecollection", "", "configmaps", "", "ns", "-")
        );
        assert_eq!(
            info(Method::GET, "/api/v1/configmaps", &[]),
            t("list", "", "configmaps", "", "-", "-")
        );
        assert_eq!(
            info(Method::GET, "/api/v1/watch/namespaces/ns/configmaps", &[]),
            t("watch", "", "configmaps", "", "ns", "-")
        );
        assert_eq!(
            info(
                Method::PUT,
                "/apis/apps/v1/namespaces/ns/deployments/d/status",
                &[]
            ),
            t("update", "apps", "deployments", "status", "ns", "d")
        );
        assert_eq!(
            info(Method::GET, "/api/v1/namespaces/ns", &[]),
            t("get", "", "namespaces", "", "ns", "ns")
        );
        assert_eq!(
            info(Method::GET, "/api/v1/namespaces", &[]),
            t("list", "", "namespaces", "", "-", "-")
        );
        assert_eq!(
            info(Method::HEAD, "/api/v1/namespaces/ns/pods/p", &[]),
            t("get", "", "pods", "", "ns", "p")
        );
    }

    #[test]
    fn a_name_field_selector_names_the_object() {
        let leases = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
        for sel in ["metadata.name=l", "metadata.name==l", "a=b,metadata.name=l"] {
            assert_eq!(
                info(
                    Method::GET,
                    leases,
                    &[("fieldSelector", sel), ("watch", "1")]
                ),
                t("watch", "coordination.k8s.io", "leases", "", "ns", "l"),
                "{sel}"
            );
            assert_eq!(
                info(Method::GET, leases, &[("fieldSelector", sel)]),
                t("list", "coordination.k8s.io", "leases", "", "ns", "l"),
                "{sel}"
            );
        }
        for sel in [
            "metadata.name!=l",
            "metadata.namespace=l",
            "metadata.name=a/b",
            "",
        ] {
            assert_eq!(
                info(Method::GET, leases, &[("fieldSelector", sel)]),
                t("list", "coordination.k8s.io", "leases", "", "ns", "-"),
                "{sel}"
            );
        }
        // Not for a deletecollection (Kubernetes names only lists and watches).
        assert_eq!(
            info(
                Method::DELETE,
                leases,
                &[("fieldSelector", "metadata.name=l")]
            ),
            t(
                "deletecollection",
                "coordination.k8s.io",
                "leases",
                "",
                "ns",
                "-"
            )
        );
    }

    #[test]
    fn discovery_and_the_rest_are_non_resource() {
        for path in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
            "/healthz",
            "/nothing/here/at/all",
        ] {
            assert_eq!(info(Method::GET, path, &[]), None, "{path}");
        }
    }

    #[test]
    fn the_log_is_bounded_and_counts_what_it_dropped() {
        let log = RequestLog::new(2);
        for n in ["a", "b", "c"] {
            log.record(
                Attributes::of(
                    &Method::GET,
                    &format!("/api/v1/namespaces/ns/configmaps/{n}"),
                    &q(&[]),
                    None,
                ),
                200,
            );
        }
        let names: Vec<_> = log
            .requests()
            .into_iter()
            .map(|r| r.name.unwrap())
            .collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(log.dropped(), 1);
        log.clear();
        assert!(log.requests().is_empty());
        assert_eq!(log.dropped(), 0);
        let off = RequestLog::new(0);
        off.record(Attributes::of(&Method::GET, "/api", &q(&[]), None), 200);
        assert!(off.non_resource_requests().is_empty());
    }
}
