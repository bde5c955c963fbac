//! Wire-level watch and list semantics: replay from a version, 410, synthetic
//! events, bookmarks, initial-events-end, selectors, timeouts, paging and
//! exact lists.

mod common;

use std::time::Duration;

use common::{Watch, cm, delete, get, http, post, send, summary};
use serde_json::{Value, json};
use wasmwatch_apiserver::Config;

const T: Duration = Duration::from_secs(5);

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

fn patch_json(v: Value) -> (String, Value) {
    ("application/merge-patch+json".into(), v)
}

#[tokio::test]
async fn watch_from_version_replays_exactly_the_later_writes() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    post(
        &h,
        &format!("{base}/api/v1/namespaces"),
        &json!({"metadata": {"name": "team-a"}}),
    )
    .await;

    // Some history before the starting point.
    for i in 0..5 {
        let r = post(
            &h,
            &format!("{base}/api/v1/namespaces/default/configmaps"),
            &cm(&format!("old-{i}"), &[]),
        )
        .await;
        assert_eq!(r.status, 201);
    }
    let start = server.resource_version();

    // Writes after the starting point, in two namespaces; record what each
    // watch must see.
    let mut all: Vec<(String, String, String)> = Vec::new();
    let mut in_default = Vec::new();
    for i in 0..30 {
        let ns = if i % 3 == 0 { "team-a" } else { "default" };
        let coll = format!("{base}/api/v1/namespaces/{ns}/configmaps");
        let name = format!("cm-{}", i % 7);
        let r = match i % 4 {
            0 | 1 => post(&h, &coll, &cm(&name, &[("i", &i.to_string())])).await,
            2 => {
                let (ct, p) = patch_json(json!({"data": {"i": i.to_string()}}));
                send(&h, "PATCH", &format!("{coll}/{name}"), &ct, Some(&p)).await
            }
            _ => delete(&h, &format!("{coll}/{name}")).await,
        };
        let kind = match (r.status, i % 4) {
            (201, _) => "ADDED",
            (200, 2) => "MODIFIED",
            (200, _) => "DELETED",
            _ => continue,
        };
        let obj_rv = if kind == "DELETED" {
            server.resource_version().to_string()
        } else {
            rv(&r.body)
        };
        let ev = (kind.to_string(), name, obj_rv);
        if ns == "default" {
            in_default.push(ev.clone());
        }
        all.push(ev);
    }
    assert!(all.len() > 15 && in_default.len() > 8);

    // A marker after the replayed range proves nothing extra comes in between.
    let marker = post(
        &h,
        &format!("{base}/api/v1/namespaces/default/configmaps"),
        &cm("zz-marker", &[]),
    )
    .await;
    let marker = (
        "ADDED".to_string(),
        "zz-marker".to_string(),
        rv(&marker.body),
    );

    for (url, want) in [
        (
            format!(
                "{base}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}"
            ),
            &in_default,
        ),
        (
            format!("{base}/api/v1/configmaps?watch=1&resourceVersion={start}"),
            &all,
        ),
        (
            format!("{base}/api/v1/watch/configmaps?resourceVersion={start}"),
            &all,
        ),
    ] {
        let mut w = Watch::open(&h, &url).await;
        let mut got = Vec::new();
        for _ in 0..want.len() {
            got.push(summary(&w.next_within(T).await.unwrap()));
        }
        assert_eq!(&got, want, "{url}");
        assert_eq!(summary(&w.next_within(T).await.unwrap()), marker, "{url}");
    }
}

#[tokio::test]
async fn expired_version_yields_one_410_error_event_and_ends() {
    let server = common::start_with(Config::default().history(5)).await;
    let h = http();
    let base = server.url();
    for i in 0..20 {
        post(
            &h,
            &format!("{base}/api/v1/namespaces/default/configmaps"),
            &cm(&format!("c{i}"), &[]),
        )
        .await;
    }
    for url in [
        format!("{base}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=3"),
        format!("{base}/api/v1/configmaps?watch=true&resourceVersion=3"),
    ] {
        let mut w = Watch::open(&h, &url).await;
        let ev = w.next_within(T).await.unwrap();
        assert_eq!(ev["type"], "ERROR");
        let st = &ev["object"];
        assert_eq!(st["kind"], "Status");
        assert_eq!(st["status"], "Failure");
        assert_eq!(st["code"], 410);
        assert_eq!(st["reason"], "Expired");
        assert!(
            st["message"]
                .as_str()
                .unwrap()
                .starts_with("too old resource version: 3 ("),
            "{st}"
        );
        assert!(
            w.next_within(T).await.is_none(),
            "the stream ends after the ERROR"
        );
    }
    // A recent version is still fine.
    let recent = server.resource_version() - 2;
    let mut w = Watch::open(
        &h,
        &format!("{base}/api/v1/configmaps?watch=true&resourceVersion={recent}"),
    )
    .await;
    assert_eq!(w.next_within(T).await.unwrap()["type"], "ADDED");

    // Exact list older than history: 410 too.
    let r = get(
        &h,
        &format!("{base}/api/v1/configmaps?resourceVersion=3&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(r.status, 410);
    assert_eq!(r.body["reason"], "Expired");
}

#[tokio::test]
async fn watch_without_version_sends_synthetic_adds_then_changes() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    post(&h, &coll, &cm("a", &[])).await;
    post(&h, &coll, &cm("b", &[])).await;
    for q in ["watch=true", "watch=true&resourceVersion=0"] {
        let mut w = Watch::open(&h, &format!("{coll}?{q}")).await;
        let existing = server.snapshot("configmaps").unwrap().0;
        let mut names = Vec::new();
        for _ in 0..existing.len() {
            let s = summary(&w.next_within(T).await.unwrap());
            assert_eq!(s.0, "ADDED");
            names.push(s.1);
        }
        let want: Vec<&str> = existing
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, want);
        assert_eq!(&names[..2], ["a", "b"]);
        let c = post(&h, &coll, &cm(&format!("c-{}", q.len()), &[])).await;
        let ev = w.next_within(T).await.unwrap();
        assert_eq!(
            summary(&ev),
            ("ADDED".into(), format!("c-{}", q.len()), rv(&c.body))
        );
        assert_eq!(ev["object"], c.body);
    }
}

#[tokio::test]
async fn bookmarks_initial_events_end_and_timeout() {
    let server =
        common::start_with(Config::default().bookmark_interval(Duration::from_millis(50))).await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/apis/apps/v1/namespaces/default/deployments");
    let dep = json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    assert_eq!(post(&h, &coll, &dep).await.status, 201);
    let now = server.resource_version();

    // Periodic bookmarks carry only the version, with the right kind.
    let mut w = Watch::open(
        &h,
        &format!("{coll}?watch=true&resourceVersion={now}&allowWatchBookmarks=true"),
    )
    .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(ev["object"]["kind"], "Deployment");
    assert_eq!(ev["object"]["apiVersion"], "apps/v1");
    assert_eq!(
        ev["object"]["metadata"],
        json!({"resourceVersion": now.to_string()})
    );
    drop(w);

    // sendInitialEvents: synthetic ADDED, then the initial-events-end bookmark.
    let mut w = Watch::open(
        &h,
        &format!("{coll}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
    )
    .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(summary(&ev).0, "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "web");
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(
        ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(ev["object"]["metadata"]["resourceVersion"], now.to_string());
    drop(w);

    // timeoutSeconds ends the stream cleanly, with a final bookmark.
    let server2 = common::start().await;
    let coll2 = format!("{}/api/v1/namespaces/default/pods", server2.url());
    let started = std::time::Instant::now();
    let mut w = Watch::open(
        &h,
        &format!(
            "{coll2}?watch=true&timeoutSeconds=1&allowWatchBookmarks=true&resourceVersion={}",
            server2.resource_version()
        ),
    )
    .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(ev["object"]["kind"], "Pod");
    assert!(w.next_within(T).await.is_none());
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn selectors_filter_and_leaving_objects_are_deleted() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    let from = server.resource_version();
    let mut w = Watch::open(
        &h,
        &format!("{coll}?watch=true&resourceVersion={from}&labelSelector=app%3Dweb"),
    )
    .await;
    let mut f = Watch::open(
        &h,
        &format!("{coll}?watch=true&resourceVersion={from}&fieldSelector=metadata.name%3Dtwo"),
    )
    .await;

    let mut one = cm("one", &[]);
    one["metadata"]["labels"] = json!({"app": "web"});
    post(&h, &coll, &one).await;
    post(&h, &coll, &cm("two", &[])).await;
    let p = |labels: Value| json!({"metadata": {"labels": labels}});
    let left = send(
        &h,
        "PATCH",
        &format!("{coll}/one"),
        "application/merge-patch+json",
        Some(&p(json!({"app": "api"}))),
    )
    .await;
    send(
        &h,
        "PATCH",
        &format!("{coll}/one"),
        "application/merge-patch+json",
        Some(&p(json!({"app": "web"}))),
    )
    .await;
    send(
        &h,
        "PATCH",
        &format!("{coll}/two"),
        "application/merge-patch+json",
        Some(&p(json!({"x": "y"}))),
    )
    .await;
    delete(&h, &format!("{coll}/one")).await;
    let mut marker = cm("zz", &[]);
    marker["metadata"]["labels"] = json!({"app": "web"});
    post(&h, &coll, &marker).await;

    let mut got = Vec::new();
    let mut events = Vec::new();
    for _ in 0..5 {
        let ev = w.next_within(T).await.unwrap();
        let s = summary(&ev);
        got.push((s.0, s.1));
        events.push(ev);
    }
    // Leaving the selector: kube-apiserver sends the previous state (which
    // still matched) stamped with the update's resourceVersion.
    let leave = &events[1]["object"];
    assert_eq!(leave["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(leave["metadata"]["resourceVersion"], rv(&left.body));
    assert_ne!(rv(&left.body), rv(&events[0]["object"]));
    let want: Vec<(String, String)> = [
        ("ADDED", "one"),
        ("DELETED", "one"),
        ("ADDED", "one"),
        ("DELETED", "one"),
        ("ADDED", "zz"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);

    let a = summary(&f.next_within(T).await.unwrap());
    let b = summary(&f.next_within(T).await.unwrap());
    assert_eq!((a.0.as_str(), a.1.as_str()), ("ADDED", "two"));
    assert_eq!((b.0.as_str(), b.1.as_str()), ("MODIFIED", "two"));

    // Bad selectors are 400s.
    let r = get(&h, &format!("{coll}?fieldSelector=spec.nothing%3D1")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["reason"], "BadRequest");
}

#[tokio::test]
async fn list_paging_snapshots_and_expired_continue() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    for i in 0..7 {
        post(&h, &coll, &cm(&format!("c{i}"), &[])).await;
    }
    let p1 = get(&h, &format!("{coll}?limit=3")).await;
    assert_eq!(p1.status, 200);
    assert_eq!(p1.body["kind"], "ConfigMapList");
    let items = p1.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(p1.body["metadata"]["remainingItemCount"], 4);
    let snap_rv = p1.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let cont = p1.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();

    // Changes after the first page do not show in later pages.
    delete(&h, &format!("{coll}/c5")).await;
    post(&h, &coll, &cm("c9", &[])).await;
    let p2 = get(&h, &format!("{coll}?limit=3&continue={cont}")).await;
    let names: Vec<&str> = p2.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c3", "c4", "c5"]);
    assert_eq!(p2.body["metadata"]["resourceVersion"], snap_rv);
    let cont2 = p2.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let p3 = get(&h, &format!("{coll}?limit=3&continue={cont2}")).await;
    let names: Vec<&str> = p3.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c6"]);
    assert!(p3.body["metadata"].get("continue").is_none());

    // Exact list at the old snapshot.
    let exact = get(
        &h,
        &format!("{coll}?resourceVersion={snap_rv}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(exact.body["items"].as_array().unwrap().len(), 7);
    let latest = get(&h, &coll).await;
    assert_eq!(latest.body["items"].as_array().unwrap().len(), 7);
    assert_ne!(latest.body["metadata"]["resourceVersion"], snap_rv);
    // Too new a version: 504 like kube-apiserver's "Too large resource version".
    let r = get(
        &h,
        &format!("{coll}?resourceVersion=999999&resourceVersionMatch=NotOlderThan"),
    )
    .await;
    assert_eq!(r.status, 504);

    // Compacted: the continue token has expired.
    server.faults().compact_history();
    let r = get(&h, &format!("{coll}?limit=3&continue={cont}")).await;
    assert_eq!(r.status, 410);
    assert_eq!(r.body["reason"], "Expired");
}

#[tokio::test]
async fn open_watches_are_counted_and_released_when_clients_go() {
    let server = common::start().await;
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    let (h1, h2) = (http(), http());
    let w1 = Watch::open(&h1, &format!("{coll}?watch=true")).await;
    let client = server.client().unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::default_namespaced(client);
    let kw = tokio::spawn(async move {
        use futures_util::StreamExt;
        let s = kube::runtime::watcher(api, Default::default());
        futures_util::pin_mut!(s);
        while s.next().await.is_some() {}
    });
    // Awaitable, no sleeping: both watches are established.
    tokio::time::timeout(T, server.wait_for_watches(2))
        .await
        .unwrap();
    assert_eq!(server.open_watches(), 2);
    let _w2 = Watch::open(&h2, &format!("{coll}?watch=true&timeoutSeconds=60")).await;
    tokio::time::timeout(T, server.wait_for_watches(3))
        .await
        .unwrap();

    // Idle watches are released when their clients disconnect.
    drop(w1);
    drop(h1);
    kw.abort();
    let mut count = server.watch_count();
    tokio::time::timeout(T, count.wait_for(|&n| n == 1))
        .await
        .unwrap()
        .unwrap();
}

/// Pages read in place (`Store::list_page`): a namespace's pages stop at
/// its last object, and a selector pages over the objects it admits only,
/// without a remaining count (kube-apiserver gives none when filtering).
#[tokio::test]
async fn list_pages_keep_to_the_namespace_and_the_selector() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    for ns in ["a", "b"] {
        post(
            &h,
            &format!("{base}/api/v1/namespaces"),
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        for i in 0..5 {
            let mut o = cm(&format!("c{i}"), &[]);
            if i % 2 == 0 {
                o["metadata"]["labels"] = json!({"even": "yes"});
            }
            post(&h, &format!("{base}/api/v1/namespaces/{ns}/configmaps"), &o).await;
        }
    }
    let names = |body: &Value| -> Vec<String> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap(),
                    i["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    // Every page of a paged list, in order, and the last page's metadata.
    let pages = |url: String| {
        let h = h.clone();
        async move {
            let (mut all, mut pages) = (Vec::new(), Vec::new());
            let mut next = url.clone();
            loop {
                let r = get(&h, &next).await;
                assert_eq!(r.status, 200, "{}", r.body);
                all.extend(names(&r.body));
                pages.push(r.body["metadata"].clone());
                match r.body["metadata"]["continue"].as_str() {
                    Some(c) => next = format!("{url}&continue={c}"),
                    None => return (all, pages),
                }
            }
        }
    };
    let (all, meta) = pages(format!("{base}/api/v1/namespaces/a/configmaps?limit=2")).await;
    assert_eq!(all, ["a/c0", "a/c1", "a/c2", "a/c3", "a/c4"]);
    assert_eq!(meta[0]["remainingItemCount"], 3);
    assert_eq!(meta.len(), 3);
    let (all, meta) = pages(format!(
        "{base}/api/v1/configmaps?limit=2&labelSelector=even%3Dyes"
    ))
    .await;
    assert_eq!(all, ["a/c0", "a/c2", "a/c4", "b/c0", "b/c2", "b/c4"]);
    assert!(meta.iter().all(|m| m.get("remainingItemCount").is_none()));
    assert_eq!(meta.len(), 3, "no empty last page");
}
