//! Capabilities: what the operator lets a plugin do, and the check of every
//! action against them. Deny by default: an empty grant allows nothing.
use serde::{Deserialize, Serialize};

use crate::action::{Action, RestartStrategy, WorkloadKind};

/// A plugin's grants, from its manifest entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Capabilities {
    /// URL patterns the plugin may call with `http` actions:
    /// `scheme://host[:port]/path-prefix`, where host may be `*` or
    /// `*.suffix` and port may be `*` (omitted: the scheme's default port).
    #[serde(default)]
    pub http: Vec<UrlPattern>,
    /// Namespaces (or `*`) whose Services' pods the plugin may call with
    /// `refreshService` actions.
    #[serde(default)]
    pub refresh: Vec<NamePattern>,
    /// `connection/destination` pairs the plugin may publish to; either part
    /// may be `*`.
    #[serde(default)]
    pub bus: Vec<BusPattern>,
    /// Where the plugin may restart workloads: a list of namespaces (or
    /// `*`), the apps/v1 kinds, or `{namespaces: [...], kinds: [Deployment,
    /// batch/v1/CronJob, ...]}`.
    #[serde(default)]
    pub restart: RestartGrant,
    /// Whether the plugin may emit Kubernetes Events.
    #[serde(default)]
    pub events: bool,
    /// Whether Secret values reach the plugin (otherwise keys only).
    #[serde(default)]
    pub secret_values: bool,
}

/// The result of checking one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    Allowed,
    Refused {
        /// The capability that would have been needed, e.g. `http`.
        capability: &'static str,
        reason: String,
    },
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed)
    }
}

fn refused(capability: &'static str, reason: String) -> Verdict {
    Verdict::Refused { capability, reason }
}

impl Capabilities {
    /// Checks one action against the grants.
    pub fn check(&self, action: &Action) -> Verdict {
        match action {
            Action::Http { url, headers, .. } => match url::Url::parse(url) {
                _ if let Some(why) = header_problem(headers) => refused("http", why),
                Err(e) => refused("http", format!("invalid URL {url:?}: {e}")),
                Ok(u) if self.http.iter().any(|p| p.matches(&u)) => Verdict::Allowed,
                Ok(_) => refused("http", format!("URL {url} matches no granted http pattern")),
            },
            Action::RefreshService {
                namespace, service, ..
            } => {
                if self.refresh.iter().any(|p| p.matches(namespace)) {
                    Verdict::Allowed
                } else {
                    refused(
                        "refresh",
                        format!(
                            "refreshing Service {namespace}/{service}: namespace {namespace:?} not granted"
                        ),
                    )
                }
            }
            Action::Publish {
                connection,
                destination,
                ..
            } => {
                if self.bus.iter().any(|p| p.matches(connection, destination)) {
                    Verdict::Allowed
                } else {
                    refused(
                        "bus",
                        format!("publishing to {connection}/{destination} not granted"),
                    )
                }
            }
            Action::Restart {
                workload, strategy, ..
            } => {
                let kind = &workload.kind;
                if let Some(why) = kind.problem() {
                    refused(
                        "restart",
                        format!(
                            "restarting {kind} {}/{}: not a valid workload kind: {why}",
                            workload.namespace, workload.name
                        ),
                    )
                } else if !self.restart.allows_namespace(&workload.namespace) {
                    refused(
                        "restart",
                        format!(
                            "restarting {kind} {}/{}: namespace {:?} not granted",
                            workload.namespace, workload.name, workload.namespace
                        ),
                    )
                } else if !self.restart.allows_kind(kind) {
                    let granted = if self.restart.kinds.is_empty() {
                        "none given: the apps/v1 kinds".to_string()
                    } else {
                        self.restart.kinds.join(", ")
                    };
                    refused(
                        "restart",
                        format!(
                            "restarting {kind} {}/{}: kind {kind} not granted (restart.kinds: {granted})",
                            workload.namespace, workload.name,
                        ),
                    )
                } else if *strategy == Some(RestartStrategy::RestartAt)
                    && kind.gvk() != ("argoproj.io", "v1alpha1", "Rollout")
                {
                    refused(
                        "restart",
                        format!(
                            "restarting {kind} {}/{}: strategy restart-at restarts Argo \
                             Rollouts only (argoproj.io/v1alpha1/Rollout); use annotations \
                             or env-vars",
                            workload.namespace, workload.name
                        ),
                    )
                } else {
                    Verdict::Allowed
                }
            }
            Action::Event { .. } => {
                if self.events {
                    Verdict::Allowed
                } else {
                    refused(
                        "events",
                        "emitting Kubernetes Events not granted".to_string(),
                    )
                }
            }
        }
    }
}

/// Headers the host sets itself (the target and the message framing), which
/// a plugin may not set: a `Host` of its own would reach another virtual
/// host behind a shared ingress than the granted URL names.
const HOST_HEADERS: [&str; 4] = ["host", "content-length", "transfer-encoding", "connection"];

/// Why these headers may not be sent, if they may not: a header the host
/// sets, the same name twice, or a name or value that is not valid HTTP.
fn header_problem(headers: &[crate::action::Header]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    for h in headers {
        let name = crate::text::bounded_line(&h.name, 64);
        let lower = h.name.to_ascii_lowercase();
        if HOST_HEADERS.contains(&lower.as_str()) {
            return Some(format!(
                "header {name:?} is set by wasmwatch and may not be set by a plugin"
            ));
        }
        let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        if h.name.is_empty() || !h.name.bytes().all(token) {
            return Some(format!(
                "header name {name:?} is not a valid HTTP header name"
            ));
        }
        if h.value
            .bytes()
            .any(|c| (c < 0x20 && c != b'\t') || c == 0x7f)
        {
            return Some(format!(
                "header {name:?} has a control character in its value"
            ));
        }
        if !seen.insert(lower) {
            return Some(format!("header {name:?} is set twice"));
        }
    }
    None
}

/// An exact name, or `*` for any.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct NamePattern(pub String);

impl NamePattern {
    pub fn matches(&self, name: &str) -> bool {
        self.0 == "*" || self.0 == name
    }
}

/// Where a plugin may restart workloads. The manifest writes it as a list
/// of namespaces (`restart: [shop]`: the apps/v1 kinds, the form before
/// kinds could be named) or as `restart: {namespaces: [shop], kinds:
/// [Deployment, batch/v1/CronJob]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestartGrant {
    /// Namespaces, or `*`.
    pub namespaces: Vec<NamePattern>,
    /// Workload kinds (as [`WorkloadKind::parse`] reads them: `Deployment`,
    /// `apps/v1/Deployment`, `batch/v1/CronJob`), or `*` for any; empty:
    /// the apps/v1 kinds (not all of [`RESTARTABLE_KINDS`]). A kind of another group
    /// is allowed only when named (or by `*`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
}

/// The kinds whose pod template the executor knows: `spec.template`, and
/// `spec.jobTemplate.spec.template` for a CronJob (a Job is re-created
/// when it opts in with `wasmwatch.io/recreate-job: "true"`; a Rollout may
/// be restarted through `spec.restartAt`). A granted kind not listed is
/// restarted at `spec.template` (found through API discovery); one without
/// a pod template there fails for good, naming the path.
pub const RESTARTABLE_KINDS: [&str; 6] = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "batch/v1/CronJob",
    "batch/v1/Job",
    "argoproj.io/v1alpha1/Rollout",
];

impl RestartGrant {
    /// Every kind in these namespaces.
    pub fn namespaces(names: &[&str]) -> RestartGrant {
        RestartGrant {
            namespaces: names.iter().map(|n| NamePattern(n.to_string())).collect(),
            kinds: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|p| p.matches(namespace))
    }

    pub fn allows_kind(&self, kind: &WorkloadKind) -> bool {
        if self.kinds.is_empty() {
            return kind.is_apps_v1();
        }
        self.kinds
            .iter()
            .any(|k| k == "*" || WorkloadKind::parse(k).as_ref() == Ok(kind))
    }
}

impl<'de> Deserialize<'de> for RestartGrant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Grant;
        impl<'de> serde::de::Visitor<'de> for Grant {
            type Value = RestartGrant;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of namespaces, or {namespaces: [...], kinds: [...]}")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RestartGrant, A::Error> {
                let mut namespaces = Vec::new();
                while let Some(n) = seq.next_element::<NamePattern>()? {
                    namespaces.push(n);
                }
                Ok(RestartGrant {
                    namespaces,
                    kinds: Vec::new(),
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RestartGrant, A::Error> {
                const FIELDS: &[&str] = &["namespaces", "kinds"];
                let (mut namespaces, mut kinds) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "namespaces" => namespaces = Some(map.next_value::<Vec<NamePattern>>()?),
                        "kinds" => kinds = Some(map.next_value::<Vec<String>>()?),
                        other => return Err(serde::de::Error::unknown_field(other, FIELDS)),
                    }
                }
                Ok(RestartGrant {
                    namespaces: namespaces
                        .ok_or_else(|| serde::de::Error::missing_field("namespaces"))?,
                    kinds: kinds.unwrap_or_default(),
                })
            }
        }
        d.deserialize_any(Grant)
    }
}

impl schemars::JsonSchema for RestartGrant {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RestartGrant".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Where the plugin may restart workloads: namespaces (or *), the apps/v1 kinds; or {namespaces, kinds}.",
            "anyOf": [
                {"type": "array", "items": {"type": "string"}},
                {
                    "type": "object",
                    "properties": {
                        "namespaces": {"type": "array", "items": {"type": "string"}},
                        "kinds": {
                            "type": "array",
                            "items": {"anyOf": [
                                {"enum": ["Deployment", "StatefulSet", "DaemonSet", "*"]},
                                {
                                    "description": "group/version/Kind (batch/v1/CronJob), version/Kind for the core group",
                                    "type": "string",
                                    "pattern": "^([a-z0-9.-]+/)?[a-z0-9]+/[A-Za-z][A-Za-z0-9]*$"
                                }
                            ]}
                        }
                    },
                    "required": ["namespaces"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// `connection/destination`, either part `*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct BusPattern {
    pub connection: String,
    pub destination: String,
}

impl BusPattern {
    pub fn matches(&self, connection: &str, destination: &str) -> bool {
        (self.connection == "*" || self.connection == connection)
            && (self.destination == "*" || self.destination == destination)
    }
}

impl From<BusPattern> for String {
    fn from(p: BusPattern) -> String {
        format!("{}/{}", p.connection, p.destination)
    }
}

impl std::str::FromStr for BusPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((c, d)) if !c.is_empty() && !d.is_empty() => Ok(BusPattern {
                connection: c.to_string(),
                destination: d.to_string(),
            }),
            _ => Err(format!(
                "invalid bus grant {s:?}: expected connection/destination, e.g. rabbit/springCloudBus or nats/*"
            )),
        }
    }
}

impl schemars::JsonSchema for BusPattern {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "BusGrant".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "connection/destination (a buses entry's name, an exchange or subject); either part may be *.",
            "type": "string",
            "pattern": "^[^/]+/.+$"
        })
    }
}

impl<'de> Deserialize<'de> for BusPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `scheme://host[:port]/path-prefix`; host `*` or `*.suffix`; port `*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct UrlPattern {
    raw: String,
    scheme: String,
    host: String,
    /// None: any port.
    port: Option<u16>,
    path_prefix: String,
}

impl From<UrlPattern> for String {
    fn from(p: UrlPattern) -> String {
        p.raw
    }
}

impl std::str::FromStr for UrlPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("invalid http grant {s:?}: {why}");
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://host[:port]/path"))?;
        if scheme != "http" && scheme != "https" {
            return Err(bad("scheme must be http or https"));
        }
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(bad("user info is not allowed"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, "*")) => (h, None),
            Some((h, p)) => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| bad("port must be a number or *"))?,
                ),
            ),
            None => (authority, Some(if scheme == "https" { 443 } else { 80 })),
        };
        if host.is_empty()
            || (host.contains('*') && host != "*" && !host.starts_with("*."))
            || host[1..].contains('*')
        {
            return Err(bad("host must be a name, an address, * or *.suffix"));
        }
        // Hosts too are compared as the url crate writes them (lowercase,
        // punycode, IPv4 in dotted decimal).
        if host != "*" && !host.starts_with('[') {
            let name = host.strip_prefix("*.").unwrap_or(host);
            let normal = url::Url::parse(&format!("http://{name}/"))
                .ok()
                .and_then(|u| u.host_str().map(str::to_string));
            match normal {
                Some(n) if n == name.to_ascii_lowercase() => {}
                Some(n) => {
                    let wild = if host.starts_with("*.") { "*." } else { "" };
                    return Err(bad(&format!(
                        "the host is never seen in this form (URLs are compared normalised): \
                         write {wild}{n}"
                    )));
                }
                None => return Err(bad("host must be a name, an address, * or *.suffix")),
            }
        }
        // A grant is compared with a URL's path only, so a query or a
        // fragment in it could never match: any query is allowed under the
        // path already.
        if let Some(i) = path.find(['?', '#']) {
            let under = if i == 0 { "/" } else { &path[..i] };
            return Err(bad(&format!(
                "a grant matches the path only, never a query or fragment (any is allowed under \
                 the path): write {scheme}://{authority}{under}"
            )));
        }
        // A trailing `*` is what operators write for "anything below":
        // `/hooks/*` is the prefix `/hooks/`. Elsewhere it would be taken
        // literally and match nothing, so it is refused.
        let path = path.strip_suffix('*').unwrap_or(path);
        if path.contains('*') {
            return Err(bad(
                "`*` may only end the path (a prefix: /hooks/* or /hooks/); for any path write /",
            ));
        }
        // URLs are compared as the url crate normalises them (dot segments
        // resolved, spaces and non-ASCII percent-encoded, `\` read as `/`):
        // a prefix that is not in that form could never match either.
        let normal = url::Url::parse(&format!("http://h{path}"))
            .map(|u| u.path().to_string())
            .unwrap_or_default();
        if normal != path {
            return Err(bad(&format!(
                "the path is never seen in this form (URLs are compared normalised): \
                 write {scheme}://{authority}{normal}"
            )));
        }
        Ok(UrlPattern {
            raw: s.to_string(),
            scheme: scheme.to_string(),
            host: host.to_ascii_lowercase(),
            port,
            path_prefix: path.to_string(),
        })
    }
}

impl schemars::JsonSchema for UrlPattern {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HttpGrant".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "scheme://host[:port]/path: host exact, * or *.suffix; port a number, * or omitted (the scheme's); the path a prefix, a trailing * too.",
            "type": "string",
            "pattern": "^https?://"
        })
    }
}

impl<'de> Deserialize<'de> for UrlPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl UrlPattern {
    pub fn matches(&self, url: &url::Url) -> bool {
        if url.scheme() != self.scheme || !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let Some(host) = url.host_str() else {
            return false;
        };
        let host_ok = match self.host.strip_prefix("*.") {
            _ if self.host == "*" => true,
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => host == self.host,
        };
        let port_ok = self.port.is_none() || url.port_or_known_default() == self.port;
        host_ok && port_ok && url.path().starts_with(&self.path_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{EventType, HttpMethod, WorkloadKind, WorkloadRef};

    fn http(url: &str) -> Action {
        Action::Http {
            method: HttpMethod::Post,
            url: url.into(),
            headers: vec![],
            body: None,
        }
    }

    #[test]
    fn empty_grant_denies_everything() {
        let caps = Capabilities::default();
        assert!(!caps.check(&http("http://127.0.0.1/")).is_allowed());
        let ev = Action::Event {
            event_type: EventType::Normal,
            reason: "R".into(),
            message: "m".into(),
        };
        assert_eq!(
            caps.check(&ev),
            Verdict::Refused {
                capability: "events",
                reason: "emitting Kubernetes Events not granted".into()
            }
        );
    }

    #[test]
    fn url_patterns() {
        let caps = Capabilities {
            http: vec![
                "http://127.0.0.1:*/hooks/".parse().unwrap(),
                "https://*.example.com/".parse().unwrap(),
            ],
            ..Default::default()
        };
        assert!(
            caps.check(&http("http://127.0.0.1:8080/hooks/a"))
                .is_allowed()
        );
        assert!(
            !caps
                .check(&http("http://127.0.0.1:8080/other"))
                .is_allowed()
        );
        assert!(caps.check(&http("https://api.example.com/x")).is_allowed());
        assert!(
            !caps
                .check(&http("https://example.com.evil.io/x"))
                .is_allowed()
        );
        assert!(
            !caps
                .check(&http("https://api.example.com:8443/x"))
                .is_allowed()
        );
        assert!(!caps.check(&http("http://api.example.com/x")).is_allowed());
        // user info tricks do not get through
        assert!(
            !caps
                .check(&http("https://a.example.com@evil.io/"))
                .is_allowed()
        );
        assert!(!caps.check(&http("not a url")).is_allowed());
        assert!("ftp://x/".parse::<UrlPattern>().is_err());
        assert!("http://a*b/".parse::<UrlPattern>().is_err());
    }

    #[test]
    fn namespaces_and_bus() {
        let caps = Capabilities {
            restart: RestartGrant::namespaces(&["default"]),
            bus: vec![
                "rabbit/springCloudBus".parse().unwrap(),
                "nats/*".parse().unwrap(),
            ],
            ..Default::default()
        };
        let restart = |ns: &str| Action::Restart {
            workload: WorkloadRef {
                kind: WorkloadKind::Deployment,
                namespace: ns.into(),
                name: "w".into(),
            },
            reason: "r".into(),
            content_hash: "h".into(),
            strategy: None,
        };
        assert!(caps.check(&restart("default")).is_allowed());
        assert!(!caps.check(&restart("kube-system")).is_allowed());
        let publish = |c: &str, d: &str| Action::Publish {
            connection: c.into(),
            destination: d.into(),
            routing_key: String::new(),
            headers: vec![],
            payload: vec![],
        };
        assert!(
            caps.check(&publish("rabbit", "springCloudBus"))
                .is_allowed()
        );
        assert!(!caps.check(&publish("rabbit", "other")).is_allowed());
        assert!(caps.check(&publish("nats", "anything")).is_allowed());
        assert!("nobus".parse::<BusPattern>().is_err());
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;
    use crate::action::{Header, HttpMethod};

    fn http(url: &str, headers: &[(&str, &str)]) -> Action {
        Action::Http {
            method: HttpMethod::Post,
            url: url.into(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            body: None,
        }
    }

    fn caps(grant: &str) -> Capabilities {
        Capabilities {
            http: vec![grant.parse().unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn a_trailing_star_in_the_path_is_a_prefix() {
        let c = caps("https://allowed.example.com/hooks/*");
        assert!(
            c.check(&http("https://allowed.example.com/hooks/a/b", &[]))
                .is_allowed()
        );
        assert!(
            !c.check(&http("https://allowed.example.com/admin", &[]))
                .is_allowed()
        );
        // The url crate resolves dot segments before the prefix is compared.
        assert!(
            !c.check(&http("https://allowed.example.com/hooks/../admin", &[]))
                .is_allowed()
        );
        assert!(
            !c.check(&http("https://allowed.example.com.evil.net/hooks/", &[]))
                .is_allowed()
        );
        let wild = caps("https://*.example.com/*");
        assert!(
            wild.check(&http("https://a.example.com/x", &[]))
                .is_allowed()
        );
        assert!(!wild.check(&http("https://example.com/x", &[])).is_allowed());
        assert!(
            !wild
                .check(&http("https://evilexample.com/x", &[]))
                .is_allowed()
        );
    }

    #[test]
    fn a_star_inside_the_path_is_refused_saying_what_to_write() {
        let err = "https://h/hooks/*/refresh"
            .parse::<UrlPattern>()
            .unwrap_err();
        assert!(err.contains("`*` may only end the path"), "{err}");
    }

    #[test]
    fn host_framing_duplicate_and_invalid_headers_are_refused_by_name() {
        let c = caps("http://127.0.0.1:*/");
        let url = "http://127.0.0.1:8080/x";
        for (headers, expect) in [
            (
                vec![("Host", "admin.internal")],
                "header \"Host\" is set by wasmwatch",
            ),
            (
                vec![("content-length", "5")],
                "header \"content-length\" is set by wasmwatch",
            ),
            (
                vec![("Transfer-Encoding", "chunked")],
                "\"Transfer-Encoding\" is set by wasmwatch",
            ),
            (
                vec![("Connection", "close")],
                "\"Connection\" is set by wasmwatch",
            ),
            (
                vec![("X-A", "1"), ("x-a", "2")],
                "header \"x-a\" is set twice",
            ),
            (vec![("X-A", "1\r\nHost: evil")], "control character"),
            (vec![("Bad Name", "1")], "not a valid HTTP header name"),
            (vec![("", "")], "not a valid HTTP header name"),
        ] {
            match c.check(&http(url, &headers)) {
                Verdict::Refused { capability, reason } => {
                    assert_eq!(capability, "http");
                    assert!(reason.contains(expect), "{reason}");
                }
                Verdict::Allowed => panic!("{headers:?} allowed"),
            }
        }
        assert!(c.check(&http(url, &[("X-Token", "abc\tdef")])).is_allowed());
    }

    #[test]
    fn a_million_empty_headers_count_as_output() {
        let headers = vec![
            Header {
                name: String::new(),
                value: String::new(),
            };
            1_000_000
        ];
        let a = Action::Http {
            method: HttpMethod::Post,
            url: "http://x/".into(),
            headers,
            body: None,
        };
        assert!(a.approx_size() > 1 << 20, "{}", a.approx_size());
        assert!(http("http://x/", &[("A", "b")]).approx_size() < 200);
    }

    /// Issue 20: restart grants may name kinds; the list form (every kind)
    /// still reads as before.
    #[test]
    fn restart_grants_name_namespaces_and_kinds() {
        use crate::action::{WorkloadKind, WorkloadRef};
        let caps = |yaml: &str| -> Capabilities { serde_yaml::from_str(yaml).unwrap() };
        let restart = |kind: WorkloadKind| Action::Restart {
            workload: WorkloadRef {
                kind,
                namespace: "shop".into(),
                name: "w".into(),
            },
            reason: "r".into(),
            content_hash: "h".into(),
            strategy: None,
        };
        let old = caps("restart: [shop]");
        assert_eq!(old.restart, RestartGrant::namespaces(&["shop"]));
        assert!(old.check(&restart(WorkloadKind::DaemonSet)).is_allowed());
        let only = caps("restart: {namespaces: [shop], kinds: [Deployment]}");
        assert!(only.check(&restart(WorkloadKind::Deployment)).is_allowed());
        match only.check(&restart(WorkloadKind::DaemonSet)) {
            Verdict::Refused { capability, reason } => {
                assert_eq!(capability, "restart");
                assert!(
                    reason.contains("kind DaemonSet not granted (restart.kinds: Deployment)"),
                    "{reason}"
                );
            }
            v => panic!("{v:?}"),
        }
        let elsewhere = caps("restart: {namespaces: [billing], kinds: ['*']}");
        assert!(
            !elsewhere
                .check(&restart(WorkloadKind::Deployment))
                .is_allowed()
        );
        let err = serde_yaml::from_str::<Capabilities>("restart: {namespace: [shop]}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `namespace`"), "{err}");
        let err = serde_yaml::from_str::<Capabilities>("restart: {kinds: [Deployment]}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `namespaces`"), "{err}");
    }

    /// Issue 20, WIT 0.3.0: kinds beyond apps/v1 are granted by
    /// group/version/Kind (the list form and an empty `kinds` grant the
    /// apps/v1 kinds only); a granted kind is restarted; the restart-at
    /// strategy only of a Rollout.
    #[test]
    fn restart_grants_of_other_kinds_name_them() {
        use crate::action::{RestartStrategy, WorkloadKind, WorkloadRef};
        let caps = |yaml: &str| -> Capabilities { serde_yaml::from_str(yaml).unwrap() };
        let restart = |kind: &str, strategy| Action::Restart {
            workload: WorkloadRef {
                kind: WorkloadKind::parse(kind).unwrap(),
                namespace: "shop".into(),
                name: "w".into(),
            },
            reason: "r".into(),
            content_hash: "h".into(),
            strategy,
        };
        let reason = |v: Verdict| match v {
            Verdict::Refused { capability, reason } => {
                assert_eq!(capability, "restart");
                reason
            }
            Verdict::Allowed => panic!("allowed"),
        };
        let cron = restart("batch/v1/CronJob", None);
        assert_eq!(
            reason(caps("restart: [shop]").check(&cron)),
            "restarting batch/v1/CronJob shop/w: kind batch/v1/CronJob not granted \
             (restart.kinds: none given: the apps/v1 kinds)"
        );
        assert_eq!(
            reason(caps("restart: {namespaces: [shop], kinds: [Deployment]}").check(&cron)),
            "restarting batch/v1/CronJob shop/w: kind batch/v1/CronJob not granted \
             (restart.kinds: Deployment)"
        );
        for granted in ["batch/v1/CronJob", "'*'"] {
            let grant = caps(&format!(
                "restart: {{namespaces: [shop], kinds: [{granted}]}}"
            ));
            assert!(grant.check(&cron).is_allowed(), "{granted}");
        }
        // apps/v1 spelled out is the short name.
        let long = caps("restart: {namespaces: [shop], kinds: [apps/v1/StatefulSet]}");
        assert!(long.check(&restart("StatefulSet", None)).is_allowed());
        assert!(
            long.check(&restart("apps/v1/StatefulSet", None))
                .is_allowed()
        );
        assert!(!long.check(&restart("Deployment", None)).is_allowed());
        // Every strategy passes; restart-at only for Argo Rollouts.
        let any = caps("restart: [shop]");
        for s in [RestartStrategy::Annotations, RestartStrategy::EnvVars] {
            assert!(any.check(&restart("Deployment", Some(s))).is_allowed());
        }
        assert_eq!(
            reason(any.check(&restart("Deployment", Some(RestartStrategy::RestartAt)))),
            "restarting Deployment shop/w: strategy restart-at restarts Argo Rollouts only \
             (argoproj.io/v1alpha1/Rollout); use annotations or env-vars"
        );
        let rollouts = caps("restart: {namespaces: [shop], kinds: [argoproj.io/v1alpha1/Rollout]}");
        let rollout = "argoproj.io/v1alpha1/Rollout";
        for s in [None, Some(RestartStrategy::RestartAt)] {
            assert!(rollouts.check(&restart(rollout, s)).is_allowed(), "{s:?}");
        }
        // A kind a plugin made up is refused as such.
        let odd = Action::Restart {
            workload: WorkloadRef {
                kind: WorkloadKind::from_gvk("ex/ample", "v1", "Thing"),
                namespace: "shop".into(),
                name: "w".into(),
            },
            reason: "r".into(),
            content_hash: "h".into(),
            strategy: None,
        };
        assert!(
            reason(caps("restart: {namespaces: [shop], kinds: ['*']}").check(&odd))
                .contains("not a valid workload kind: group \"ex/ample\" is not a DNS subdomain")
        );
    }
}
