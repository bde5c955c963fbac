//! Benchmark: sustained write throughput with 10 watchers consuming every
//! event over real HTTP, and write-to-delivery latency at a paced rate.
//!
//! `cargo run --release -p wasmwatch-apiserver --example bench`
//! Optional args: `--watchers N --seconds S --rate R --writers W`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use wasmwatch_apiserver::{Config, Server};

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Args {
    watchers: usize,
    seconds: u64,
    rate: u64,
    writers: usize,
    objects: usize,
}

fn args() -> Args {
    let mut a = Args {
        watchers: 10,
        seconds: 5,
        rate: 1000,
        writers: 8,
        objects: 200,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = || {
            pair.get(1)
                .and_then(|v| v.parse().ok())
                .expect("numeric value")
        };
        match pair[0].as_str() {
            "--watchers" => a.watchers = v() as usize,
            "--seconds" => a.seconds = v(),
            "--rate" => a.rate = v(),
            "--writers" => a.writers = v() as usize,
            "--objects" => a.objects = v() as usize,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// Per-watcher results: events seen and write-to-delivery latencies (µs).
#[derive(Default)]
struct Seen {
    events: AtomicU64,
    latencies: Mutex<Vec<u64>>,
}

async fn watcher(
    addr: std::net::SocketAddr,
    from: u64,
    t0: Instant,
    seen: Arc<Seen>,
    record: Arc<std::sync::atomic::AtomicBool>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={from}"
    ))
    .header("host", addr.to_string())
    .body(Full::new(Bytes::new()))
    .unwrap();
    let mut resp = send.send_request(req).await.unwrap();
    let mut buf: Vec<u8> = Vec::new();
    let mut local = Vec::with_capacity(1 << 16);
    while let Some(frame) = resp.body_mut().frame().await {
        // The stream is cut when the server shuts down at the end.
        let Ok(frame) = frame else { break };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + i];
            let ev: Value = serde_json::from_slice(line).expect("event JSON");
            let now = t0.elapsed().as_nanos() as u64;
            if let Some(t) = ev["object"]["data"]["t"]
                .as_str()
                .and_then(|t| t.parse::<u64>().ok())
                && record.load(Ordering::Relaxed)
            {
                local.push((now.saturating_sub(t)) / 1000);
            }
            seen.events.fetch_add(1, Ordering::Relaxed);
            start += i + 1;
        }
        buf.drain(..start);
        if !local.is_empty() {
            seen.latencies.lock().await.append(&mut local);
        }
    }
}

async fn write(http: &Http, base: &str, name: &str, t0: Instant) {
    let body = json!({"data": {"t": t0.elapsed().as_nanos().to_string()}});
    let req = Request::patch(format!(
        "{base}/api/v1/namespaces/default/configmaps/{name}"
    ))
    .header("content-type", "application/merge-patch+json")
    .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
    .unwrap();
    let resp = http.request(req).await.unwrap();
    assert!(
        resp.status().is_success(),
        "write failed: {}",
        resp.status()
    );
    resp.into_body().collect().await.unwrap();
}

async fn wait_delivered(seens: &[Arc<Seen>], target: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while seens
        .iter()
        .any(|s| s.events.load(Ordering::Relaxed) < target)
    {
        assert!(
            Instant::now() < deadline,
            "watchers did not receive every event"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let a = args();
    let server = Server::start(
        Config::default()
            .history(100_000)
            .broadcast_capacity(1 << 18),
    )
    .await
    .unwrap();
    let base = server.url();
    let http: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    let t0 = Instant::now();
    for i in 0..a.objects {
        let req = Request::post(format!("{base}/api/v1/namespaces/default/configmaps"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_vec(
                    &json!({"metadata": {"name": format!("bench-{i}")}, "data": {"t": "0"}}),
                )
                .unwrap(),
            )))
            .unwrap();
        http.request(req)
            .await
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap();
    }

    let record = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let from = server.resource_version();
    let seens: Vec<Arc<Seen>> = (0..a.watchers).map(|_| Arc::new(Seen::default())).collect();
    for s in &seens {
        tokio::spawn(watcher(server.addr(), from, t0, s.clone(), record.clone()));
    }
    // Make sure every watcher is connected before measuring.
    write(&http, &base, "bench-0", t0).await;
    wait_delivered(&seens, 1).await;
    let mut total: u64 = 1;

    // Phase 1: sustained throughput, as fast as the writers go.
    let done = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..a.writers {
        let http = http.clone();
        let base = base.clone();
        let done = done.clone();
        let objects = a.objects;
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while Instant::now() < stop_at {
                write(&http, &base, &format!("bench-{}", i % objects), t0).await;
                done.fetch_add(1, Ordering::Relaxed);
                i += 7;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let writes = done.load(Ordering::Relaxed);
    let write_secs = started.elapsed().as_secs_f64();
    total += writes;
    wait_delivered(&seens, total).await;
    let delivered_secs = started.elapsed().as_secs_f64();
    println!(
        "throughput: {writes} writes in {write_secs:.2}s = {:.0} writes/s with {} watchers; all {} events delivered to every watcher after {delivered_secs:.2}s ({:.0} events/s per watcher)",
        writes as f64 / write_secs,
        a.watchers,
        writes,
        writes as f64 / delivered_secs,
    );

    // Phase 2: paced writes, latency from write to delivery at each watcher.
    record.store(true, Ordering::SeqCst);
    let (tx, rx) = tokio::sync::mpsc::channel::<usize>(1024);
    let rx = Arc::new(Mutex::new(rx));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let http = http.clone();
        let base = base.clone();
        let rx = rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(i) = next else { break };
                write(&http, &base, &format!("bench-{i}"), t0).await;
            }
        }));
    }
    let n = a.rate * a.seconds;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / a.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let paced_start = Instant::now();
    for i in 0..n as usize {
        tick.tick().await;
        tx.send(i % a.objects).await.unwrap();
    }
    drop(tx);
    for t in tasks {
        t.await.unwrap();
    }
    let paced_secs = paced_start.elapsed().as_secs_f64();
    total += n;
    wait_delivered(&seens, total).await;
    let mut all = Vec::new();
    for s in &seens {
        all.extend(s.latencies.lock().await.iter().copied());
    }
    all.sort_unstable();
    println!(
        "latency at {:.0} writes/s ({} writes x {} watchers = {} deliveries): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        n as f64 / paced_secs,
        n,
        a.watchers,
        all.len(),
        percentile(&all, 0.50) as f64 / 1000.0,
        percentile(&all, 0.99) as f64 / 1000.0,
        all.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
}
