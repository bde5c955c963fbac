//! The state Lease: checkpoints round-trip, and a stale leader is fenced.
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_core::index::ObjectIndex;
use wasmwatch_core::{ObjectKind, Scope};
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore, StreamIndex};
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

fn store(server: &ServerHandle, t: Term) -> CheckpointStore {
    CheckpointStore::new(
        server.client().unwrap(),
        "default",
        "wasmwatch-state",
        "wasmwatch-leader",
        t,
    )
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

    let claimed = store(&server, term("pod-a", 1)).claim().await.unwrap();
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
}

fn index(lines: &[(&str, u128)]) -> ObjectIndex {
    let text: String = lines
        .iter()
        .map(|(id, digest)| format!("{id} {digest:032x} {:016x} k={:016x}\n", 7, 9))
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
            StreamIndex {
                kind: ObjectKind::ConfigMap,
                scope: Scope::from_key("shop"),
                index: shop_ix.clone(),
            },
            StreamIndex {
                kind: ObjectKind::ConfigMap,
                scope: Scope::from_key("prod"),
                index: prod_ix.clone(),
            },
        ],
    )
    .await
    .unwrap();
    let shards: usize = annotation(&server, "wasmwatch.io/configmap-index-shards")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(shards >= 2, "{shards} shards for 6,000 objects");
    for n in 0..shards {
        let lease = server
            .get(
                "leases.coordination.k8s.io",
                "default",
                &format!("wasmwatch-state-index-configmap-{n}"),
            )
            .unwrap();
        let text = lease["metadata"]["annotations"]["wasmwatch.io/index"]
            .as_str()
            .unwrap()
            .len();
        assert!(text <= 200 * 1024, "shard {n}: {text} bytes");
    }

    // Only one stream's index moves on: the other namespace's part stays.
    let mut shop2 = shop_ix.clone();
    shop2.extend(&index(&[("shop/new", 42)]));
    a.save(
        &cps,
        &[StreamIndex {
            kind: ObjectKind::ConfigMap,
            scope: Scope::from_key("shop"),
            index: shop2.clone(),
        }],
    )
    .await
    .unwrap();

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
        }],
    )
    .await
    .unwrap();
    let claimed = store(&server, term("pod-c", 3)).claim().await.unwrap();
    let got = &claimed.indexes[&ObjectKind::ConfigMap];
    assert_eq!(got.part(&Scope::from_key("shop")), shop2);
    assert!(got.part(&Scope::from_key("prod")).is_empty());
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
    let stream = |ix: ObjectIndex| StreamIndex {
        kind: ObjectKind::ConfigMap,
        scope: Scope::from_key("shop"),
        index: ix,
    };
    old.save(&cps, &[stream(index(&[("shop/x", 1)]))])
        .await
        .unwrap();

    let mut new = store(&server, term("pod-b", 4));
    let cps_b = new.claim().await.unwrap().checkpoints;
    let with_y = index(&[("shop/x", 1), ("shop/y", 2)]);
    new.save(&cps_b, &[stream(with_y.clone())]).await.unwrap();

    let err = old
        .save(&cps, &[stream(index(&[("shop/x", 5)]))])
        .await
        .unwrap_err();
    assert!(matches!(err, CheckpointError::NewerTerm(_)), "{err}");
    assert!(err.is_fenced());
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
    a.save(
        &cps,
        &[StreamIndex {
            kind: ObjectKind::ConfigMap,
            scope: Scope::from_key("shop"),
            index: index(&[("shop/x", 1)]),
        }],
    )
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

/// Issue 24: a save does not read back the shards this term wrote (at 10k
/// objects, reading ~8 shards of 200 KiB at every save was most of its
/// cost): an unchanged shard costs no request, a changed one its write.
#[tokio::test]
async fn saves_write_over_the_shards_this_term_wrote_without_reading_them() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 1));
    let cps = a.claim().await.unwrap().checkpoints;
    let lines: Vec<(String, u128)> = (0..6000).map(|i| (format!("shop/cm-{i}"), i)).collect();
    let ix = |bump: u128| {
        index(
            &lines
                .iter()
                .map(|(a, b)| (a.as_str(), *b + bump))
                .collect::<Vec<_>>(),
        )
    };
    let stream = |ix: ObjectIndex| StreamIndex {
        kind: ObjectKind::ConfigMap,
        scope: Scope::from_key("shop"),
        index: ix,
    };
    a.save(&cps, &[stream(ix(0))]).await.unwrap();
    let shard_requests = |server: &ServerHandle| -> Vec<String> {
        server
            .requests()
            .into_iter()
            .filter(|r| {
                r.resource == "leases"
                    && r.name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("wasmwatch-state-index-"))
            })
            .map(|r| format!("{} {}", r.verb, r.name.unwrap()))
            .collect()
    };
    let before = shard_requests(&server).len();
    a.save(&cps, &[stream(ix(0))]).await.unwrap();
    assert_eq!(
        shard_requests(&server)[before..],
        [] as [String; 0],
        "unchanged"
    );
    a.save(&cps, &[stream(ix(1))]).await.unwrap();
    let after = &shard_requests(&server)[before..];
    assert!(!after.is_empty(), "every shard changed");
    assert!(
        after.iter().all(|r| r.starts_with("update ")),
        "written, not read: {after:?}"
    );
    let claimed = store(&server, term("pod-b", 2)).claim().await.unwrap();
    assert_eq!(claimed.indexes[&ObjectKind::ConfigMap], ix(1));
}
