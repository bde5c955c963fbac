//! Publish latency at a steady rate, against a real RabbitMQ and nats-server
//! started on loopback: `cargo run --release -p wasmwatch-bus --example
//! publish_latency [messages]`. Each publish is timed from the call to its
//! return (AMQP: confirmed; NATS: processed by the server); 100 per second,
//! one at a time, as configuration changes arrive. Prints p50/p99.
use std::time::{Duration, Instant};

use wasmwatch_bus::Buses;
use wasmwatch_core::manifest::{AmqpSpec, BusConnection, NatsSpec};
use wasmwatch_testkit::brokers::{Nats, rabbit};

fn bus(name: &str, amqp: Option<&str>, nats: Option<&str>) -> BusConnection {
    let spec = |url: &str| url.to_string();
    BusConnection {
        name: name.into(),
        amqp: amqp.map(|u| AmqpSpec {
            url: spec(u),
            ..Default::default()
        }),
        nats: nats.map(|u| NatsSpec {
            url: spec(u),
            ..Default::default()
        }),
    }
}

async fn measure(buses: &Buses, name: &str, destination: &str, n: usize) -> Vec<Duration> {
    let payload = br#"{"type":"RefreshRemoteApplicationEvent","originService":"wasmwatch","destinationService":"orders:**"}"#;
    // Warm up: connection and exchange.
    buses
        .publish(name, destination, "orders", &[], payload)
        .await
        .unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let t = Instant::now();
        buses
            .publish(name, destination, "orders", &[], payload)
            .await
            .unwrap();
        out.push(t.elapsed());
    }
    out.sort();
    out
}

fn pct(v: &[Duration], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)].as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let r = rabbit();
    let nats = Nats::start(&[]);
    let buses = Buses::new(&[
        bus("rabbit", Some(&r.url()), None),
        bus("nats", None, Some(&nats.url())),
    ])
    .unwrap();
    for (name, dest) in [("rabbit", "springCloudBus"), ("nats", "config.changed")] {
        let v = measure(&buses, name, dest, n).await;
        println!(
            "{name}: {n} publishes at 100/s: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            pct(&v, 0.50),
            pct(&v, 0.99),
            pct(&v, 1.0)
        );
    }
}
