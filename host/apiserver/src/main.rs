//! `wasmwatch-apiserver`: run the in-memory test Kubernetes API server until Ctrl-C.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use wasmwatch_apiserver::{Config, Server};

/// An in-memory Kubernetes API server for tests and local runs.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Port to listen on (127.0.0.1); 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig pointing at the server to this file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Number of past changes kept for watch resumption.
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// Seconds between watch BOOKMARK events.
    #[arg(long, default_value_t = 60)]
    bookmark_interval: u64,
    /// Create namespaces on first use instead of answering 404.
    #[arg(long)]
    auto_create_namespaces: bool,
    /// Start without the CustomResourceDefinitions of the custom resources
    /// (Rollouts, CloneSets, ...): they are served once their CRD is created.
    #[arg(long)]
    no_preinstalled_crds: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = Config::default()
        .port(args.port)
        .history(args.history)
        .bookmark_interval(Duration::from_secs(args.bookmark_interval))
        .auto_create_namespaces(args.auto_create_namespaces)
        .preinstalled_crds(!args.no_preinstalled_crds);
    let server = Server::start(config).await.context("starting the server")?;
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path)?;
        eprintln!("kubeconfig written to {}", path.display());
    }
    println!("{}", server.url());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    server.shutdown().await;
    Ok(())
}
