//! The seams under the leader path's I/O: what the checkpoint store and
//! the elector ask of Leases ([`LeaseApi`]), and what a watch loop asks of
//! the watched collection ([`ObjectApi`]).
//!
//! In production both are kube's `Api`; the deterministic simulator
//! (`host/sim`, issue 33) answers them from a simulated API server, with
//! faults, pauses and crashes scheduled from a seed. Only the calls the
//! leader path makes are here, with kube's own types, so the code above a
//! seam is the same code in both worlds.
use std::future::Future;

use futures_util::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, ObjectList, PartialObjectMeta, PostParams,
    WatchEvent, WatchParams,
};

/// The Lease calls of the checkpoint store and the elector (one namespace).
pub trait LeaseApi: Send + Sync + 'static {
    fn get_opt(&self, name: &str) -> impl Future<Output = kube::Result<Option<Lease>>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = kube::Result<Lease>> + Send;
    /// A write guarded by the `resourceVersion` in `lease` (409 if stale).
    fn replace(
        &self,
        name: &str,
        lease: &Lease,
    ) -> impl Future<Output = kube::Result<Lease>> + Send;
    fn delete(
        &self,
        name: &str,
        dp: &DeleteParams,
    ) -> impl Future<Output = kube::Result<()>> + Send;

    /// `get_opt`, with a missing Lease as kube's 404 error.
    fn get(&self, name: &str) -> impl Future<Output = kube::Result<Lease>> + Send {
        async move {
            self.get_opt(name).await?.ok_or_else(|| {
                kube::Error::Api(Box::new(
                    kube::core::Status::failure(
                        &format!("leases.coordination.k8s.io \"{name}\" not found"),
                        "NotFound",
                    )
                    .with_code(404),
                ))
            })
        }
    }
}

impl LeaseApi for Api<Lease> {
    async fn get_opt(&self, name: &str) -> kube::Result<Option<Lease>> {
        Api::get_opt(self, name).await
    }
    async fn create(&self, lease: &Lease) -> kube::Result<Lease> {
        Api::create(self, &PostParams::default(), lease).await
    }
    async fn replace(&self, name: &str, lease: &Lease) -> kube::Result<Lease> {
        Api::replace(self, name, &PostParams::default(), lease).await
    }
    async fn delete(&self, name: &str, dp: &DeleteParams) -> kube::Result<()> {
        Api::delete(self, name, dp).await.map(|_| ())
    }
    async fn get(&self, name: &str) -> kube::Result<Lease> {
        Api::get(self, name).await
    }
}

/// The calls of a watch loop on its collection (one kind, one namespace
/// or all).
pub trait ObjectApi: Send + Sync + 'static {
    fn list(
        &self,
        lp: &ListParams,
    ) -> impl Future<Output = kube::Result<ObjectList<DynamicObject>>> + Send;
    /// The collection's version (the loop asks for one item's metadata).
    fn list_metadata(
        &self,
        lp: &ListParams,
    ) -> impl Future<Output = kube::Result<ObjectList<PartialObjectMeta<DynamicObject>>>> + Send;
    /// A watch from `version`. An expired version is a 410: either this
    /// call's error or an `ERROR` event on the stream.
    fn watch(
        &self,
        wp: &WatchParams,
        version: &str,
    ) -> impl Future<
        Output = kube::Result<BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>>,
    > + Send;
}

impl ObjectApi for Api<DynamicObject> {
    async fn list(&self, lp: &ListParams) -> kube::Result<ObjectList<DynamicObject>> {
        Api::list(self, lp).await
    }
    async fn list_metadata(
        &self,
        lp: &ListParams,
    ) -> kube::Result<ObjectList<PartialObjectMeta<DynamicObject>>> {
        Api::list_metadata(self, lp).await
    }
    async fn watch(
        &self,
        wp: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>> {
        use futures_util::StreamExt;
        Ok(Api::watch(self, wp, version).await?.boxed())
    }
}
