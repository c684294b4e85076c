//! The bridge at scale, for `make bench` (ignored by `make test`): N Manager rows (default
//! 10,000; MW_BENCH_BRIDGE_ROWS) in a real PostgreSQL, synced by the release build with its
//! default poll interval into one namespace. Figures: the first sync (CRs and Secrets
//! created), a full resync with nothing to do (wall time as the bridge logs it, CPU time
//! from /proc, API writes from the audit log), peak memory, and the time from a row change
//! to its CR applied (p50/p99). Written to target/bench/bridge.json and printed as Markdown.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::watcher;

use mw_operator::names::ENV_DIGEST_ANNOTATION;
use mw_operator::resource::ManagedWorkload;
use support::bridge::{Bridge, kubeconfig};
use support::manager::{Engine, ManagerDb, now};
use support::procfs::{cpu_seconds, memory_kib, percentile};
use support::{TestNamespace, audit};

/// (VmRSS, VmHWM) in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let (rss, hwm) = memory_kib(pid);
    (rss / 1024.0, hwm / 1024.0)
}

/// The `took=` of a "full resync done" log line, in seconds (Rust's Debug form of a Duration).
fn took(line: &str) -> f64 {
    let value = line.split("took=").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or("0s");
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = value.strip_suffix("µs") {
        (n, 1e-6)
    } else {
        (value.trim_end_matches('s'), 1.0)
    };
    number.parse::<f64>().unwrap_or(0.0) * scale
}

/// The writes of the sync itself: the Lease renewals of the bridge's leader election are not.
fn sync_writes(counts: &HashMap<String, usize>) -> usize {
    counts.iter().filter(|(kind, _)| !kind.ends_with(" leases")).map(|(_, n)| n).sum()
}

fn writes_by_kind(namespace: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for w in audit::writes_by("mw-bridge", namespace) {
        *counts.entry(format!("{} {}", w.verb, w.resource)).or_insert(0) += 1;
    }
    counts
}

#[tokio::test]
#[ignore = "a benchmark: `make bench` runs it"]
async fn bridge_at_scale() {
    let rows: usize = std::env::var("MW_BENCH_BRIDGE_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let changes: usize = 100;
    let ns = TestNamespace::new("bench-bridge").await;
    let db = ManagerDb::new(Engine::Postgres).await;
    db.set_default_env(r#"[{"key":"WAZUH_MANAGER","value":"wazuh.lab.internal","description":""}]"#).await;
    let stamp = now();
    db.exec(&format!(
        r#"INSERT INTO "Containers" ("hostname", "username", "nodeId", "siteId", "aiContainer", "template",
             "environmentVars", "entrypoint", "nvidiaRequested", "createdAt", "updatedAt")
           SELECT 'w' || lpad(g::text, 6, '0'), 'user' || (g % 50),
                  (SELECT "id" FROM "Nodes" WHERE "name" = 'k8s-lab-1'), (SELECT "id" FROM "Sites" WHERE "name" = 'bridge-lab'),
                  'N', 'docker.io/library/nginx:1.27', '{{"TZ":"UTC","ID":"' || g || '"}}', 'nginx -g "daemon off;"', false,
                  '{stamp}', '{stamp}'
           FROM generate_series(1, {rows}) AS g"#
    ))
    .await;
    let total_rows = db.count(r#"SELECT CAST(COUNT(*) AS BIGINT) FROM "Containers""#).await as usize;

    // The first sync: every CR and Secret created.
    let started = Instant::now();
    let started_at = Timestamp::now();
    let bridge = Bridge::spawn(&ns, &db, &kubeconfig(), &["--resync-interval", "1h"]).await;
    let pid = bridge.pid();
    let first = bridge.wait_for_line(&["full resync done"], Duration::from_secs(3600)).await;
    let first_wall = started.elapsed().as_secs_f64();
    let first_cpu = cpu_seconds(pid);
    let first_writes = writes_by_kind(&ns.name);
    // When the last CR was created (the API server's clock): its Secret follows.
    let last_created = audit::timed_accepted_writes_by("mw-bridge", &ns.name)
        .iter()
        .filter(|(_, w)| w.resource == "managedworkloads")
        .map(|(at, _)| *at)
        .max()
        .unwrap_or(started_at);
    let every_cr_s = last_created.duration_since(started_at).as_secs_f64();

    // A full resync with nothing to do, triggered at once by a Settings change that maps to
    // the same env (the bridge re-reads everything when Settings change).
    let cpu_before = cpu_seconds(pid);
    db.exec(&format!(r#"UPDATE "Settings" SET "updatedAt" = '{}' WHERE key = 'default_container_env_vars'"#, now()))
        .await;
    let deadline = Instant::now() + Duration::from_secs(600);
    let second = loop {
        let done: Vec<String> =
            bridge.output().lines().filter(|l| l.contains("full resync done")).map(String::from).collect();
        if done.len() >= 2 {
            break done[1].clone();
        }
        assert!(Instant::now() < deadline, "no second full resync");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let idle_cpu = cpu_seconds(pid) - cpu_before;
    let idle_writes = sync_writes(&writes_by_kind(&ns.name)) - sync_writes(&first_writes);

    // Row change → CR applied, `changes` rows changed 100 ms apart.
    let workloads = ns.api::<ManagedWorkload>();
    let applied: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let initial: HashMap<String, String> = HashMap::new();
    let sink = applied.clone();
    let watch = tokio::spawn(async move {
        let mut digests = initial;
        let mut stream = std::pin::pin!(watcher(workloads, watcher::Config::default()));
        while let Some(Ok(event)) = stream.next().await {
            if let watcher::Event::Apply(mw) | watcher::Event::InitApply(mw) = event {
                let digest = mw.spec.pod_annotations.get(ENV_DIGEST_ANNOTATION).cloned().unwrap_or_default();
                let before = digests.insert(mw.name_any(), digest.clone());
                if before.is_some_and(|b| b != digest) {
                    sink.lock().unwrap().entry(mw.name_any()).or_insert_with(Instant::now);
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await; // the watch has listed every CR
    let mut changed_at = HashMap::new();
    for i in 0..changes {
        let name = format!("w{:06}", (i * 97) % rows + 1);
        let t = Instant::now();
        db.exec(&format!(
            r#"UPDATE "Containers" SET "environmentVars" = '{{"TZ":"UTC","CHANGE":"{i}"}}', "updatedAt" = '{}' WHERE hostname = '{name}'"#,
            now()
        ))
        .await;
        changed_at.insert(name, t);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while applied.lock().unwrap().len() < changed_at.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    let mut latencies: Vec<f64> = {
        let applied = applied.lock().unwrap();
        changed_at
            .iter()
            .filter_map(|(name, t)| applied.get(name).map(|a| a.duration_since(*t).as_secs_f64()))
            .collect()
    };
    latencies.sort_by(f64::total_cmp);
    let (rss, hwm) = memory_mib(pid);

    let report = serde_json::json!({
        "rows": total_rows,
        "engine": "PostgreSQL",
        "poll_interval_s": 2,
        "first_sync": {"wall_s": first_wall, "every_cr_created_s": every_cr_s, "resync_took_s": took(&first),
            "cpu_s": first_cpu, "writes": first_writes},
        "full_resync_no_changes": {"wall_s": took(&second), "cpu_s": idle_cpu, "writes": idle_writes},
        "row_change_to_cr_applied": {"changes": changed_at.len(), "observed": latencies.len(),
            "p50_s": percentile(&latencies, 50.0), "p99_s": percentile(&latencies, 99.0)},
        "memory_mib": {"rss": rss, "peak": hwm},
    });
    let dir = std::path::Path::new("target/bench");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("bridge.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    let mut writes: Vec<_> = first_writes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    writes.sort();
    println!(
        "\n## Bridge: {total_rows} rows on PostgreSQL\n\n| figure | value |\n|---|---|\n\
         | first sync, start to every CR created | {every_cr_s:.1} s wall |\n\
         | first sync, start to the first pass done (every CR and Secret written, the Secrets owned) | {first_wall:.1} s wall, {first_cpu:.1} s CPU |\n\
         | first sync API writes | {} |\n\
         | full resync, nothing to do | {:.2} s wall, {idle_cpu:.2} s CPU, {idle_writes} writes (Lease renewals not counted) |\n\
         | row change → CR applied ({} changes, poll 2 s) | p50 {:.2} s, p99 {:.2} s |\n\
         | memory | {rss:.0} MiB RSS, {hwm:.0} MiB peak |\n",
        writes.join(", "),
        took(&second),
        latencies.len(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
    );
    assert_eq!(latencies.len(), changed_at.len(), "every change reached its CR");
    bridge.stop().await;
    db.close().await;
}
