//! The key of Secret digests (see `wasmwatch_core::digest`): 32 random
//! bytes in the `key` field of a Secret in wasmwatch's namespace
//! ([`DEFAULT_SECRET`] unless the manifest's `watch.digestKeySecret` names
//! another), the same for every replica and every restart.
//!
//! The first replica that finds no such Secret creates it; replicas racing
//! to create it all end with the one the API server kept (409 AlreadyExists
//! is answered by reading it). An operator may create it beforehand with
//! their own key (at least 16 bytes), and then needs no `create` right on
//! Secrets at all. wasmwatch never updates or deletes it.
//!
//! Changing the key makes every Secret's stored digests incomparable: each
//! Secret then counts as changed at its next event or resync (its
//! workloads restart once). Rotate it only when that is acceptable.
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use wasmwatch_core::digest::DigestKey;

/// The Secret wasmwatch keeps its digest key in, by default.
pub const DEFAULT_SECRET: &str = "wasmwatch-digest-key";
/// The field of the Secret holding the key.
pub const KEY_FIELD: &str = "key";
/// Bytes of a key wasmwatch creates.
const NEW_KEY_BYTES: usize = 32;

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The API server could not be reached or failed (worth retrying).
    #[error("{0}")]
    Retryable(String),
    /// Retrying cannot help: no right to read or create the Secret, or a
    /// Secret that holds no usable key.
    #[error("{0}")]
    Permanent(String),
}

/// Reads the key from Secret `namespace/name`, creating it first when it
/// does not exist and `create` is set; `Ok(None)`: it does not exist and
/// `create` is not set.
pub async fn load(
    client: kube::Client,
    namespace: &str,
    name: &str,
    create: bool,
) -> Result<Option<DigestKey>, KeyError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let what = format!("digest key Secret {namespace}/{name}");
    match api.get_opt(name).await {
        Ok(Some(secret)) => return key_of(&secret, &what).map(Some),
        Ok(None) if !create => return Ok(None),
        Ok(None) => {}
        Err(e) => return Err(api_error(&what, "reading", e)),
    }
    let mut bytes = vec![0u8; NEW_KEY_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| KeyError::Permanent(format!("{what}: no random bytes for a new key: {e}")))?;
    let secret = Secret {
        metadata: managed_metadata(
            namespace,
            name,
            "Key of wasmwatch's digests of Secret data (HMAC-SHA-256). \
             Every replica uses it; replacing it makes every Secret count \
             as changed once.",
        ),
        type_: Some("Opaque".to_string()),
        immutable: Some(true),
        data: Some([(KEY_FIELD.to_string(), ByteString(bytes))].into()),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(created) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), "created the digest key");
            key_of(&created, &what).map(Some)
        }
        // Another replica created it first: use theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get(name).await {
            Ok(secret) => key_of(&secret, &what).map(Some),
            Err(e) => Err(api_error(&what, "reading", e)),
        },
        Err(e) => Err(api_error(&what, "creating", e)),
    }
}

/// The metadata of an object wasmwatch creates for itself (the digest key's
/// Secret, the webhook certificate's): labelled managed by wasmwatch, with
/// a `wasmwatch.io/description` saying what it is for.
pub fn managed_metadata(namespace: &str, name: &str, description: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(
            [(
                "app.kubernetes.io/managed-by".to_string(),
                "wasmwatch".to_string(),
            )]
            .into(),
        ),
        annotations: Some(
            [(
                "wasmwatch.io/description".to_string(),
                description.to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

fn key_of(secret: &Secret, what: &str) -> Result<DigestKey, KeyError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_FIELD))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(KEY_FIELD))
                .map(|s| s.as_bytes().to_vec())
        })
        .ok_or_else(|| {
            KeyError::Permanent(format!(
                "{what} has no `{KEY_FIELD}` field: put a key of at least {} random bytes there \
                 (for example `kubectl create secret generic NAME --from-literal={KEY_FIELD}=$(openssl rand -hex 32)`), \
                 or delete the Secret to have wasmwatch create one",
                wasmwatch_core::digest::MIN_KEY_BYTES
            ))
        })?;
    DigestKey::new(&bytes).map_err(|e| KeyError::Permanent(format!("{what}: {e}")))
}

fn api_error(what: &str, doing: &str, e: kube::Error) -> KeyError {
    match &e {
        kube::Error::Api(s) if s.code == 403 => KeyError::Permanent(format!(
            "{what}: {doing} it is forbidden ({}); wasmwatch needs `get` on this Secret \
             and `create` on secrets in its namespace (deploy/base/leases-rbac.yaml), \
             or the Secret created beforehand",
            s.message
        )),
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            KeyError::Permanent(format!("{what}: {doing} it was refused: {}", s.message))
        }
        _ => KeyError::Retryable(format!("{what}: {doing} it failed: {e}")),
    }
}
