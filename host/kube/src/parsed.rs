//! Watched objects parsed in one pass.
//!
//! kube's `DynamicObject` (and its `ObjectList`) use `#[serde(flatten)]`,
//! which makes serde buffer the whole object, or the whole list page,
//! into an intermediate tree and parse it a second time from there: each
//! 10 KiB value was copied twice before the watch loop saw it. In the
//! realistic mix of issue 35 (90% of the changes concern no app) parsing
//! was a tenth of wasmwatch's CPU against a twentieth of the informer's,
//! which parses into a typed ConfigMap. [`Parsed`] reads the same JSON
//! into the same `DynamicObject` with a visitor, without the buffer; the
//! watch loop's production collection ([`Collection`]) lists and watches
//! through it. The seam ([`ObjectApi`]) still speaks `DynamicObject`, so
//! the simulator and the loop's tests are unchanged.
use std::borrow::Cow;
use std::fmt;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, ObjectList, PartialObjectMeta, WatchEvent,
    WatchParams,
};
use kube::core::{DynamicResourceScope, ListMeta, ObjectMeta, Resource, TypeMeta};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

use crate::apis::ObjectApi;

/// A `DynamicObject` parsed in one pass: `apiVersion` and `kind` into its
/// types, `metadata` typed, every other field into `data`, as kube's own
/// parse gives them.
#[derive(Clone, Debug)]
pub struct Parsed(pub DynamicObject);

impl<'de> Deserialize<'de> for Parsed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Parsed;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a Kubernetes object")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Parsed, M::Error> {
                let mut api_version: Option<String> = None;
                let mut kind: Option<String> = None;
                let mut metadata: Option<ObjectMeta> = None;
                let mut data = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    match &*key {
                        "apiVersion" => api_version = Some(map.next_value()?),
                        "kind" => kind = Some(map.next_value()?),
                        "metadata" => metadata = Some(map.next_value()?),
                        _ => {
                            let value = map.next_value()?;
                            data.insert(key, value);
                        }
                    }
                }
                // kube's parse takes a missing metadata as empty; so does
                // this one (the watch loop then skips the nameless object).
                let metadata = metadata.unwrap_or_default();
                let types = match (api_version, kind) {
                    (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
                    _ => None,
                };
                Ok(Parsed(DynamicObject {
                    types,
                    metadata,
                    data: serde_json::Value::Object(data),
                }))
            }
        }
        d.deserialize_map(Object)
    }
}

impl Resource for Parsed {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// A list page without `ObjectList`'s flattened types (which buffer the
/// whole page before its items are parsed).
#[derive(serde::Deserialize)]
pub struct Page {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub items: Vec<Parsed>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Parsed>, D::Error> {
    Ok(Option::<Vec<Parsed>>::deserialize(d)?.unwrap_or_default())
}

/// One watched collection on the API server (a kind, in one namespace or
/// all), parsed with [`Parsed`].
pub struct Collection {
    client: kube::Client,
    resource: ApiResource,
    /// The collection's requests (its lists go through [`Page`]).
    request: kube::core::Request,
    objects: Api<Parsed>,
    metadata: Api<DynamicObject>,
}

impl Collection {
    pub fn new(client: kube::Client, namespace: Option<&str>, resource: &ApiResource) -> Self {
        let (objects, metadata) = match namespace {
            Some(ns) => (
                Api::namespaced_with(client.clone(), ns, resource),
                Api::namespaced_with(client.clone(), ns, resource),
            ),
            None => (
                Api::all_with(client.clone(), resource),
                Api::all_with(client.clone(), resource),
            ),
        };
        Collection {
            client,
            resource: resource.clone(),
            request: kube::core::Request::new(Parsed::url_path(resource, namespace)),
            objects,
            metadata,
        }
    }
}

impl ObjectApi for Collection {
    async fn list(&self, lp: &ListParams) -> kube::Result<ObjectList<DynamicObject>> {
        let mut request = self.request.list(lp).map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("list");
        let page: Page = self.client.request(request).await?;
        Ok(ObjectList {
            types: TypeMeta {
                api_version: self.resource.api_version.clone(),
                kind: format!("{}List", self.resource.kind),
            },
            metadata: page.metadata,
            items: page.items.into_iter().map(|p| p.0).collect(),
        })
    }

    async fn list_metadata(
        &self,
        lp: &ListParams,
    ) -> kube::Result<ObjectList<PartialObjectMeta<DynamicObject>>> {
        self.metadata.list_metadata(lp).await
    }

    async fn watch(
        &self,
        wp: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>> {
        let events = self.objects.watch(wp, version).await?;
        Ok(events
            .map(|event| {
                event.map(|event| match event {
                    WatchEvent::Added(o) => WatchEvent::Added(o.0),
                    WatchEvent::Modified(o) => WatchEvent::Modified(o.0),
                    WatchEvent::Deleted(o) => WatchEvent::Deleted(o.0),
                    WatchEvent::Bookmark(b) => WatchEvent::Bookmark(b),
                    WatchEvent::Error(e) => WatchEvent::Error(e),
                })
            })
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(json: &str) -> (DynamicObject, DynamicObject) {
        let kube: DynamicObject = serde_json::from_str(json).expect("kube parses it");
        let ours: Parsed = serde_json::from_str(json).expect("Parsed parses it");
        (kube, ours.0)
    }

    fn same(json: &str) {
        let (kube, ours) = both(json);
        assert_eq!(
            serde_json::to_value(&kube).unwrap(),
            serde_json::to_value(&ours).unwrap(),
            "{json}"
        );
        assert_eq!(kube.types, ours.types, "{json}");
        assert_eq!(kube.data, ours.data, "{json}");
    }

    #[test]
    fn parses_what_kube_parses() {
        // A ConfigMap: data, binaryData, immutable, an escaped value, a
        // key before the metadata.
        same(
            r#"{"data":{"a":"x\"y\n","b":""},"kind":"ConfigMap","apiVersion":"v1",
               "metadata":{"name":"c","namespace":"n","uid":"u","resourceVersion":"7",
                 "labels":{"l":"v"},"annotations":{"k":"w"}},
               "binaryData":{"bin":"AAE="},"immutable":true}"#,
        );
        // A Secret with a type and no data.
        same(
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","resourceVersion":"1"},"type":"Opaque"}"#,
        );
        // A custom object: nested content, numbers, nulls, arrays.
        same(
            r#"{"apiVersion":"x.io/v1","kind":"Thing","metadata":{"name":"t","generation":3},
               "spec":{"n":1.5,"list":[1,"a",null],"deep":{"k":{"v":true}}},"status":null}"#,
        );
        // Without types (a watch event's object may lack them).
        same(r#"{"metadata":{"name":"bare"},"data":{"k":"v"}}"#);
    }

    #[test]
    fn odd_objects_parse_or_fail_as_kube_s_parse_does() {
        // No metadata: empty, as kube takes it.
        same(r#"{"apiVersion":"v1","kind":"ConfigMap","data":{}}"#);
        // Not an object, or a metadata of the wrong shape: refused by both.
        for json in [r#"[1]"#, r#"{"metadata":{"name":3}}"#, r#"{"metadata":[]}"#] {
            assert!(
                serde_json::from_str::<DynamicObject>(json).is_err(),
                "{json}"
            );
            assert!(serde_json::from_str::<Parsed>(json).is_err(), "{json}");
        }
    }

    #[test]
    fn watch_events_and_list_pages_parse() {
        let line = r#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","resourceVersion":"9"},"data":{"k":"v"}}}"#;
        let WatchEvent::Modified(o) = serde_json::from_str::<WatchEvent<Parsed>>(line).unwrap()
        else {
            panic!("a modification")
        };
        assert_eq!(o.0.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(o.0.data["data"]["k"], "v");
        let page: Page = serde_json::from_str(
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"12","continue":"abc"},
               "items":[{"metadata":{"name":"a"},"data":{"x":"1"}},{"metadata":{"name":"b"}}]}"#,
        )
        .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some("12"));
        assert_eq!(page.metadata.continue_.as_deref(), Some("abc"));
        let names: Vec<_> = page
            .items
            .iter()
            .map(|p| p.0.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let empty: Page = serde_json::from_str(r#"{"metadata":{},"items":null}"#).unwrap();
        assert!(empty.items.is_empty());
    }
}
