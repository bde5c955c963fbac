//! What the benchmarks share.
use std::collections::BTreeMap;

use wasmwatch_core::lookups::{ServiceInfo, ServicePort};

/// Service `shop/NAME` labelled `app=NAME`, port 8080, with `annotations`.
pub fn service(name: &str, annotations: &[(&str, &str)]) -> ServiceInfo {
    ServiceInfo {
        namespace: "shop".into(),
        name: name.into(),
        labels: BTreeMap::from([("app".to_string(), name.to_string())]),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ports: vec![ServicePort {
            name: None,
            port: 8080,
        }],
    }
}
