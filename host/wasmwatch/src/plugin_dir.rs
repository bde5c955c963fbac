//! `--plugin-dir IMAGE_DIR=LOCAL_DIR`: read the modules a manifest names
//! under a folder of the image (`/usr/lib/wasmwatch/plugins`) from a local
//! folder instead, so that the deploy manifest can be checked outside the
//! image.
use std::path::{Path, PathBuf};
use std::str::FromStr;

use wasmwatch_core::Manifest;

/// One `IMAGE_DIR=LOCAL_DIR` mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginDirMap {
    /// The folder as the manifest names it (absolute).
    pub from: PathBuf,
    /// Where its files are here.
    pub to: PathBuf,
}

impl FromStr for PluginDirMap {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((from, to)) = s.split_once('=') else {
            return Err(format!(
                "{s:?} is not IMAGE_DIR=LOCAL_DIR (e.g. /usr/lib/wasmwatch/plugins=./plugins)"
            ));
        };
        if !Path::new(from).is_absolute() {
            return Err(format!(
                "{from:?} is not an absolute path (the folder as the manifest names it, e.g. /usr/lib/wasmwatch/plugins)"
            ));
        }
        if to.is_empty() {
            return Err(format!("{s:?} names no local folder after '='"));
        }
        Ok(PluginDirMap {
            from: PathBuf::from(from),
            to: PathBuf::from(to),
        })
    }
}

/// Points every local module of `manifest` under a mapping's `from` at the
/// same file under its `to`, a relative `to` taken from the current folder
/// (the first mapping that matches wins; `oci://` modules are left alone). Returns the mappings that matched no module,
/// which the caller reports.
pub fn apply(manifest: &mut Manifest, maps: &[PluginDirMap]) -> Vec<PluginDirMap> {
    let mut used = vec![false; maps.len()];
    let base = manifest.base_dir.clone();
    for entry in &mut manifest.plugins {
        if entry.oci_reference().is_some() {
            continue;
        }
        let path = entry.module_path(&base);
        for (n, map) in maps.iter().enumerate() {
            if let Ok(rest) = path.strip_prefix(&map.from) {
                let to = std::path::absolute(&map.to).unwrap_or_else(|_| map.to.clone());
                entry.module = to.join(rest);
                used[n] = true;
                break;
            }
        }
    }
    maps.iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|(m, _)| m.clone())
        .collect()
}

/// [`apply`], warning of each mapping no module is under (`run`).
pub fn apply_noting(manifest: &mut Manifest, maps: &[PluginDirMap]) {
    for unused in apply(manifest, maps) {
        tracing::warn!(
            "--plugin-dir {}={}: no module of the manifest is under {}",
            unused.from.display(),
            unused.to.display(),
            unused.from.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_maps() {
        assert!("plugins".parse::<PluginDirMap>().is_err());
        assert!("rel=./x".parse::<PluginDirMap>().is_err());
        assert!("/usr/lib/x=".parse::<PluginDirMap>().is_err());
        let map: PluginDirMap = "/usr/lib/wasmwatch/plugins=./built".parse().unwrap();
        assert_eq!(map.to, PathBuf::from("./built"));

        let yaml = "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n\
            - {name: a, module: /usr/lib/wasmwatch/plugins/a.wasm, sha256: \"00\"}\n\
            - {name: b, module: b.wasm, sha256: \"00\"}\n";
        let mut m: Manifest = serde_yaml::from_str(yaml).unwrap();
        m.base_dir = PathBuf::from("/etc/wasmwatch");
        let other: PluginDirMap = "/opt/none=/tmp".parse().unwrap();
        let unused = apply(&mut m, &[map, other.clone()]);
        assert_eq!(unused, vec![other]);
        assert_eq!(
            m.plugins[0].module,
            std::path::absolute("./built").unwrap().join("a.wasm")
        );
        assert_eq!(m.plugins[1].module, PathBuf::from("b.wasm"));
    }
}
