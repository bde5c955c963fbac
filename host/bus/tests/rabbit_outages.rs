//! RabbitMQ going away and pushing back, on a broker of this test binary's
//! own (the alarm and the restart would disturb other tests): whatever a
//! publish returned, a message it said was taken is in the queue; a refused
//! one is reported as retryable, so the delivery pipeline retries or
//! dead-letters it. Nothing vanishes.
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use wasmwatch_bus::Buses;
use wasmwatch_bus::testing::AmqpTestClient;
use wasmwatch_core::manifest::{AmqpSpec, BusConnection};
use wasmwatch_testkit::brokers::{Rabbit, rabbit};

fn buses(r: &Rabbit) -> Buses {
    Buses::new(&[BusConnection {
        name: "bus".into(),
        amqp: Some(AmqpSpec {
            url: r.url(),
            ..Default::default()
        }),
        nats: None,
    }])
    .unwrap()
    .with_timeout(Duration::from_secs(2))
}

/// Publishes until the broker confirms, as the delivery pipeline would
/// retry a retryable failure; returns the failures seen.
async fn publish_until_taken(b: &Buses, body: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match b
            .publish("bus", "outage-x", "k", &[], body.as_bytes())
            .await
        {
            Ok(()) => return failures,
            Err(e) => {
                assert!(e.retryable(), "{e}");
                assert!(Instant::now() < deadline, "not taken within 60 s: {e}");
                failures.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn drain(r: &Rabbit, queue: &str) -> Vec<String> {
    let mut c = AmqpTestClient::connect(&r.url()).await.unwrap();
    let mut got = Vec::new();
    while let Some(d) = c.get(queue).await.unwrap() {
        got.push(String::from_utf8(d.body).unwrap());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_stream_and_memory_alarm_lose_nothing() {
    let r = rabbit();
    let b = buses(r);
    // The exchange and a durable queue, before anything is published.
    b.publish("bus", "outage-x", "none", &[], b"{}")
        .await
        .unwrap();
    let mut c = AmqpTestClient::connect(&r.url()).await.unwrap();
    c.durable_queue_bound("outage-q", "outage-x", "k")
        .await
        .unwrap();
    drop(c);

    // A broker restart in the middle of a stream of publishes: the stream
    // goes on until the restart is over and 20 more were taken (however
    // long rabbitmqctl takes to start on a busy machine).
    let restarted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let b = buses(r);
        let restarted = restarted.clone();
        tokio::spawn(async move {
            let (mut failures, mut after) = (Vec::new(), 0);
            let mut n = 0;
            while after < 20 {
                failures.extend(publish_until_taken(&b, &format!("m{n}")).await);
                n += 1;
                if restarted.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (failures, n)
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.ctl(&["stop_app"]).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.ctl(&["start_app"]).unwrap();
    restarted.store(true, std::sync::atomic::Ordering::SeqCst);
    let (failures, n) = publisher.await.unwrap();
    assert!(
        !failures.is_empty(),
        "the restart should have refused some publishes"
    );
    let got: BTreeSet<String> = drain(r, "outage-q").await.into_iter().collect();
    let missing: Vec<usize> = (0..n).filter(|i| !got.contains(&format!("m{i}"))).collect();
    assert!(
        missing.is_empty(),
        "confirmed messages lost across the restart: {missing:?}"
    );

    // A memory alarm blocks publishers: refused (retryable) while it lasts,
    // taken once it is over.
    r.ctl(&["set_vm_memory_high_watermark", "absolute", "1"])
        .unwrap();
    let e = b
        .publish("bus", "outage-x", "k", &[], b"during-alarm")
        .await
        .unwrap_err();
    assert!(e.retryable(), "{e}");
    r.ctl(&["set_vm_memory_high_watermark", "0.4"]).unwrap();
    publish_until_taken(&b, "during-alarm").await;
    let got = drain(r, "outage-q").await;
    assert!(got.contains(&"during-alarm".to_string()), "{got:?}");
}
