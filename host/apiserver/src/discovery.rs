//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`)
//! and `/version`.
//!
//! Every document lists only the resources served at that moment (a custom
//! resource only while its CRD exists; see [`resources::Served`]): a group
//! with none is absent, as on kube-apiserver.
//!
//! Only the classic (unaggregated) discovery format is served. kubectl asks
//! for aggregated discovery (`apidiscovery.k8s.io/v2`) in its Accept header
//! but falls back to this format when the response's Content-Type is plain
//! `application/json`, exactly as it does against older servers.

use serde_json::{Value, json};

use crate::resources::{self, ResourceType, Served};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-wasmwatch",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({ "groupVersion": format!("{group}/{version}"), "version": version });
    json!({
        "name": group,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

/// `/apis`.
pub fn api_group_list(served: &Served) -> Value {
    let groups: Vec<Value> = resources::groups(served)
        .into_iter()
        .map(|(g, v)| group_doc(g, v))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `/apis/{group}`, if served.
pub fn api_group(group: &str, served: &Served) -> Option<Value> {
    let (g, v) = resources::groups(served)
        .into_iter()
        .find(|(g, _)| *g == group)?;
    let mut doc = group_doc(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

fn api_resource(rt: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    });
    if !rt.short_names.is_empty() {
        main["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        main["categories"] = json!(rt.categories);
    }
    let mut out = vec![main];
    if rt.status_subresource {
        out.push(json!({
            "name": format!("{}/status", rt.plural),
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    if rt.scale_subresource {
        out.push(json!({
            "name": format!("{}/scale", rt.plural),
            "singularName": "",
            "namespaced": rt.namespaced,
            "group": "autoscaling",
            "version": "v1",
            "kind": "Scale",
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// `/api/v1` or `/apis/{group}/{version}`, if served.
pub fn api_resource_list(group: &str, version: &str, served: &Served) -> Option<Value> {
    let list: Vec<Value> = resources::in_group_version(group, version, served)
        .flat_map(api_resource)
        .collect();
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": list,
    }))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of per-group-version documents.
///
/// kubectl reads these only to learn that the server supports server-side
/// field validation (the `fieldValidation` query parameter on PATCH); with
/// that it skips downloading full schemas for client-side validation.
pub fn openapi_v3_index(served: &Served) -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs = vec![("", "v1")];
    gvs.extend(resources::groups(served));
    for (g, v) in gvs {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({ "serverRelativeURL": format!("/openapi/v3/{p}?hash=wasmwatch") }),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`: a skeleton
/// OpenAPI document whose item paths declare PATCH with `fieldValidation`.
pub fn openapi_v3_group_version(group: &str, version: &str, served: &Served) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for rt in resources::in_group_version(group, version, served) {
        let prefix = format!("/{}", gv_path(group, version));
        let item = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{prefix}/{}/{{name}}", rt.plural)
        };
        let gvk = json!({ "group": rt.group, "version": rt.version, "kind": rt.kind });
        let params = json!([
            { "name": "dryRun", "in": "query", "schema": { "type": "string" } },
            { "name": "fieldManager", "in": "query", "schema": { "type": "string" } },
            { "name": "fieldValidation", "in": "query", "schema": { "type": "string" } },
        ]);
        paths.insert(
            item,
            json!({
                "get": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get" },
                "put": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "put", "parameters": params },
                "patch": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch", "parameters": params },
                "delete": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "delete" },
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": "v1.32.0" },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}

/// `/openapi/v2`: an empty OpenAPI v2 document in gnostic's protobuf form
/// (`openapi_v2.Document`), which older kubectl (Debian's 1.20) insists on
/// fetching before `apply`. With no schemas in it, kubectl falls back to its
/// built-in type information, as it does for types the server does not
/// describe.
pub fn openapi_v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2); // length-delimited
        let mut len = bytes.len();
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"wasmwatch-apiserver"); // title
    field(&mut info, 2, b"v1"); // version
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0"); // swagger
    field(&mut doc, 2, &info); // info
    field(&mut doc, 8, &[]); // paths
    doc
}
