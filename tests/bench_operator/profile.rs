//! MW_BENCH_PROFILE=S: where kube-apiserver's CPU went in each convergence run, to find why
//! one contender's run can cost it more than another's with the same writes. hack/bench.sh
//! starts the API server with its profiles served (MW_CP_PROFILING=true) when this is set.
//!
//! For each run, in target/bench/profiles/ under `<sequence>-<contender>-<n>`:
//! - `.pprof`: Go's CPU profile of the API server over the run's first S seconds; compare two
//!   runs with `go tool pprof -top -diff_base A.pprof B.pprof`;
//! - `.metrics.json`: how much each of the API server's counters moved during the whole run
//!   (requests by verb and resource, watch events sent by kind, bytes allocated), largest first;
//! - `.goroutines.txt`: the API server's goroutines halfway through the profile, grouped by
//!   stack: where requests wait rather than work (a lock, etcd, a queue).
//!
//! One line per run is printed too: the bytes the API server allocated (steadier than its CPU,
//! whose garbage collection lands in one run or the next), its requests and watch events.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::AsyncReadExt;
use kube::Client;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::support;

/// A run being profiled.
pub struct Profiling {
    name: String,
    client: Client,
    profile: JoinHandle<Result<Vec<u8>, String>>,
    goroutines: JoinHandle<Result<Vec<u8>, String>>,
    before: BTreeMap<String, f64>,
}

/// MW_BENCH_PROFILE: the seconds of each run to profile; unset or 0, none.
fn seconds() -> Option<u64> {
    std::env::var("MW_BENCH_PROFILE").ok()?.parse().ok().filter(|s| *s > 0)
}

fn dir() -> PathBuf {
    PathBuf::from("target/bench/profiles")
}

/// Starts profiling the run of `contender` with `n` workloads, if MW_BENCH_PROFILE is set.
pub async fn start(contender: &str, n: usize) -> Option<Profiling> {
    static SEQUENCE: AtomicUsize = AtomicUsize::new(0);
    let seconds = seconds()?;
    let name = format!("{:02}-{contender}-{n}", SEQUENCE.fetch_add(1, Ordering::Relaxed));
    let client = support::client().await;
    let before = counters(&client).await;
    let profile = tokio::spawn(fetch(client.clone(), format!("/debug/pprof/profile?seconds={seconds}")));
    let dumper = client.clone();
    let goroutines = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(seconds / 2)).await;
        fetch(dumper, "/debug/pprof/goroutine?debug=1".into()).await
    });
    Some(Profiling { name, client, profile, goroutines, before })
}

/// The body of the API server's answer to a GET of `path`, as bytes.
async fn fetch(client: Client, path: String) -> Result<Vec<u8>, String> {
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    let mut body = client.request_stream(request).await.map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    body.read_to_end(&mut bytes).await.map_err(|e| e.to_string())?;
    Ok(bytes)
}

impl Profiling {
    /// Ends the run's profile: waits for the CPU profile (it covers a fixed time), writes the
    /// files and prints the run's line.
    pub async fn finish(self) {
        let after = counters(&self.client).await;
        let mut moved: Vec<(String, f64)> = after
            .iter()
            .map(|(key, now)| (key.clone(), now - self.before.get(key).copied().unwrap_or(0.0)))
            .filter(|(_, by)| *by != 0.0)
            .collect();
        moved.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then_with(|| a.0.cmp(&b.0)));
        let sum = |prefix: &str| moved.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum::<f64>();
        println!(
            "profile {}: kube-apiserver allocated {:.2} GiB, answered {:.0} requests, sent {:.0} watch events",
            self.name,
            sum("go_memstats_alloc_bytes_total") / f64::from(1 << 30),
            sum("apiserver_request_total{"),
            sum("apiserver_watch_events_total{"),
        );
        std::fs::create_dir_all(dir()).expect("target/bench/profiles");
        let metrics: serde_json::Map<String, Value> = moved.into_iter().map(|(k, v)| (k, json!(v))).collect();
        let path = dir().join(format!("{}.metrics.json", self.name));
        std::fs::write(&path, serde_json::to_vec_pretty(&metrics).expect("JSON")).expect("writing the counters");
        for (what, task, suffix) in
            [("CPU profile", self.profile, "pprof"), ("goroutines", self.goroutines, "goroutines.txt")]
        {
            match task.await.map_err(|e| e.to_string()).and_then(|answer| answer) {
                Ok(bytes) => std::fs::write(dir().join(format!("{}.{suffix}", self.name)), bytes).expect("writing it"),
                Err(e) => println!("profile {}: no {what} ({e}); is MW_CP_PROFILING=true?", self.name),
            }
        }
    }
}

/// The API server's counters (`_total`, `_sum` and `_count` series) by their full series name.
async fn counters(client: &Client) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("a GET");
    let text = client.request_text(request).await.expect("the API server's metrics");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            let counter = ["_total", "_sum", "_count"].iter().any(|suffix| name.ends_with(suffix));
            Some((series.to_string(), value.parse().ok()?)).filter(|_| counter)
        })
        .collect()
}
