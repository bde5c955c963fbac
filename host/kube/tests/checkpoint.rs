//! The state Lease: checkpoints round-trip, and a stale leader is fenced.
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_core::index::ObjectIndex;
use wasmwatch_core::{ObjectKind, Scope};
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore, Log, StreamIndex};
use wasmwatch_kube::elector::Term;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

fn term(holder: &str, transitions: i32) -> Term {
    Term {
        holder: holder.into(),
        transitions,
        lease_uid: String::new(),
    }
}

/// A store whose segments hold at most 8 KiB (packed): a few thousand
/// objects make an index of several.
fn store(server: &ServerHandle, t: Term) -> CheckpointStore {
    CheckpointStore::new(
        server.client().unwrap(),
        "default",
        "wasmwatch-state",
        "wasmwatch-leader",
        t,
    )
    .segment_bytes(8 * 1024)
}

/// Creates the leader Lease and returns its UID.
async fn leader_lease(server: &ServerHandle) -> String {
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-leader"},
        "spec": {"holderIdentity": "x"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &lease)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// Writes one annotation of the state Lease, as another writer would.
async fn set_state_annotation(server: &ServerHandle, key: &str, value: &str) {
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let mut lease = api.get("wasmwatch-state").await.unwrap();
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    api.replace("wasmwatch-state", &PostParams::default(), &lease)
        .await
        .unwrap();
}

fn annotation(server: &ServerHandle, key: &str) -> serde_json::Value {
    server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-state")
        .unwrap()["metadata"]["annotations"][key]
        .clone()
}

#[tokio::test]
async fn checkpoints_round_trip_through_the_state_lease() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 0));
    let claimed = a.claim().await.unwrap();
    assert!(claimed.indexes.is_empty());
    let mut cps = claimed.checkpoints;
    assert_eq!(cps, Default::default(), "first use creates an empty state");
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("prod"), "456");
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("default"), "123");
    cps.set(ObjectKind::Secret, &Scope::from_key("default"), "120");
    a.save(&cps, &[]).await.unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default=123,prod=456"
    );
    assert_eq!(
        annotation(&server, "wasmwatch.io/secret-resource-version"),
        "default=120"
    );
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-a/0");
    // Batched writes: saving again advances in place.
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("prod"), "500");
    a.save(&cps, &[]).await.unwrap();
    // The next leader reads exactly that back.
    let mut b = store(&server, term("pod-b", 1));
    let read = b.claim().await.unwrap().checkpoints;
    assert_eq!(
        read.get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
        Some("500")
    );
    assert_eq!(
        read.get(ObjectKind::ConfigMap, &Scope::from_key("default")),
        Some("123")
    );
    assert_eq!(
        read.get(ObjectKind::Secret, &Scope::from_key("default")),
        Some("120")
    );
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-b/1");
}

#[tokio::test]
async fn a_leader_lease_created_again_starts_a_new_line_of_terms() {
    // Terms counted on the first leader Lease reached 5; then the Lease was
    // deleted and created again, and its transitions count restarts at 0.
    let server = Server::start(Config::default()).await.unwrap();
    let first = leader_lease(&server).await;
    let on = |holder: &str, transitions: i32, uid: &str| Term {
        lease_uid: uid.to_string(),
        ..term(holder, transitions)
    };
    let mut old = store(&server, on("pod-a", 5, &first));
    let mut cps = old.claim().await.unwrap().checkpoints;
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("default"), "10");
    old.save(&cps, &[]).await.unwrap();

    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    api.delete("wasmwatch-leader", &DeleteParams::default())
        .await
        .unwrap();
    let second = leader_lease(&server).await;
    assert_ne!(first, second);

    // The leader of the new Lease claims despite the lower count, and keeps
    // the checkpoints.
    let mut new = store(&server, on("pod-b", 0, &second));
    let claimed = new.claim().await.unwrap();
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::ConfigMap, &Scope::from_key("default")),
        Some("10")
    );
    // The term keeps its old form (older binaries read it); the UID is apart.
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-b/0");
    assert_eq!(annotation(&server, "wasmwatch.io/term-lease-uid"), second);
    // The leader of the old Lease is fenced, writing or claiming.
    let err = old.save(&cps, &[]).await.unwrap_err();
    assert!(matches!(err, CheckpointError::Conflict(_)), "{err}");
    let err = store(&server, on("pod-a", 6, &first))
        .claim()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no longer the one"), "{err}");
    // Within one Lease, counts still decide.
    store(&server, on("pod-c", 1, &second))
        .claim()
        .await
        .unwrap();
    let err = store(&server, on("pod-b", 0, &second))
        .claim()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pod-c/1"), "{err}");
}

#[tokio::test]
async fn a_stale_leader_cannot_write_after_a_successor_claimed() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut old = store(&server, term("pod-a", 3));
    let mut cps = old.claim().await.unwrap().checkpoints;
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("default"), "10");
    old.save(&cps, &[]).await.unwrap();

    let mut new = store(&server, term("pod-b", 4));
    new.claim().await.unwrap();

    // The old leader wakes up and tries to checkpoint further.
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("default"), "99");
    let err = old.save(&cps, &[]).await.unwrap_err();
    assert!(matches!(err, CheckpointError::Conflict(_)), "{err}");
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default=10"
    );
    // Nor can it claim again: the stored term is newer.
    let err = store(&server, term("pod-a", 3)).claim().await.unwrap_err();
    assert!(err.to_string().contains("pod-b/4"), "{err}");
}

async fn state_lease_with(server: &ServerHandle, annotations: serde_json::Value) {
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-state", "annotations": annotations}
    }))
    .unwrap();
    api.create(&PostParams::default(), &lease).await.unwrap();
}

#[tokio::test]
async fn unreadable_checkpoints_are_reported_and_kept_until_that_kind_is_saved() {
    let server = Server::start(Config::default()).await.unwrap();
    state_lease_with(
        &server,
        serde_json::json!({
            "wasmwatch.io/configmap-resource-version": "prod=7,default",
            "wasmwatch.io/secret-resource-version": "default=5",
        }),
    )
    .await;
    let mut a = store(&server, term("pod-a", 1));
    let claimed = a.claim().await.unwrap();
    // The ConfigMaps' checkpoints are all dropped (not just the bad entry);
    // the Secrets' stay.
    assert_eq!(
        claimed
            .unreadable
            .get(&ObjectKind::ConfigMap)
            .map(String::as_str),
        Some(
            "wasmwatch.io/configmap-resource-version: invalid entry \"default\", expected namespace=resourceVersion; every ConfigMap is delivered once"
        )
    );
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
        None
    );
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::Secret, &Scope::from_key("default")),
        Some("5")
    );
    assert_eq!(claimed.problems().len(), 1);
    // The claim wrote the term and left the unreadable value.
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-a/1");
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "prod=7,default"
    );

    // A save without ConfigMap checkpoints (their streams are still
    // delivering) leaves it: a successor must deliver everything again.
    let mut cps = claimed.checkpoints.clone();
    cps.set(ObjectKind::Secret, &Scope::from_key("default"), "9");
    a.save(&cps, &[]).await.unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "prod=7,default"
    );
    assert_eq!(
        annotation(&server, "wasmwatch.io/secret-resource-version"),
        "default=9"
    );
    let b = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert!(b.unreadable.contains_key(&ObjectKind::ConfigMap));

    // Once saved with ConfigMap checkpoints, the value is replaced and the
    // next leader resumes from it.
    let mut c = store(&server, term("pod-c", 3));
    c.claim().await.unwrap();
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("default"), "20");
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("prod"), "21");
    c.save(&cps, &[]).await.unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default=20,prod=21"
    );
    // And a later save without them removes them as usual.
    c.save(&Default::default(), &[]).await.unwrap();
    assert!(annotation(&server, "wasmwatch.io/configmap-resource-version").is_null());
    let d = store(&server, term("pod-d", 4)).claim().await.unwrap();
    assert!(d.unreadable.is_empty(), "{:?}", d.problems());
}

#[tokio::test]
async fn an_unreadable_term_shard_count_or_index_is_set_aside() {
    let server = Server::start(Config::default()).await.unwrap();
    state_lease_with(
        &server,
        serde_json::json!({
            "wasmwatch.io/term": "garbage",
            "wasmwatch.io/configmap-resource-version": "default=5",
            "wasmwatch.io/configmap-index-shards": "many",
            "wasmwatch.io/secret-index-shards": "1",
        }),
    )
    .await;
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let shard: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-state-index-secret-0",
                     "annotations": {"wasmwatch.io/index": "not an index line\n"}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &shard).await.unwrap();

    // The stored term cannot be compared: the leader Lease decides. Not
    // held by the claimer as taken for its term: fenced, nothing written.
    let leader: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-leader"},
        "spec": {"holderIdentity": "pod-a", "leaseTransitions": 1}
    }))
    .unwrap();
    api.create(&PostParams::default(), &leader).await.unwrap();
    let err = store(&server, term("pod-a", 0)).claim().await.unwrap_err();
    assert!(matches!(err, CheckpointError::NotHolder(_)), "{err}");
    let err = store(&server, term("pod-b", 1)).claim().await.unwrap_err();
    assert!(matches!(err, CheckpointError::NotHolder(_)), "{err}");
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "garbage");

    let mut a = store(&server, term("pod-a", 1));
    let claimed = a.claim().await.unwrap();
    assert!(claimed.unreadable.is_empty());
    assert!(claimed.indexes.is_empty());
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::ConfigMap, &Scope::from_key("default")),
        Some("5")
    );
    let problems = claimed.problems();
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].starts_with("wasmwatch.io/term: cannot read \"garbage\""),
        "{problems:?}"
    );
    assert_eq!(
        problems[1],
        "wasmwatch.io/configmap-index-shards: \"many\" is not a shard count; the ConfigMap index is not used"
    );
    assert!(
        problems[2].starts_with("index Lease wasmwatch-state-index-secret-0: "),
        "{problems:?}"
    );
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-a/1");
    // The next save of each kind drops the set-aside shard count (and the
    // shards): beside the log it names, a claim would take the count for
    // one a version before segments wrote after a rollback, newer than
    // the log.
    let configmaps = shop(10, 0);
    let secrets = ObjectIndex::decode(ObjectKind::Secret, &configmaps.encode()).unwrap();
    let streams = [
        (ObjectKind::ConfigMap, &configmaps),
        (ObjectKind::Secret, &secrets),
    ]
    .map(|(kind, index)| StreamIndex {
        kind,
        scope: Scope::from_key("shop"),
        index: index.clone(),
        at: None,
    });
    a.save(&claimed.checkpoints, &streams).await.unwrap();
    for kind in ["configmap", "secret"] {
        assert!(annotation(&server, &format!("wasmwatch.io/{kind}-index-shards")).is_null());
    }
    assert!(
        api.get_opt("wasmwatch-state-index-secret-0")
            .await
            .unwrap()
            .is_none(),
        "the set-aside shard is deleted"
    );
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.problems(), Vec::<String>::new());
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], configmaps);
    assert_eq!(claimed.indexes[&ObjectKind::Secret], secrets);
}

/// The segment Leases the state Lease names, in order.
fn named_segments(server: &ServerHandle) -> Vec<String> {
    let log = annotation(server, "wasmwatch.io/index-log");
    let log = Log::parse(log.as_str().expect("a log annotation")).unwrap();
    log.segments
        .iter()
        .map(|n| format!("wasmwatch-state-segment-{n}"))
        .collect()
}

/// Every write to a Lease so far, as `verb name` (a create's request names
/// no Lease: `create `).
fn lease_writes(server: &ServerHandle) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases" && r.is_write())
        .map(|r| format!("{} {}", r.verb, r.name.unwrap_or_default()))
        .collect()
}

/// The segments the state Lease names (sorted), once they are all the
/// index Leases left: `what` says what a leftover would be.
async fn only_named_segments_left(server: &ServerHandle, what: &str) -> Vec<String> {
    let mut named = named_segments(server);
    named.sort();
    assert_eq!(index_leases(server).await, named, "{what}");
    named
}

fn segment_text(server: &ServerHandle, name: &str) -> String {
    server
        .get("leases.coordination.k8s.io", "default", name)
        .unwrap_or_else(|| panic!("{name} is missing"))["metadata"]["annotations"]
        ["wasmwatch.io/index"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Every Lease of the store but the state Lease.
async fn index_leases(server: &ServerHandle) -> Vec<String> {
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let mut names: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .filter(|n| n.starts_with("wasmwatch-state-"))
        .collect();
    names.sort();
    names
}

/// `n` ConfigMaps `shop/cm-<i>`, the digest of each `i + bump`.
fn shop(n: u128, bump: u128) -> ObjectIndex {
    let lines: Vec<(String, u128)> = (0..n).map(|i| (format!("shop/cm-{i}"), i + bump)).collect();
    index(
        &lines
            .iter()
            .map(|(a, b)| (a.as_str(), *b))
            .collect::<Vec<_>>(),
    )
}

/// `n` Secrets `vault/s-<i>`, the digest of each `i + bump`.
fn vault(n: u128, bump: u128) -> ObjectIndex {
    let text = shop(n, bump).encode().replace("shop/cm-", "vault/s-");
    ObjectIndex::decode(ObjectKind::Secret, &text).unwrap()
}

/// `a` with `b`'s entries put in.
fn with(mut a: ObjectIndex, b: &ObjectIndex) -> ObjectIndex {
    a.extend(b);
    a
}

/// `ix` as the index of the ConfigMaps of namespace `shop`.
fn shop_stream(ix: ObjectIndex) -> StreamIndex {
    StreamIndex {
        kind: ObjectKind::ConfigMap,
        scope: Scope::from_key("shop"),
        index: ix,
        at: None,
    }
}

fn index(lines: &[(&str, u128)]) -> ObjectIndex {
    let text: String = lines
        .iter()
        // Scrambled, so that the lines pack as real digests do.
        .map(|(id, digest)| {
            let d = digest.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            format!("{id} {d:032x} {:016x} k={:016x}\n", 7, 9)
        })
        .collect();
    ObjectIndex::decode(ObjectKind::ConfigMap, &text).unwrap()
}

#[tokio::test]
async fn the_object_index_is_stored_in_shards_and_claimed_by_the_next_leader() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    // Two streams (namespaces) of ConfigMaps, 3,000 objects each: several shards.
    let shop: Vec<(String, u128)> = (0..3000).map(|i| (format!("shop/cm-{i}"), i)).collect();
    let prod: Vec<(String, u128)> = (0..3000).map(|i| (format!("prod/cm-{i}"), i + 1)).collect();
    let as_ref =
        |v: &[(String, u128)]| index(&v.iter().map(|(a, b)| (a.as_str(), *b)).collect::<Vec<_>>());
    let (shop_ix, prod_ix) = (as_ref(&shop), as_ref(&prod));
    a.save(
        &cps,
        &[
            shop_stream(shop_ix.clone()),
            StreamIndex {
                kind: ObjectKind::ConfigMap,
                scope: Scope::from_key("prod"),
                index: prod_ix.clone(),
                at: None,
            },
        ],
    )
    .await
    .unwrap();
    let segments = named_segments(&server);
    assert!(segments.len() >= 2, "{segments:?} for 6,000 objects");
    for name in &segments {
        let text = segment_text(&server, name).len();
        assert!(text <= 8 * 1024, "{name}: {text} bytes");
    }

    // Only one stream's index moves on: the other namespace's part stays.
    let mut shop2 = shop_ix.clone();
    shop2.extend(&index(&[("shop/new", 42)]));
    a.save(&cps, &[shop_stream(shop2.clone())]).await.unwrap();

    let mut b = store(&server, term("pod-b", 2));
    let claimed = b.claim().await.unwrap();
    let got = &claimed.indexes[&ObjectKind::ConfigMap];
    assert_eq!(got.len(), 6001);
    assert_eq!(got.part(&Scope::from_key("shop")), shop2);
    assert_eq!(got.part(&Scope::from_key("prod")), prod_ix);

    // The next leader stores only one stream: the claimed part of the other stays.
    let mut prod2 = prod_ix.clone();
    prod2.retain_namespaces(|_| false);
    b.save(
        &claimed.checkpoints,
        &[StreamIndex {
            kind: ObjectKind::ConfigMap,
            scope: Scope::from_key("prod"),
            index: prod2,
            at: None,
        }],
    )
    .await
    .unwrap();
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    let got = &claimed.indexes[&ObjectKind::ConfigMap];
    assert_eq!(got.part(&Scope::from_key("shop")), shop2);
    assert!(got.part(&Scope::from_key("prod")).is_empty());
}

/// An object with thousands of keys has an entry too long for a segment
/// (200 KiB): it is stored without its key hashes, so the next leader
/// still knows it, with its digests (a deletion in a gap past the history
/// is found, an unchanged object stays quiet). The whole entry once
/// became the object's removal, and such a deletion was lost.
#[tokio::test]
async fn an_entry_too_long_for_a_segment_is_stored_shortened_and_its_object_stays_known() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    let keys: Vec<String> = (0..12_000)
        .map(|i| format!("key-{i:05}={i:016x}"))
        .collect();
    let small = format!("shop/small {:016x} {:016x} k={:016x}\n", 3, 4, 5);
    let text = format!("shop/big {:016x} {:016x} {}\n{small}", 1, 2, keys.join(";"));
    assert!(text.len() > 200 * 1024, "{} bytes", text.len());
    let ix = ObjectIndex::decode(ObjectKind::ConfigMap, &text).unwrap();
    a.save(&cps, &[shop_stream(ix)]).await.unwrap();
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    let got = &claimed.indexes[&ObjectKind::ConfigMap];
    let shortened = format!("shop/big {:016x} {:016x} \n{small}", 1, 2);
    assert_eq!(
        got.part(&Scope::from_key("shop")),
        ObjectIndex::decode(ObjectKind::ConfigMap, &shortened).unwrap()
    );
}

/// A leader paused in the middle of a save (after its fence check) wakes
/// after a successor claimed the state and stored an index with Y. Its
/// shard write came before its state write: it used to replace the shard
/// (read fresh, so not a conflict) with its own older index, and only then
/// fail at the state Lease, leaving the successor a stored index behind its
/// checkpoint. Now the shard's stamp of the newer term stops it first.
#[tokio::test]
async fn a_paused_leader_cannot_overwrite_the_index_shards_of_its_successor() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut old = store(&server, term("pod-a", 3));
    let cps = old.claim().await.unwrap().checkpoints;
    old.save(&cps, &[shop_stream(index(&[("shop/x", 1)]))])
        .await
        .unwrap();

    let mut new = store(&server, term("pod-b", 4));
    let cps_b = new.claim().await.unwrap().checkpoints;
    let with_y = index(&[("shop/x", 1), ("shop/y", 2)]);
    new.save(&cps_b, &[shop_stream(with_y.clone())])
        .await
        .unwrap();

    let err = old
        .save(&cps, &[shop_stream(index(&[("shop/x", 5)]))])
        .await
        .unwrap_err();
    assert!(err.is_fenced(), "{err}");
    let claimed = store(&server, term("pod-c", 5)).claim().await.unwrap();
    assert_eq!(
        claimed.indexes[&ObjectKind::ConfigMap],
        with_y,
        "the successor's index stands"
    );
}

/// A save may store the indexes of some streams only (the others' were not
/// safe yet, or were being rebuilt). The next leader must not take a missing
/// part for an empty one: the state Lease says which scopes are covered.
#[tokio::test]
async fn the_next_leader_knows_which_scopes_the_stored_index_covers() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    a.save(&cps, &[shop_stream(index(&[("shop/x", 1)]))])
        .await
        .unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-index-scopes"),
        "shop"
    );
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    let cm = ObjectKind::ConfigMap;
    assert!(claimed.covers(cm, &Scope::from_key("shop")));
    assert!(
        !claimed.covers(cm, &Scope::from_key("prod")),
        "prod has no part"
    );
    assert!(!claimed.covers(cm, &Scope::All));
    assert!(!claimed.covers(ObjectKind::Secret, &Scope::from_key("shop")));
}

/// Issue 32: a save writes what changed since the last one, not the whole
/// index (at 30k objects every save rewrote 35 shards of 200 KiB). A small
/// difference goes into the state Lease's tail: one write, no segment.
#[tokio::test]
async fn a_save_writes_what_changed_not_the_whole_index() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    let lines: Vec<(String, u128)> = (0..6000).map(|i| (format!("shop/cm-{i}"), i)).collect();
    let ix = |bump: &dyn Fn(usize) -> u128| {
        index(
            &lines
                .iter()
                .enumerate()
                .map(|(i, (a, b))| (a.as_str(), *b + bump(i)))
                .collect::<Vec<_>>(),
        )
    };
    a.save(&cps, &[shop_stream(ix(&|_| 0))]).await.unwrap();
    let before = lease_writes(&server).len();
    a.save(&cps, &[shop_stream(ix(&|_| 0))]).await.unwrap();
    assert_eq!(
        lease_writes(&server)[before..],
        ["update wasmwatch-state"],
        "unchanged: the state Lease only"
    );
    let before = lease_writes(&server).len();
    a.save(&cps, &[shop_stream(ix(&|i| (i == 7) as u128))])
        .await
        .unwrap();
    assert_eq!(lease_writes(&server)[before..], ["update wasmwatch-state"]);
    let tail = annotation(&server, "wasmwatch.io/index-tail");
    let tail = wasmwatch_kube::checkpoint::unpack(tail.as_str().unwrap())
        .unwrap()
        .into_owned();
    assert!(
        tail.starts_with("#ConfigMap\nshop/cm-7 ") && tail.lines().count() == 2,
        "{tail}"
    );
    // Every object changed: the difference is written as new segments,
    // then the state Lease names them.
    let before = lease_writes(&server).len();
    a.save(&cps, &[shop_stream(ix(&|_| 1))]).await.unwrap();
    let after = &lease_writes(&server)[before..];
    let commit = after
        .iter()
        .position(|w| w == "update wasmwatch-state")
        .expect("a commit");
    assert!(
        after[..commit].iter().all(|w| w.starts_with("create "))
            && after[commit + 1..]
                .iter()
                .all(|w| w.starts_with("delete wasmwatch-state-segment-")),
        "new segments, the commit, then the deletes of what it no longer names: {after:?}"
    );
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], ix(&|_| 1));
}

/// Once the segments written since the last full rewrite outweigh it, a
/// save rewrites the whole index, and the segments it no longer names are
/// deleted after the commit.
#[tokio::test]
async fn a_full_rewrite_deletes_the_segments_it_replaces() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    let ix = |bump: u128| shop(3000, bump);
    a.save(&cps, &[shop_stream(ix(0))]).await.unwrap();
    let first = named_segments(&server);
    let mut seen = first.clone();
    for bump in 1..=4 {
        a.save(&cps, &[shop_stream(ix(bump))]).await.unwrap();
        seen.extend(named_segments(&server));
    }
    let now = named_segments(&server);
    assert!(
        !now.iter().any(|n| first.contains(n)),
        "rewritten: {first:?} then {now:?}"
    );
    let log = Log::parse(
        annotation(&server, "wasmwatch.io/index-log")
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(log.bytes <= 2 * log.base + 300 * 1024, "{log:?}");
    only_named_segments_left(&server, "only the named segments are left").await;
    // Deleted after the commit that dropped them: the next commit no
    // longer lists them as garbage.
    a.save(&cps, &[]).await.unwrap();
    assert!(annotation(&server, "wasmwatch.io/index-garbage").is_null());
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], ix(4));
}

/// Upgrade: an index stored by a version before segments (shards counted
/// in the state Lease) is read, and the next save rewrites it as segments
/// and deletes the shards, so the next leader reads the same index.
#[tokio::test]
async fn an_index_in_shards_of_the_format_before_segments_is_read_and_rewritten() {
    let server = Server::start(Config::default()).await.unwrap();
    let old = shop(3000, 0);
    let shards = wasmwatch_kube::checkpoint::split_shards(&old.encode(), 100 * 1024);
    assert!(shards.len() >= 2);
    state_lease_with(
        &server,
        serde_json::json!({
            "wasmwatch.io/term": "pod-a/1",
            "wasmwatch.io/configmap-resource-version": "shop=5",
            "wasmwatch.io/configmap-index-shards": shards.len().to_string(),
            "wasmwatch.io/configmap-index-scopes": "shop",
        }),
    )
    .await;
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    for (n, text) in shards.iter().enumerate() {
        let shard: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("wasmwatch-state-index-configmap-{n}"),
                         "annotations": {"wasmwatch.io/index": text}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &shard).await.unwrap();
    }
    let mut b = store(&server, term("pod-b", 2));
    let claimed = b.claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], old);
    assert!(claimed.covers(ObjectKind::ConfigMap, &Scope::from_key("shop")));
    // Nothing else changed: the save still rewrites it, as segments.
    b.save(&claimed.checkpoints, &[]).await.unwrap();
    assert!(annotation(&server, "wasmwatch.io/configmap-index-shards").is_null());
    only_named_segments_left(&server, "the shards are deleted").await;
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], old);
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::ConfigMap, &Scope::from_key("shop")),
        Some("5")
    );
}

/// Rollback and back: this version stores segments, a version before
/// segments then leads (it keeps the annotations it does not know, so the
/// stale log stays beside its shard count), then this version leads again.
/// It must read the shards, the newer index, not the log: the log misses
/// what was created under the old version, whose deletion in a gap past
/// the history would be lost. The stale segments are deleted.
#[tokio::test]
async fn after_a_rollback_and_back_the_shards_of_the_old_version_win_over_the_stale_log() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let mut cps = a.claim().await.unwrap().checkpoints;
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("shop"), "5");
    a.save(&cps, &[shop_stream(shop(3000, 0))]).await.unwrap();
    let stale = named_segments(&server);
    assert!(stale.len() >= 2, "{stale:?}");
    // The version before segments (ae9dce3^) claims and saves: it reads
    // the state Lease, sets its term, checkpoints and shard count in the
    // annotations it read, replaces the Lease, and writes its shards.
    let newer = shop(3100, 1);
    let shards = wasmwatch_kube::checkpoint::split_shards(&newer.encode(), 100 * 1024);
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let mut lease = api.get("wasmwatch-state").await.unwrap();
    let annotations = lease.metadata.annotations.as_mut().unwrap();
    for (k, v) in [
        ("wasmwatch.io/term", "pod-b/2".to_string()),
        ("wasmwatch.io/configmap-resource-version", "shop=9".into()),
        (
            "wasmwatch.io/configmap-index-shards",
            shards.len().to_string(),
        ),
    ] {
        annotations.insert(k.into(), v);
    }
    api.replace("wasmwatch-state", &PostParams::default(), &lease)
        .await
        .unwrap();
    for (n, text) in shards.iter().enumerate() {
        let shard: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("wasmwatch-state-index-configmap-{n}"),
                         "annotations": {"wasmwatch.io/index": text,
                                         "wasmwatch.io/term": "pod-b/2"}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &shard).await.unwrap();
    }
    // This version again.
    let mut c = store(&server, term("pod-c", 3));
    let claimed = c.claim().await.unwrap();
    let read = &claimed.indexes[&ObjectKind::ConfigMap];
    assert!(
        *read == newer,
        "read {} objects, the shards hold {} (the stale log 3000)",
        read.len(),
        newer.len()
    );
    assert_eq!(
        claimed
            .checkpoints
            .get(ObjectKind::ConfigMap, &Scope::from_key("shop")),
        Some("9")
    );
    the_stale_log_goes_with_the_next_save(&server, c, claimed, &stale, &newer).await;
}

/// After a claim found an older version's index beside this version's
/// (stale) log: the log is dropped at the claim, the next save deletes
/// its segments and the older version's Leases, and the next leader reads
/// `newer`.
async fn the_stale_log_goes_with_the_next_save(
    server: &ServerHandle,
    mut store_c: CheckpointStore,
    claimed: wasmwatch_kube::checkpoint::Claimed,
    stale: &[String],
    newer: &ObjectIndex,
) {
    assert!(
        annotation(server, "wasmwatch.io/index-log").is_null(),
        "the stale log is dropped at the claim"
    );
    store_c.save(&claimed.checkpoints, &[]).await.unwrap();
    let segments = only_named_segments_left(
        server,
        "the stale segments and the older Leases are deleted",
    )
    .await;
    assert!(
        !segments.iter().any(|n| stale.contains(n)),
        "{stale:?} then {segments:?}"
    );
    let claimed = store(server, term("pod-d", 4)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], *newer);
}

/// Issue 32: a save commits all or nothing. A save that rewrites an index
/// of several segments (new segments, the state Lease, then deletes) is
/// failed at each of its requests in turn, each way a request can fail
/// (403, 409, 500, a connection dropped before the write, and after it);
/// the next leader then reads the previous state or the new one, whole,
/// with its own checkpoints, and nothing else is left behind.
#[tokio::test]
async fn a_save_failing_at_any_of_its_requests_leaves_the_old_state_or_the_new_one_whole() {
    use wasmwatch_apiserver::{FaultAnswer, RequestFault};
    let ix = |bump: u128, n: u128| shop(n, bump);
    // The new index changes every object and adds a third more: more than
    // the stored base, so its save rewrites the whole index.
    let (old, new) = (ix(1, 6000), ix(2, 8000));
    let stream = |ix: &ObjectIndex| shop_stream(ix.clone());
    let cps = |rv: &str| {
        let mut c = wasmwatch_kube::checkpoint::Checkpoints::default();
        c.set(ObjectKind::ConfigMap, &Scope::from_key("shop"), rv);
        c
    };
    // Three saves of every object: the third rewrites the whole index
    // (creates, the commit, then deletes of the segments it replaces).
    let prepared = || async {
        let server = Server::start(Config::default()).await.unwrap();
        let mut a = store(&server, term("pod-a", 1)).segment_bytes(32 * 1024);
        a.claim().await.unwrap();
        a.save(&cps("10"), &[stream(&ix(0, 6000))]).await.unwrap();
        a.save(&cps("20"), &[stream(&old)]).await.unwrap();
        (server, a)
    };
    // Only the store touches Leases here (a create's name is in its body,
    // not its path: the fault matches it there).
    let (server, mut a) = prepared().await;
    let before = server.requests().len();
    a.save(&cps("30"), &[stream(&new)]).await.unwrap();
    let verbs: Vec<String> = server.requests()[before..]
        .iter()
        .filter(|r| r.resource == "leases")
        .map(|r| r.verb.clone())
        .collect();
    assert!(
        verbs.iter().filter(|v| *v == "create").count() >= 2 && verbs.iter().any(|v| v == "delete"),
        "a rewrite of several segments: {verbs:?}"
    );

    let answers = [
        FaultAnswer::Status(403),
        FaultAnswer::Status(409),
        FaultAnswer::Status(500),
        FaultAnswer::Drop,
        FaultAnswer::DropAfter,
    ];
    let mut outcomes = Vec::new();
    for (k, verb) in verbs.iter().enumerate() {
        for answer in answers {
            let (server, mut a) = prepared().await;
            server.faults().fail_nth(RequestFault {
                verb: None,
                resource: "leases".into(),
                namespace: Some("default".into()),
                name_prefix: Some("wasmwatch-state".into()),
                skip: k as u32,
                answer,
            });
            let result = a.save(&cps("30"), &[stream(&new)]).await;
            assert_eq!(
                server.faults().request_faults_left(),
                0,
                "request {k} failed"
            );
            let mut b = store(&server, term("pod-b", 2));
            let claimed = b.claim().await.unwrap();
            let got = &claimed.indexes[&ObjectKind::ConfigMap];
            let rv = claimed
                .checkpoints
                .get(ObjectKind::ConfigMap, &Scope::from_key("shop"))
                .unwrap()
                .to_string();
            let which = if *got == new {
                "new"
            } else if *got == old {
                "old"
            } else {
                panic!("request {k} ({verb}) answered {answer:?}: a torn index");
            };
            assert_eq!(
                (which, rv.as_str()),
                (which, if which == "new" { "30" } else { "20" }),
                "request {k} answered {answer:?}: the index and the checkpoints commit together"
            );
            // The state Lease's write is the commit: before it the old
            // state stands and the save failed; after it the new one
            // stands, whatever the client heard.
            outcomes.push(format!("{k} {verb} {answer:?}: {which} {}", result.is_ok()));
            // Nothing is left but what the successor's state names (once
            // its first save collected what the old one had not).
            b.save(&claimed.checkpoints, &[]).await.unwrap();
            let leftovers = format!("request {k} answered {answer:?}: leftovers");
            only_named_segments_left(&server, &leftovers).await;
        }
    }
    eprintln!("{}", outcomes.join("\n"));
}

/// A save that failed is retried by the same term with segment numbers
/// after the ones the failed attempt created (meeting them would cost three
/// more requests each), and the commit of the retry lists them for
/// deletion: nothing is left behind.
#[tokio::test]
async fn a_failed_save_is_retried_past_what_it_created_and_that_is_deleted() {
    use wasmwatch_apiserver::{FaultAnswer, RequestFault};
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    let ix = shop(6000, 0);
    server.faults().fail_nth(RequestFault {
        verb: Some("update".into()),
        resource: "leases".into(),
        namespace: Some("default".into()),
        name_prefix: Some("wasmwatch-state".into()),
        skip: 0,
        answer: FaultAnswer::Status(500),
    });
    let stream = shop_stream(ix.clone());
    let err = a.save(&cps, &[stream]).await.unwrap_err();
    assert!(!err.is_fenced(), "{err}");
    assert!(annotation(&server, "wasmwatch.io/index-log").is_null());
    let orphans = index_leases(&server).await;
    assert!(orphans.len() >= 2, "{orphans:?}");
    // Retried with nothing new: the index the failed save had is kept.
    a.save(&cps, &[]).await.unwrap();
    let mut named = named_segments(&server);
    named.sort();
    assert_eq!(named.len(), orphans.len(), "{named:?}");
    assert!(
        named.iter().all(|n| !orphans.contains(n)),
        "new numbers: {named:?} after {orphans:?}"
    );
    assert_eq!(
        index_leases(&server).await,
        named,
        "the orphans are deleted"
    );
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], ix);
}

/// The state write landed but its answer was lost (the connection dropped
/// after it): the store reads the Lease back, finds its own commit, and
/// neither fails the save nor conflicts with itself on the next one.
#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_found_and_the_term_goes_on() {
    use wasmwatch_apiserver::{FaultAnswer, RequestFault};
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let mut cps = a.claim().await.unwrap().checkpoints;
    let lost = |server: &ServerHandle, answer| {
        server.faults().fail_nth(RequestFault {
            verb: Some("update".into()),
            resource: "leases".into(),
            namespace: Some("default".into()),
            name_prefix: Some("wasmwatch-state".into()),
            skip: 0,
            answer,
        })
    };
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("shop"), "7");
    lost(&server, FaultAnswer::DropAfter);
    a.save(&cps, &[]).await.unwrap();
    // Not landed (dropped before): the save fails, the next one stores.
    cps.set(ObjectKind::ConfigMap, &Scope::from_key("shop"), "8");
    lost(&server, FaultAnswer::Drop);
    let err = a.save(&cps, &[]).await.unwrap_err();
    assert!(!err.is_fenced(), "{err}");
    a.save(&cps, &[]).await.unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "shop=8"
    );
}

/// A state Lease that names segments but not the next number (edited by
/// hand, say): numbering goes on after the segments named, so the claim's
/// sweep of uncommitted segments does not take a committed one for one.
#[tokio::test]
async fn segments_named_without_a_next_number_are_kept() {
    let server = Server::start(Config::default()).await.unwrap();
    let ix = shop(10, 0);
    state_lease_with(
        &server,
        serde_json::json!({
            "wasmwatch.io/term": "pod-a/1",
            "wasmwatch.io/configmap-index-log": "segments=0 bytes=10 base=10",
            "wasmwatch.io/configmap-index-scopes": "shop",
        }),
    )
    .await;
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let segment: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-state-segment-0",
                     "annotations": {"wasmwatch.io/index": ix.encode()}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &segment).await.unwrap();
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], ix);
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    assert_eq!(
        claimed.indexes.get(&ObjectKind::ConfigMap),
        Some(&ix),
        "{:?}",
        claimed.problems()
    );
}

/// Issue 32: a save of changes of both kinds writes one segment for both
/// (or none, while they fit the tail) and the state Lease: no tail or
/// segment per kind. With format 2's per-kind tails and segments, both
/// kinds churning cost 138 state bytes a change against 82 for one.
#[tokio::test]
async fn changes_of_both_kinds_go_into_one_tail_and_one_segment() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1)).segment_bytes(200 * 1024);
    let cps = a.claim().await.unwrap().checkpoints;
    let streams = |bump: u128, n: u128| {
        [
            shop_stream(with(shop(3000, 0), &shop(n, bump))),
            StreamIndex {
                kind: ObjectKind::Secret,
                scope: Scope::from_key("vault"),
                index: with(vault(3000, 0), &vault(n, bump)),
                at: None,
            },
        ]
    };
    a.save(&cps, &streams(0, 0)).await.unwrap();
    // A few changes of each: the tail, one write.
    let before = lease_writes(&server).len();
    a.save(&cps, &streams(1, 3)).await.unwrap();
    assert_eq!(lease_writes(&server)[before..], ["update wasmwatch-state"]);
    let tail = annotation(&server, "wasmwatch.io/index-tail");
    let tail = wasmwatch_kube::checkpoint::unpack(tail.as_str().unwrap())
        .unwrap()
        .into_owned();
    let kinds = [ObjectKind::ConfigMap, ObjectKind::Secret];
    let split = wasmwatch_kube::checkpoint::split_kinds(&tail, &kinds).unwrap();
    assert_eq!(split[&ObjectKind::ConfigMap].lines().count(), 3, "{tail}");
    assert_eq!(split[&ObjectKind::Secret].lines().count(), 3, "{tail}");
    // Many of each: one segment holds both, then the commit.
    let before = lease_writes(&server).len();
    a.save(&cps, &streams(2, 1000)).await.unwrap();
    let after = &lease_writes(&server)[before..];
    assert_eq!(after.len(), 2, "one segment and the commit: {after:?}");
    assert!(after[0].starts_with("create"), "{after:?}");
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    let [cms, secrets] = streams(2, 1000).map(|s| s.index);
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], cms);
    assert_eq!(claimed.indexes[&ObjectKind::Secret], secrets);
    assert!(claimed.covers(ObjectKind::Secret, &Scope::from_key("vault")));
}

/// Writes `index` as format 2 did (the version before one log for every
/// kind): segments of its own numbered from `first`, named by the kind's
/// log annotation, and `tail` in the kind's tail annotation. Keeps the
/// annotations found, as that version does.
async fn write_format_2(
    server: &ServerHandle,
    term: &str,
    index: &ObjectIndex,
    tail: &str,
    first: u64,
) -> Vec<String> {
    let kind = index.kind().as_str().to_ascii_lowercase();
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let parts = wasmwatch_kube::checkpoint::split_shards(&index.encode(), 100 * 1024);
    let mut names = Vec::new();
    for (i, text) in parts.iter().enumerate() {
        let name = format!("wasmwatch-state-segment-{}", first + i as u64);
        let segment: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name,
                         "annotations": {"wasmwatch.io/index": wasmwatch_kube::checkpoint::pack(text),
                                         "wasmwatch.io/term": term}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &segment).await.unwrap();
        names.push(name);
    }
    let last = first + parts.len() as u64 - 1;
    let mut lease = match api.get_opt("wasmwatch-state").await.unwrap() {
        Some(l) => l,
        None => {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "wasmwatch-state"}}))
                .unwrap()
        }
    };
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (k, v) in [
        ("wasmwatch.io/term".to_string(), term.to_string()),
        (
            format!("wasmwatch.io/{kind}-index-log"),
            format!("segments={first}-{last} bytes=1 base=1"),
        ),
        (
            format!("wasmwatch.io/{kind}-index-tail"),
            wasmwatch_kube::checkpoint::pack(tail),
        ),
        (
            format!("wasmwatch.io/{kind}-index-scopes"),
            "shop,vault".into(),
        ),
        (
            "wasmwatch.io/index-next-segment".into(),
            (last + 1).to_string(),
        ),
    ] {
        annotations.insert(k, v);
    }
    if lease.metadata.resource_version.is_some() {
        api.replace("wasmwatch-state", &PostParams::default(), &lease)
            .await
            .unwrap();
    } else {
        api.create(&PostParams::default(), &lease).await.unwrap();
    }
    names
}

/// Upgrade from format 2 (a log and a tail per kind): both kinds are read
/// with their tails, the next save rewrites them into the one log, and
/// the per-kind annotations and segments go.
#[tokio::test]
async fn an_index_of_a_log_per_kind_is_read_and_rewritten_into_one_log() {
    let server = Server::start(Config::default()).await.unwrap();
    let old = write_format_2(
        &server,
        "pod-a/1",
        &shop(3000, 0),
        "shop/extra 5 6 k=1\n",
        0,
    )
    .await;
    let old_secrets = write_format_2(&server, "pod-a/1", &vault(2000, 0), "", 10).await;
    let mut cms = shop(3000, 0);
    cms.apply_text("shop/extra 5 6 k=1\n").unwrap();
    let mut b = store(&server, term("pod-b", 2));
    let claimed = b.claim().await.unwrap();
    assert_eq!(claimed.problems(), Vec::<String>::new());
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], cms);
    assert_eq!(claimed.indexes[&ObjectKind::Secret], vault(2000, 0));
    b.save(&claimed.checkpoints, &[]).await.unwrap();
    for kind in ["configmap", "secret"] {
        assert!(annotation(&server, &format!("wasmwatch.io/{kind}-index-log")).is_null());
        assert!(annotation(&server, &format!("wasmwatch.io/{kind}-index-tail")).is_null());
    }
    let named = only_named_segments_left(&server, "format 2's segments are deleted").await;
    assert!(
        !named
            .iter()
            .any(|n| old.contains(n) || old_secrets.contains(n))
    );
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], cms);
    assert_eq!(claimed.indexes[&ObjectKind::Secret], vault(2000, 0));
}

/// Rollback to format 2 and back: format 2 keeps the log it does not know
/// and writes its own per-kind log at every save, while this version drops
/// those at every save. Both found: the per-kind log is the newer index
/// (it has what was created under the old version, whose deletion in a
/// gap past the history would otherwise be lost); the stale log's segments
/// are deleted.
#[tokio::test]
async fn after_a_rollback_to_a_log_per_kind_and_back_its_log_wins_over_the_stale_one() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    a.save(&cps, &[shop_stream(shop(3000, 0))]).await.unwrap();
    let stale = named_segments(&server);
    let next: u64 = annotation(&server, "wasmwatch.io/index-next-segment")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let newer = shop(3100, 1);
    write_format_2(&server, "pod-b/2", &newer, "", next).await;
    let mut c = store(&server, term("pod-c", 3));
    let claimed = c.claim().await.unwrap();
    assert!(
        claimed.indexes[&ObjectKind::ConfigMap] == newer,
        "read {} objects, the old version's log holds 3100 (the stale one 3000)",
        claimed.indexes[&ObjectKind::ConfigMap].len()
    );
    the_stale_log_goes_with_the_next_save(&server, c, claimed, &stale, &newer).await;
}

/// A per-kind log beside the log is an older version's, written after this
/// version's last commit, even when it cannot be read: the log (older
/// than that version's checkpoints) is not used either.
#[tokio::test]
async fn a_per_kind_log_beside_the_log_wins_even_when_it_cannot_be_read() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    a.save(&cps, &[shop_stream(shop(100, 0))]).await.unwrap();
    let next: u64 = annotation(&server, "wasmwatch.io/index-next-segment")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    write_format_2(&server, "pod-b/2", &shop(120, 1), "", next).await;
    set_state_annotation(&server, "wasmwatch.io/configmap-index-tail", "z1:!!").await;
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    assert!(
        !claimed.indexes.contains_key(&ObjectKind::ConfigMap),
        "the stale log was read: {:?}",
        claimed.problems()
    );
    assert!(annotation(&server, "wasmwatch.io/index-log").is_null());
}

/// Small changes make small segments in tier 0; a tier of more than
/// `Sizes::tier` segments is merged with the newer ones into one segment
/// of the next tier, of what changed since the oldest began (data changes
/// as patch lines), so a claim reads a bounded number of segments.
/// Successors that claim with tiers part full merge them as their writer
/// would have (the index before each tier is rebuilt at the claim), and
/// every claim reads exactly the index saved.
#[tokio::test]
async fn full_tiers_are_merged_and_successors_merge_the_tiers_they_found() {
    use wasmwatch_kube::checkpoint::Sizes;
    let server = Server::start(Config::default()).await.unwrap();
    let sizes = Sizes {
        segment: 32 * 1024,
        tail: 256,
        // The first save rewrites (a base), the rest stay under twice it.
        compact_floor: 0,
        tier: 3,
    };
    let mut digests: Vec<u128> = (0..3000).collect();
    let names: Vec<String> = (0..3000).map(|i| format!("shop/cm-{i}")).collect();
    let current = |d: &[u128]| {
        index(
            &names
                .iter()
                .zip(d)
                .map(|(n, d)| (n.as_str(), *d))
                .collect::<Vec<_>>(),
        )
    };
    // Save `i` changes 50 objects of its own.
    let change = |d: &mut Vec<u128>, i: usize| {
        for digest in &mut d[i * 50..i * 50 + 50] {
            *digest += 10_000 * i as u128;
        }
    };
    let log = || {
        Log::parse(
            annotation(&server, "wasmwatch.io/index-log")
                .as_str()
                .unwrap(),
        )
        .unwrap()
    };
    let tiers = || log().tiers.iter().map(|t| t.0).collect::<Vec<_>>();
    let mut a = store(&server, term("pod-a", 1)).sizes(sizes);
    let cps = a.claim().await.unwrap().checkpoints;
    a.save(&cps, &[shop_stream(current(&digests))])
        .await
        .unwrap();
    let base = log().segments;
    let mut seen = Vec::new();
    for i in 1..=5 {
        change(&mut digests, i);
        a.save(&cps, &[shop_stream(current(&digests))])
            .await
            .unwrap();
        seen.push(tiers());
    }
    assert_eq!(
        seen,
        [vec![1], vec![2], vec![3], vec![0, 1], vec![1, 1]],
        "the fourth save merged tier 0 into tier 1"
    );
    let merged = log().segments[base.len()];
    let text = segment_text(&server, &format!("wasmwatch-state-segment-{merged}"));
    let text = wasmwatch_kube::checkpoint::unpack(&text)
        .unwrap()
        .into_owned();
    assert_eq!(text.lines().count(), 1 + 4 * 50, "each object once: {text}");
    assert!(
        text.lines().skip(1).all(|l| l.contains(" + ")),
        "data changes as patch lines: {text}"
    );
    // Successors claim with tiers part full, and go on until their tiers
    // merge; each claim reads the index whole.
    let mut term_n = 2;
    let mut i = 5;
    for (until, expect) in [(17, vec![1, 0, 1]), (33, vec![1, 0, 2])] {
        let mut next = store(&server, term(&format!("pod-{term_n}"), term_n)).sizes(sizes);
        term_n += 1;
        let claimed = next.claim().await.unwrap();
        assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], current(&digests));
        while i < until {
            i += 1;
            change(&mut digests, i);
            next.save(&claimed.checkpoints, &[shop_stream(current(&digests))])
                .await
                .unwrap();
        }
        assert_eq!(tiers(), expect);
        assert_eq!(log().segments[..base.len()], base[..], "the base stays");
        only_named_segments_left(&server, "merged segments are deleted").await;
    }
    let claimed = store(&server, term("pod-last", term_n))
        .claim()
        .await
        .unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], current(&digests));
}

/// Issue 33: what a save says a successor may trust of the index (its
/// version per stream, the objects not handled) is committed with it,
/// carried over by a claim that commits nothing, and dropped once a
/// binary that does not know it (it stamps its term, keeps the annotation
/// as found) led in between.
#[tokio::test]
async fn the_index_trust_is_committed_with_it_and_dropped_after_another_binary_led() {
    use std::collections::BTreeSet;
    use wasmwatch_kube::checkpoint::{TRUST_ANNOTATION, Unhandled};
    let server = Server::start(Config::default()).await.unwrap();
    let (shop_scope, cm) = (Scope::from_key("shop"), ObjectKind::ConfigMap);
    let mut a = store(&server, term("pod-a", 1));
    let mut cps = a.claim().await.unwrap().checkpoints;
    cps.set(cm, &shop_scope, "90");
    let stuck = ("shop".to_string(), "cm-7".to_string());
    let unhandled: Unhandled = [(
        (cm, shop_scope.clone()),
        Some(BTreeSet::from([stuck.clone()])),
    )]
    .into();
    let part = StreamIndex {
        kind: cm,
        scope: shop_scope.clone(),
        index: shop(20, 0),
        at: Some("120".into()),
    };
    a.save_with(&cps, &[part], &unhandled).await.unwrap();
    // The next save writes no index: the stored part's version stays.
    a.save_with(&cps, &[], &unhandled).await.unwrap();
    assert_eq!(
        annotation(&server, TRUST_ANNOTATION),
        "term pod-a/1 \nconfigmap-at shop=120\nconfigmap-unhandled shop/cm-7\n"
    );
    let b = store(&server, term("pod-b", 2)).claim().await.unwrap();
    let trusted = b.trusted(cm, &shop_scope).expect("trusted");
    assert_eq!(
        (trusted.at, trusted.unhandled),
        (120, BTreeSet::from([stuck.clone()]))
    );
    assert_eq!(b.trusted(cm, &Scope::from_key("other")), None);
    assert_eq!(b.trusted(ObjectKind::Secret, &shop_scope), None);
    // pod-b claimed and committed nothing: pod-c trusts the same.
    let c = store(&server, term("pod-c", 3)).claim().await.unwrap();
    assert_eq!(c.trusted(cm, &shop_scope).map(|t| t.at), Some(120));
    // An older binary leads (its claim stamps its term, nothing else).
    set_state_annotation(&server, "wasmwatch.io/term", "pod-old/4").await;
    let d = store(&server, term("pod-d", 5)).claim().await.unwrap();
    assert!(d.trust.is_none(), "written under another term");
    assert!(d.indexes.contains_key(&cm), "the index itself is read");
    assert_eq!(
        annotation(&server, TRUST_ANNOTATION),
        serde_json::Value::Null
    );
    // A save without a version for the part trusts nothing of it.
    let mut d_store = store(&server, term("pod-d", 5));
    d_store.claim().await.unwrap();
    let part = StreamIndex {
        kind: cm,
        scope: shop_scope.clone(),
        index: shop(21, 0),
        at: None,
    };
    d_store.save_with(&cps, &[part], &unhandled).await.unwrap();
    assert_eq!(
        annotation(&server, TRUST_ANNOTATION),
        serde_json::Value::Null
    );
}
