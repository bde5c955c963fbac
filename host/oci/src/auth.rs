//! Registry credentials, as a Kubernetes user keeps them: a docker
//! `config.json` (the content of an imagePullSecret's `.dockerconfigjson`,
//! `auths.<registry>.auth` = base64 `user:password`, or `username` and
//! `password`, or a `registrytoken`), or one explicit user and password.
//! Anonymous when neither names the registry.
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;

use crate::OciError;

/// Where credentials come from.
#[derive(Clone, Default)]
pub struct AuthSource {
    /// A docker config.json given explicitly (must exist).
    pub config_file: Option<PathBuf>,
    /// A user and password for every registry, ahead of any config file.
    pub explicit: Option<(String, String)>,
}

impl std::fmt::Debug for AuthSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSource")
            .field("config_file", &self.config_file)
            .field("user", &self.explicit.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// The credentials for one registry and where they came from (for messages;
/// never the secret itself).
#[derive(Clone)]
pub struct Credentials {
    pub auth: RegistryAuth,
    pub from: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.from)
    }
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
pub fn default_docker_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker").join("config.json"))
}

impl AuthSource {
    /// The credentials for `registry` (`host[:port]`, as in the reference).
    pub fn credentials(&self, registry: &str) -> Result<Credentials, OciError> {
        if let Some((user, password)) = &self.explicit {
            return Ok(Credentials {
                auth: RegistryAuth::Basic(user.clone(), password.clone()),
                from: format!("user {user:?} (WASMWATCH_REGISTRY_USERNAME)"),
            });
        }
        let (path, explicit) = match &self.config_file {
            Some(p) => (p.clone(), true),
            None => match default_docker_config() {
                Some(p) => (p, false),
                None => return Ok(anonymous()),
            },
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(anonymous());
            }
            Err(e) => {
                return Err(OciError::Config(format!(
                    "cannot read the registry credentials file {}: {e}",
                    path.display()
                )));
            }
        };
        from_docker_config(&text, &path, registry)
    }
}

fn anonymous() -> Credentials {
    Credentials {
        auth: RegistryAuth::Anonymous,
        from: "anonymous access".into(),
    }
}

/// The host (and port) a key of `auths` names: docker writes both
/// `registry:5000` and `https://index.docker.io/v1/`.
fn auths_key_host(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// Docker Hub is known by several names.
fn same_registry(a: &str, b: &str) -> bool {
    const HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
    a.eq_ignore_ascii_case(b) || (HUB.contains(&a) && HUB.contains(&b))
}

/// Reads the entry for `registry` from a docker config.json's text.
pub fn from_docker_config(
    text: &str,
    path: &Path,
    registry: &str,
) -> Result<Credentials, OciError> {
    let bad = |what: String| {
        OciError::Config(format!(
            "invalid registry credentials file {}: {what}",
            path.display()
        ))
    };
    let config: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let auths = config.get("auths").and_then(|a| a.as_object());
    let entry = auths.and_then(|auths| {
        auths
            .iter()
            .find(|(k, _)| same_registry(auths_key_host(k), registry))
    });
    let Some((key, entry)) = entry else {
        let helper = config
            .get("credHelpers")
            .and_then(|h| h.as_object())
            .is_some_and(|h| h.keys().any(|k| same_registry(auths_key_host(k), registry)))
            || config.get("credsStore").is_some();
        if helper {
            tracing::warn!(
                file = %path.display(),
                registry,
                "credential helpers (credsStore, credHelpers) are not supported; pulling anonymously"
            );
        }
        return Ok(anonymous());
    };
    let from = format!("{} (auths.{key})", path.display());
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
    };
    if let Some(encoded) = field("auth") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| bad(format!("auths.{key}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| bad(format!("auths.{key}.auth is not UTF-8 user:password")))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| bad(format!("auths.{key}.auth is not user:password")))?;
        return Ok(Credentials {
            auth: RegistryAuth::Basic(user.into(), password.into()),
            from: format!("user {user:?} from {from}"),
        });
    }
    if let (Some(user), Some(password)) = (field("username"), field("password")) {
        return Ok(Credentials {
            auth: RegistryAuth::Basic(user.into(), password.into()),
            from: format!("user {user:?} from {from}"),
        });
    }
    if let Some(token) = field("registrytoken") {
        return Ok(Credentials {
            auth: RegistryAuth::Bearer(token.into()),
            from: format!("the registry token from {from}"),
        });
    }
    if field("identitytoken").is_some() {
        return Err(bad(format!(
            "auths.{key} holds an identitytoken (an OAuth refresh token), which is not supported; \
             use auth or username/password"
        )));
    }
    Err(bad(format!(
        "auths.{key} has neither auth, username/password nor registrytoken"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(c: &Credentials) -> (String, String) {
        match &c.auth {
            RegistryAuth::Basic(u, p) => (u.clone(), p.clone()),
            other => panic!("not basic: {other:?}"),
        }
    }

    #[test]
    fn reads_dockerconfigjson_entries() {
        let path = Path::new("/run/secrets/pull/.dockerconfigjson");
        // "alice:s3cr:et" — a password may hold colons.
        let text = r#"{"auths": {
            "registry.example.com:5000": {"auth": "YWxpY2U6czNjcjpldA=="},
            "https://index.docker.io/v1/": {"username": "bob", "password": "pw"},
            "tok.example.com": {"registrytoken": "T"},
            "idt.example.com": {"identitytoken": "R"}
        }}"#;
        let c = from_docker_config(text, path, "registry.example.com:5000").unwrap();
        assert_eq!(basic(&c), ("alice".into(), "s3cr:et".into()));
        assert!(c.from.contains("alice") && !c.from.contains("s3cr"));
        let c = from_docker_config(text, path, "docker.io").unwrap();
        assert_eq!(basic(&c), ("bob".into(), "pw".into()));
        let c = from_docker_config(text, path, "tok.example.com").unwrap();
        assert_eq!(c.auth, RegistryAuth::Bearer("T".into()));
        let e = from_docker_config(text, path, "idt.example.com").unwrap_err();
        assert!(e.to_string().contains("identitytoken"), "{e}");
        let c = from_docker_config(text, path, "other.example.com").unwrap();
        assert_eq!(c.auth, RegistryAuth::Anonymous);
        let e = from_docker_config("{", path, "x").unwrap_err();
        assert!(e.to_string().contains(".dockerconfigjson"), "{e}");
    }

    #[test]
    fn an_explicit_file_must_exist_the_default_one_need_not() {
        let dir = tempfile::tempdir().unwrap();
        let source = AuthSource {
            config_file: Some(dir.path().join("missing.json")),
            explicit: None,
        };
        let e = source.credentials("r.example.com").unwrap_err();
        assert!(e.to_string().contains("missing.json"), "{e}");
        let source = AuthSource {
            config_file: None,
            explicit: Some(("u".into(), "p".into())),
        };
        assert_eq!(
            basic(&source.credentials("r.example.com").unwrap()),
            ("u".into(), "p".into())
        );
    }
}
