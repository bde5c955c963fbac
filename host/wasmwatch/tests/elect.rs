//! `wasmwatch elect`, the leader-election sidecar, as separate processes
//! against the test API server.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmwatch_apiserver::{Config, Server};

struct Sidecar {
    child: Child,
    admin: SocketAddr,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(kubeconfig: &std::path::Path, identity: &str) -> Sidecar {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args([
            "elect",
            "--identity",
            identity,
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--lease-duration",
            "3s",
            "--renew-deadline",
            "2s",
            "--retry-period",
            "200ms",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start wasmwatch elect");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let admin = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    Sidecar { child, admin }
}

/// GET over plain HTTP/1.0; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

async fn leading(s: &Sidecar) -> bool {
    get(s.admin, "/leader").await.1.trim() == "true"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_elect_one_leader_and_hand_over_on_sigterm_within_a_second() {
    let server = Server::start(Config::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut sidecars = [start(&kubeconfig, "pod-a"), start(&kubeconfig, "pod-b")];
    for s in &sidecars {
        assert_eq!(get(s.admin, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(get(s.admin, "/readyz").await.0, 200);
        assert_eq!(get(s.admin, "/nope").await.0, 404);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        let states = [leading(&sidecars[0]).await, leading(&sidecars[1]).await];
        match states {
            [true, false] => break 0,
            [false, true] => break 1,
            [true, true] => panic!("two leaders"),
            _ => assert!(Instant::now() < deadline, "no leader"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let name = ["pod-a", "pod-b"][leader];
    let (_, json) = get(sidecars[leader].admin, "/leader?format=json").await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["leading"], true);
    assert_eq!(json["holder"], name);
    assert_eq!(json["term"]["holder"], name);
    // The term names the Lease it was taken on (the Lease's UID).
    assert!(
        json["term"]["leaseUid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{json}"
    );
    // The follower learns the holder from its next look at the Lease (its
    // watch or its retry period): wait for it rather than race it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let json = loop {
        let (_, json) = get(sidecars[1 - leader].admin, "/leader?format=json").await;
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        if json["holder"] == name || Instant::now() > deadline {
            break json;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(json["leading"], false);
    assert_eq!(json["holder"], name, "followers report the holder");

    let sigterm_at = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &sidecars[leader].child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let follower = &sidecars[1 - leader];
    loop {
        if leading(follower).await {
            break;
        }
        assert!(sigterm_at.elapsed() < Duration::from_secs(5), "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = sigterm_at.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "handover after SIGTERM took {took:?}"
    );
    let exit = sidecars[leader].child.wait().unwrap();
    assert!(exit.success(), "the old leader exits cleanly: {exit:?}");
    let lease = server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-leader")
        .unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"],
        ["pod-a", "pod-b"][1 - leader]
    );
}
