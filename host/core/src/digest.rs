//! Content digests of objects' data, and the key that makes Secret digests
//! unguessable.
//!
//! A digest of Secret data ends up where more people can read it than can
//! read the Secret: in the state Lease's index shards (per object and per
//! key), in `event.digest` (which the bundled rollout-restart writes on pod
//! templates as `secret/<name>:<digest>`), in logs. A plain SHA-256 of a
//! weak value (`pin` = `1234`) is a guess away from the value, so Secret
//! digests are HMAC-SHA-256 under a [`DigestKey`] every replica shares
//! (host/kube's `digest_key` keeps it in a Secret in wasmwatch's
//! namespace). ConfigMap digests stay plain SHA-256: anyone who can read
//! the digest can read the ConfigMap.
//!
//! Both are computed over the same bytes: per key in key order, the key's
//! and the value's length (u64, little endian) before each of them.
//!
//! Digests written by versions before keys existed were plain for Secrets
//! too. They are recognisable (the index marks keyed lines; a restart knows
//! the plain digest of the content it restarts for), so an upgrade compares
//! old digests as equal to the same content and acts on nothing by itself.
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sha2::digest::{FixedOutput, Update};

use crate::event::DataValue;

/// The shortest key accepted, in bytes (HMAC keys below a hash's output are
/// weaker; RFC 2104 recommends at least that length).
pub const MIN_KEY_BYTES: usize = 16;

/// A secret key for HMAC-SHA-256 digests of Secret data. Its `Debug` does
/// not print the key.
#[derive(Clone)]
pub struct DigestKey {
    mac: Hmac<Sha256>,
    /// Only for equality (tests compare indexes that hold a key).
    bytes: Arc<[u8]>,
}

impl DigestKey {
    /// A key of at least [`MIN_KEY_BYTES`] bytes.
    pub fn new(key: &[u8]) -> Result<DigestKey, String> {
        if key.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the digest key has {} bytes; at least {MIN_KEY_BYTES} are needed",
                key.len()
            ));
        }
        Ok(DigestKey {
            mac: <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length"),
            bytes: key.into(),
        })
    }

    fn mac(&self) -> Hmac<Sha256> {
        self.mac.clone()
    }
}

impl PartialEq for DigestKey {
    fn eq(&self, other: &DigestKey) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for DigestKey {}

impl fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

fn feed(h: &mut impl Update, data: &BTreeMap<String, DataValue>) {
    for (k, v) in data {
        h.update(&(k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        let v = v.as_bytes();
        h.update(&(v.len() as u64).to_le_bytes());
        h.update(v);
    }
}

fn finish(h: impl FixedOutput) -> [u8; 32] {
    h.finalize_fixed()
        .as_slice()
        .try_into()
        .expect("SHA-256 has 32 bytes")
}

/// Hex digest of `data`: HMAC-SHA-256 under `key`, plain SHA-256 without.
/// Equal content gives an equal digest whatever the object's history.
pub fn data_digest(data: &BTreeMap<String, DataValue>, key: Option<&DigestKey>) -> String {
    let bytes = match key {
        Some(key) => {
            let mut h = key.mac();
            feed(&mut h, data);
            finish(h)
        }
        None => {
            let mut h = <Sha256 as sha2::Digest>::new();
            feed(&mut h, data);
            finish(h)
        }
    };
    hex::encode(bytes)
}

/// Stakater Reloader's hash of a ConfigMap's or Secret's data (its
/// `util.GetSHAfromConfigmap` and `GetSHAfromSecret`, v1.4.21): one
/// string per key, `k=v` (a ConfigMap's `binaryData` value in standard
/// base64, a Secret's value as its raw bytes), the strings sorted
/// bytewise, joined with `;`, SHA-1, lowercase hex. Reloader writes it in
/// its `STAKATER_<NAME>_<KIND>` variables and in `last-reloaded-from`; a
/// restart takes a workload recording it as already at this content, so a
/// migration from Reloader restarts nothing by itself. Unkeyed: computed to
/// compare, and written only where Reloader wrote it already (see
/// `RestartStrategy::EnvVars`).
pub fn reloader_hash(kind: crate::ObjectKind, data: &BTreeMap<String, DataValue>) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    if kind.as_str() == crate::manifest::SECRET_PROVIDER_CLASS_POD_STATUS {
        return reloader_csi_hash(data);
    }
    let mut entries: Vec<Vec<u8>> = data
        .iter()
        .map(|(k, v)| {
            let mut e = Vec::with_capacity(k.len() + 1 + v.as_bytes().len());
            e.extend_from_slice(k.as_bytes());
            e.push(b'=');
            match (kind, v) {
                (crate::ObjectKind::ConfigMap, DataValue::Binary(b)) => e.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(b)
                        .as_bytes(),
                ),
                _ => e.extend_from_slice(v.as_bytes()),
            }
            e
        })
        .collect();
    entries.sort();
    hex::encode(sha1::Sha1::digest(entries.join(&b';')))
}

/// Reloader's hash of a SecretProviderClassPodStatus
/// (`GetSHAfromSecretProviderClassPodStatus`, `plugins/reloader-spec.md`
/// §7.2): `id=version` of each mounted object and
/// `SecretProviderClassName=<class>`, sorted, joined by `;`, SHA-1; read
/// from the content `watch.kinds` gives the kind by default
/// (`status.objects` as JSON, `status.secretProviderClassName`).
fn reloader_csi_hash(data: &BTreeMap<String, DataValue>) -> String {
    use sha1::Digest as _;
    let text = |k: &str| match data.get(k) {
        Some(DataValue::Text(t)) => t.as_str(),
        _ => "",
    };
    let objects: Vec<serde_json::Value> =
        serde_json::from_str(text("status.objects")).unwrap_or_default();
    let field = |o: &serde_json::Value, f: &str| {
        o.get(f).and_then(|v| v.as_str()).unwrap_or("").to_string()
    };
    let mut values: Vec<String> = objects
        .iter()
        .map(|o| format!("{}={}", field(o, "id"), field(o, "version")))
        .collect();
    values.push(format!(
        "SecretProviderClassName={}",
        text("status.secretProviderClassName")
    ));
    values.sort();
    hex::encode(sha1::Sha1::digest(values.join(";").as_bytes()))
}

/// The first 8 bytes of one value's digest (the index's per-key hashes).
pub fn short_hash(bytes: &[u8], key: Option<&DigestKey>) -> u64 {
    let d = match key {
        Some(key) => {
            let mut h = key.mac();
            Update::update(&mut h, bytes);
            finish(h)
        }
        None => <Sha256 as sha2::Digest>::digest(bytes).into(),
    };
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of plugins/reloader-spec.md §2.1, computed with
    /// Reloader's Go code.
    #[test]
    fn reloaders_csi_hash_is_of_the_mounted_versions_and_the_class() {
        let kind =
            crate::ObjectKind::parse(crate::manifest::SECRET_PROVIDER_CLASS_POD_STATUS).unwrap();
        let data: BTreeMap<String, DataValue> = [
            ("status.secretProviderClassName", "vault-db"),
            (
                "status.objects",
                r#"[{"id":"secret/db","version":"v2"},{"id":"secret/api","version":"v7"}]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), DataValue::Text(v.to_string())))
        .collect();
        // printf 'SecretProviderClassName=vault-db;secret/api=v7;secret/db=v2' | sha1sum
        assert_eq!(
            reloader_hash(kind, &data),
            "3715f4ba3bdb53b41ef5e46e76db09ec96064c38"
        );
    }

    #[test]
    fn reloader_hash_is_reloaders() {
        use crate::ObjectKind::{ConfigMap, Secret};
        let text = |pairs: &[(&str, &str)]| -> BTreeMap<String, DataValue> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), DataValue::Text(v.to_string())))
                .collect()
        };
        assert_eq!(
            reloader_hash(ConfigMap, &text(&[("a", "1"), ("b", "2")])),
            "f83e99e324ba68ccc373a58ef1eb42f8ab88646a"
        );
        let mut mixed = text(&[("k", "v")]);
        mixed.insert("bin".into(), DataValue::Binary(vec![0, 1]));
        assert_eq!(
            reloader_hash(ConfigMap, &mixed),
            "bf283deb9c93083903f3eb14a70bcaeb55717778"
        );
        assert_eq!(
            reloader_hash(ConfigMap, &BTreeMap::new()),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        // A Secret's values are their bytes: the same text hashes the same.
        assert_eq!(
            reloader_hash(Secret, &text(&[("a", "1"), ("b", "2")])),
            "f83e99e324ba68ccc373a58ef1eb42f8ab88646a"
        );
        // Sorted as whole strings, not by key: "a.b=1" sorts before "a=2".
        let keys = text(&[("a", "2"), ("a.b", "1")]);
        let by_string = {
            use sha1::Digest as _;
            hex::encode(sha1::Sha1::digest(b"a.b=1;a=2"))
        };
        assert_eq!(reloader_hash(ConfigMap, &keys), by_string);
    }

    fn data(v: &str) -> BTreeMap<String, DataValue> {
        BTreeMap::from([("pin".to_string(), DataValue::Text(v.to_string()))])
    }

    #[test]
    fn keyed_digests_differ_from_plain_and_between_keys() {
        let a = DigestKey::new(&[1; 32]).unwrap();
        let b = DigestKey::new(&[2; 32]).unwrap();
        let plain = data_digest(&data("1234"), None);
        let keyed = data_digest(&data("1234"), Some(&a));
        assert_ne!(plain, keyed);
        assert_ne!(keyed, data_digest(&data("1234"), Some(&b)));
        // Deterministic: every replica with the key computes the same.
        assert_eq!(
            keyed,
            data_digest(&data("1234"), Some(&DigestKey::new(&[1; 32]).unwrap()))
        );
        assert_ne!(keyed, data_digest(&data("1235"), Some(&a)));
        assert_eq!(keyed.len(), 64);
        // The plain per-key hash is SHA-256's first 8 bytes, little endian:
        // what versions before keys stored (`pin=5ce1f3164267ac03`).
        assert_eq!(short_hash(b"1234", None), 0x5ce1_f316_4267_ac03);
        assert_ne!(short_hash(b"1234", Some(&a)), 0x5ce1_f316_4267_ac03);
    }

    #[test]
    fn short_keys_are_refused_and_never_printed() {
        assert!(
            DigestKey::new(b"short")
                .unwrap_err()
                .contains("at least 16")
        );
        let k = DigestKey::new(b"a secret key of some length").unwrap();
        assert_eq!(format!("{k:?}"), "DigestKey(..)");
    }
}
