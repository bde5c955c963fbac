//! A registry that misbehaves (tests/testkit's `FakeRegistry`, where the
//! real one cannot): a pull never follows a layer's `urls`, ends at its one
//! deadline however the registry stalls, reads bounded error bodies and
//! manifests, and shows what the registry said escaped on one line. And the
//! cache changes the mode only of folders it creates.
use std::time::{Duration, Instant};

use wasmwatch_oci::{
    MAX_MANIFEST_BYTES, ModuleRef, ModuleStore, OciError, Registry, RegistryOptions,
};
use wasmwatch_testkit::registry::{FakeRegistry, Misbehaviour, Witness};

/// Stands for a component: the pull checks digests, not contents.
const BLOB: &[u8] = b"\0asm\x0d\0\x01\0 not really a component";

fn options(registry: &FakeRegistry, pull_timeout: Duration) -> RegistryOptions {
    RegistryOptions {
        insecure: vec![registry.host()],
        pull_timeout,
        ..RegistryOptions::default()
    }
}

/// Pulls `plugins/x:1` from `registry`: the outcome and how long it took.
fn pull(registry: &FakeRegistry, pull_timeout: Duration) -> (Result<Vec<u8>, OciError>, Duration) {
    let client = Registry::new(options(registry, pull_timeout)).unwrap();
    let module = ModuleRef::parse(&registry.reference("plugins/x:1")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let result = runtime.block_on(client.pull(&module, &registry.sha256()));
    (result, started.elapsed())
}

#[test]
fn a_well_behaved_fake_registry_is_pulled_from() {
    let registry = FakeRegistry::start(Misbehaviour::None, BLOB.to_vec());
    let (result, _) = pull(&registry, Duration::from_secs(10));
    assert_eq!(result.unwrap(), BLOB);
}

#[test]
fn layer_urls_are_never_followed() {
    // The foreign URL would even serve the right bytes: still not asked.
    let witness = Witness::start(BLOB.to_vec());
    let registry = FakeRegistry::start(
        Misbehaviour::LayerUrls(vec![witness.url("/foreign")]),
        BLOB.to_vec(),
    );
    let (result, _) = pull(&registry, Duration::from_secs(10));
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("cannot fetch the component") && err.contains("404"),
        "{err}"
    );
    assert_eq!(
        witness.requests(),
        Vec::<String>::new(),
        "the foreign host was contacted"
    );
    assert!(
        registry
            .requests()
            .iter()
            .any(|r| r.contains("/blobs/sha256:")),
        "{:?}",
        registry.requests()
    );
}

#[test]
fn a_registry_that_dribbles_is_given_up_at_the_pull_timeout() {
    // One byte every 200 ms, each restarting any read timeout.
    let registry = FakeRegistry::start(
        Misbehaviour::DribbleManifest(Duration::from_millis(200)),
        BLOB.to_vec(),
    );
    let (result, took) = pull(&registry, Duration::from_secs(2));
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("did not deliver the component within 2s (--pull-timeout)"),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(registry.body_bytes_sent() > 3, "it was dribbling");
    eprintln!("dribbling registry: given up after {} ms", took.as_millis());
}

#[test]
fn a_registry_that_never_answers_is_given_up_at_the_pull_timeout() {
    let registry = FakeRegistry::start(Misbehaviour::Silent, BLOB.to_vec());
    let (result, took) = pull(&registry, Duration::from_secs(2));
    let err = result.unwrap_err().to_string();
    assert!(err.contains("within 2s (--pull-timeout)"), "{err}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    eprintln!("silent registry: given up after {} ms", took.as_millis());
}

#[test]
fn a_huge_error_body_is_read_bounded_and_shown_escaped_on_one_line() {
    let registry = FakeRegistry::start(Misbehaviour::HugeError(32 << 20), BLOB.to_vec());
    let (result, _) = pull(&registry, Duration::from_secs(10));
    let err = result.unwrap_err().to_string();
    assert!(!err.contains('\n') && !err.contains('\r'), "{err}");
    assert!(err.len() < 5 * 1024, "{} bytes", err.len());
    assert!(
        err.contains("500 Internal Server Error: oops\\n2026-01-01T00:00:00.000000Z ERROR wasmwatch: forged line 0"),
        "{err}"
    );
    assert!(err.contains("only the first 4096 bytes read"), "{err}");
    // Reading stopped: the rest of the 32 MiB never left the registry
    // (loopback buffers hold a few MiB).
    let sent = registry.body_bytes_sent();
    assert!(sent < 16 << 20, "{sent} bytes of the body were sent");
}

#[test]
fn a_huge_manifest_is_refused_while_reading() {
    for content_length in [true, false] {
        let registry = FakeRegistry::start(
            Misbehaviour::HugeManifest {
                bytes: 256 << 20,
                content_length,
            },
            BLOB.to_vec(),
        );
        let (result, took) = pull(&registry, Duration::from_secs(20));
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains(&format!("over the limit of {MAX_MANIFEST_BYTES}")),
            "{err}"
        );
        let sent = registry.body_bytes_sent();
        assert!(
            sent < 2 * MAX_MANIFEST_BYTES as u64 + (8 << 20),
            "content-length {content_length}: {sent} bytes were sent"
        );
        eprintln!(
            "256 MiB manifest (content-length: {content_length}): refused after {} ms, {sent} bytes sent",
            took.as_millis()
        );
    }
}

#[cfg(unix)]
#[test]
fn the_cache_folder_keeps_its_mode_only_new_folders_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = ModuleStore::new(&root);
    store.put(&"ab".repeat(32), b"\0asm").unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o755, "--cache-dir was changed");
    assert_eq!(mode(&root.join("oci")), 0o700);
    assert_eq!(mode(&root.join("oci/sha256")), 0o700);
}
