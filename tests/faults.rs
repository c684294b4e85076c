//! Operations: leader election and failover, clean shutdown, probes and metrics, credential
//! redaction, and recovery from control-plane faults (kube-apiserver and etcd stopped and
//! started again, the operator SIGKILLed mid-rollout).
//!
//! These tests start operators of their own (each under a ServiceAccount of its own, so the
//! audit log tells their writes apart, watching only the test's namespace) and stop and start
//! control-plane components, which would break tests running beside them. hack/test.sh runs
//! this binary after the main suite, alone, one test at a time (`--test-threads=1`), with the
//! suite's operator stopped.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::{Value, json};
use support::audit::{Write, deployment_writes_per_name, deployment_writes_since, timed_writes_by, user_agents};
use support::controlplane::Stopped;
use support::operator::{Operator, http_get, sample, service_account_kubeconfig, write_kubeconfig};
use support::workload::{TIMEOUT, apply, condition, condition_current, phase_of, wait_condition, wait_ready};
use support::{TestNamespace, eventually};

const LEASE: &str = "mw-operator";

/// `run` arguments confining an operator to the test namespace, its Lease included.
fn scoped(ns: &TestNamespace, extra: &[&str]) -> Vec<String> {
    let mut args = vec![format!("--namespace={}", ns.name), format!("--lease-namespace={}", ns.name)];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn spec(image: &str) -> Value {
    json!({"image": image, "progressDeadlineSeconds": 3600})
}

fn image_of(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.image.clone()
}

/// Every one of `names` Ready and Running at its current generation, with its Deployment
/// running `image`.
async fn all_converged(ns: &TestNamespace, names: &[String], image: &str, timeout: Duration) {
    let workloads = ns.api::<ManagedWorkload>();
    let deployments = ns.api::<Deployment>();
    eventually(&format!("{} workloads to run {image}", names.len()), timeout, || async {
        let listed = workloads.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let ready = listed
            .items
            .iter()
            .filter(|mw| names.contains(&mw.name_any()))
            .filter(|mw| mw.spec.image == image && condition_current(mw, "Ready", "True"))
            .count();
        let running = deployments
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|d| image_of(d).as_deref() == Some(image))
            .count();
        if ready == names.len() && running == names.len() {
            Ok(())
        } else {
            Err(format!("{ready} Ready and {running} Deployments on {image} of {}", names.len()))
        }
    })
    .await;
}

fn exactly_once(counts: &std::collections::BTreeMap<String, usize>, names: &[String], what: &str) {
    written(counts, names, 1..=1, what);
}

/// Each of `names`' Deployments written a number of `times` in the audit log's `counts`.
fn written(
    counts: &std::collections::BTreeMap<String, usize>,
    names: &[String],
    times: std::ops::RangeInclusive<usize>,
    what: &str,
) {
    let count = |n: &String| counts.get(n).copied().unwrap_or(0);
    let wrong: Vec<_> = names.iter().map(|n| (n, count(n))).filter(|(_, c)| !times.contains(c)).collect();
    assert!(wrong.is_empty(), "{what}: every Deployment written {times:?} times, but (name, writes): {wrong:?}");
}

/// Two operators confined to the test namespace, `a` leading (on `config_a`, with `a_args`)
/// and `b` ready on standby, and `count` workloads running nginx:1.26 under `a`.
async fn leader_standby_and_workloads(
    ns: &TestNamespace,
    (config_a, a_args): (&std::path::Path, &[&str]),
    config_b: &std::path::Path,
    count: usize,
    timeout: Duration,
) -> (Operator, Operator, Vec<String>) {
    let a = Operator::start(&format!("{}-a", ns.name), config_a, &scoped(ns, a_args));
    a.wait_leader(LEASE, TIMEOUT).await;
    let b = Operator::start(&format!("{}-b", ns.name), config_b, &scoped(ns, &["--concurrency=4"]));
    b.wait_ready(TIMEOUT).await;
    let names: Vec<String> = (0..count).map(|i| format!("w{i:02}")).collect();
    let workloads = ns.api::<ManagedWorkload>();
    for name in &names {
        apply(&workloads, name, spec("nginx:1.26")).await.unwrap();
    }
    all_converged(ns, &names, "nginx:1.26", timeout).await;
    (a, b, names)
}

/// Of `old` (the old leader's writes), those the API server completed at or after the new
/// leader's first write, which is its taking of the Lease (as a standby it wrote nothing).
fn written_after_takeover(old: Vec<(Timestamp, Write)>, new_leader: &str, ns: &str) -> Vec<(Timestamp, Write)> {
    let writes_b = timed_writes_by(new_leader, ns);
    let (first_b, first) = writes_b.first().expect("the new leader wrote");
    assert_eq!(first.resource, "leases", "the standby's first write takes the Lease: {writes_b:?}");
    old.into_iter().filter(|(t, _)| t >= first_b).collect()
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn the_standby_takes_over_when_the_leader_is_killed_and_wrote_nothing_before() {
    let ns = TestNamespace::new("failover").await;
    let (config_a, _, user_a) = service_account_kubeconfig(&ns, "op-a").await;
    let (config_b, _, user_b) = service_account_kubeconfig(&ns, "op-b").await;
    let leader = (config_a.as_path(), &["--concurrency=4"][..]);
    let (mut a, b, names) = leader_standby_and_workloads(&ns, leader, &config_b, 50, Duration::from_secs(180)).await;
    assert_eq!(b.metric(&format!("leader_election_master_status{{name=\"{LEASE}\"}}")).await, Some(0.0));
    let workloads = ns.api::<ManagedWorkload>();

    // The standby is ready, warm and silent: it wrote nothing at all so far.
    let standby = timed_writes_by(&user_b, &ns.name);
    assert!(standby.is_empty(), "the standby wrote before it led: {standby:?}");
    // Its cache is warm: it sees all 50 Running (the gauge is refreshed every 5 s).
    eventually("the standby to count 50 Running workloads", TIMEOUT, || async {
        match b.metric("mw_operator_workloads{phase=\"Running\"}").await {
            Some(50.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(user_agents(&user_a, &ns.name), [format!("mw-operator/{}", env!("CARGO_PKG_VERSION"))].into());

    // Change all 50 and kill the leader while it is working through them.
    let changed_at = Timestamp::now();
    for name in &names {
        apply(&workloads, name, spec("nginx:1.27")).await.unwrap();
    }
    a.signal("KILL");
    let killed = Instant::now();
    let killed_at = Timestamp::now();
    assert!(a.wait_exit(Duration::from_secs(10)).await.is_some());

    b.wait_leader(LEASE, Duration::from_secs(60)).await;
    let takeover = killed.elapsed();
    all_converged(&ns, &names, "nginx:1.27", Duration::from_secs(240)).await;
    let converged = killed.elapsed();
    eprintln!(
        "failover: standby led {takeover:?} after the leader's SIGKILL (lease 15 s), 50 workloads converged after {converged:?}"
    );

    // From the audit log: the standby's first write of anything is its Lease, after the
    // leader died, and everything it wrote came after that.
    let writes_b = timed_writes_by(&user_b, &ns.name);
    let first = writes_b.first().expect("the new leader wrote");
    assert_eq!(first.1.resource, "leases", "the standby's first write takes the Lease: {writes_b:?}");
    assert!(first.0 > killed_at, "the standby wrote at {} before the leader died at {killed_at}", first.0);
    // Every pending change reached its Deployment exactly once. What the audit log can show:
    // at most one accepted Deployment write per workload since the change, by either replica;
    // where there is none, the killed leader had that write in flight (the API server applied
    // it but logs it as failed, 504, its client being gone before the answer), and nothing
    // else wrote it. What the Deployments show: each changed once (generation 2: created,
    // then the one change), so no change was applied twice.
    let counts = deployment_writes_since(&[&user_a, &user_b], &ns.name, changed_at);
    let attempts = timed_writes_by(&user_a, &ns.name);
    let in_flight: Vec<&Write> = attempts.iter().filter(|(t, _)| *t > changed_at).map(|(_, w)| w).collect();
    let in_flight = deployment_writes_per_name(&in_flight);
    let deployments_now: Api<Deployment> = ns.api();
    for name in &names {
        match counts.get(name) {
            Some(1) => {}
            None => assert!(
                in_flight.contains_key(name),
                "{name}: changed without any write since the change, accepted or in flight"
            ),
            Some(n) => panic!("{name}: {n} accepted Deployment writes since the change, not one"),
        }
        let generation = deployments_now.get(name).await.unwrap().metadata.generation;
        assert_eq!(generation, Some(2), "{name}: created, then changed exactly once");
    }
    let by_b = writes_b.iter().filter(|(_, w)| w.resource == "deployments").count();
    eprintln!("failover: of 50 changed Deployments the new leader wrote {by_b}, the killed leader {}", 50 - by_b);
    let deployments = ns.api::<Deployment>().list(&ListParams::default()).await.unwrap();
    assert_eq!(deployments.items.len(), 50, "no duplicate Deployments");
}

/// Fencing: a leader whose connection to the API server stops forwarding without closing (a
/// black hole, not a refused connection) stops acting on its own before the standby can take
/// the Lease, so, judged from the audit log by identity, it makes no write after the
/// standby's first, not even once the path heals and its requests get through again.
#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn a_black_holed_leader_stops_writing_before_the_standby_takes_over() {
    let ns = TestNamespace::new("blackhole").await;
    let (config_a, _, user_a) = service_account_kubeconfig(&ns, "op-a").await;
    let (config_b, _, user_b) = service_account_kubeconfig(&ns, "op-b").await;
    let proxy = support::proxy::Proxy::start(support::proxy::api_server()).await;
    let proxied = config_a.with_extension("proxied");
    proxy.kubeconfig(config_a.to_str().unwrap(), &proxied);
    let through = std::fs::read_to_string(&proxied).unwrap();
    assert!(through.contains(&proxy.addr.to_string()), "the leader's kubeconfig points at the proxy: {through}");
    let leader = (proxied.as_path(), &["--concurrency=4"][..]);
    let (a, b, names) = leader_standby_and_workloads(&ns, leader, &config_b, 10, Duration::from_secs(120)).await;
    let workloads = ns.api::<ManagedWorkload>();

    // The leader's path goes dark while workloads keep changing, so it has work it would do.
    proxy.black_hole();
    let dark = Instant::now();
    let mut round = 0;
    let mut led = None;
    while dark.elapsed() < Duration::from_secs(60) {
        round += 1;
        let name = &names[round % names.len()];
        apply(&workloads, name, spec(&format!("nginx:1.{}", 30 + round))).await.unwrap();
        if led.is_none() && b.metric(&format!("leader_election_master_status{{name=\"{LEASE}\"}}")).await == Some(1.0) {
            led = Some(dark.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let led = led.expect("the standby took over within 60 s of the leader's path going dark");
    // The old leader has given up by its own clock (the standby could not lead before that).
    eprintln!("black hole: the standby led {led:?} after the leader's path went dark (lease 15 s)");
    // Heal the path: whatever the old leader still wanted to write would get through now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.heal();
    for name in &names {
        apply(&workloads, name, spec("nginx:1.27")).await.unwrap();
    }
    all_converged(&ns, &names, "nginx:1.27", Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Every write the old leader sent, refused ones too: one that reached the API server after
    // the standby's first write (queued behind the black hole, say) is a fencing failure even
    // where the API server happened to refuse it.
    let late = written_after_takeover(timed_writes_by(&user_a, &ns.name), &user_b, &ns.name);
    assert!(late.is_empty(), "the black-holed leader wrote after the standby's first write: {late:?}");
    // And it knew: its term ended, by its own clock, before the standby's first write.
    // (The operators under test log JSON lines.)
    let ended = a
        .output()
        .lines()
        .find(|l| l.contains("leadership ended"))
        .and_then(|l| serde_json::from_str::<Value>(l).ok()?["timestamp"].as_str()?.parse::<Timestamp>().ok())
        .expect("the old leader logged the end of its term");
    let writes_b = timed_writes_by(&user_b, &ns.name);
    let first_b = writes_b.first().map(|(at, _)| *at).expect("the new leader wrote");
    assert!(ended < first_b, "the old leader's term ended at {ended}, after the standby's first write at {first_b}");
    let by_b = writes_b.iter().filter(|(_, w)| w.resource == "deployments").count();
    assert!(by_b >= names.len(), "the new leader applied every change after the heal ({by_b} Deployment writes)");
    drop(a);
}

/// Fencing against a pause: a leader stopped (SIGSTOP: a frozen VM, a starved or suspended
/// process) while it works through changes, and resumed once the standby has taken over and
/// written, makes no write after the standby's first, judged from the audit log by identity:
/// not the reconciles it was in the middle of, not the Events they queued, not a status.
#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn a_paused_leader_writes_nothing_once_the_standby_leads() {
    let ns = TestNamespace::new("paused").await;
    let (config_a, _, user_a) = service_account_kubeconfig(&ns, "op-a").await;
    let (config_b, _, user_b) = service_account_kubeconfig(&ns, "op-b").await;
    // One reconcile at a time: the leader works through the changes below one by one, so it
    // is stopped with work in hand (a reconcile between its apply and its status write, Events
    // queued, more waiting).
    let leader = (config_a.as_path(), &["--concurrency=1"][..]);
    let (a, b, names) = leader_standby_and_workloads(&ns, leader, &config_b, 30, Duration::from_secs(120)).await;
    let workloads = ns.api::<ManagedWorkload>();

    // Every workload changes at once, and the leader stops while it works through them.
    let changed_at = Timestamp::now();
    let changes = names.iter().map(|name| apply(&workloads, name, spec("nginx:1.27")));
    for changed in futures::future::join_all(changes).await {
        changed.unwrap();
    }
    a.signal("STOP");
    let paused = Instant::now();
    b.wait_leader(LEASE, Duration::from_secs(60)).await;
    let led = paused.elapsed();
    // The new leader finishes what the old one had in hand, and makes a change of its own.
    all_converged(&ns, &names, "nginx:1.27", Duration::from_secs(120)).await;
    apply(&workloads, &names[0], spec("nginx:1.28")).await.unwrap();
    all_converged(&ns, &names[..1], "nginx:1.28", TIMEOUT).await;

    a.signal("CONT");
    // The evidence that the resumed replica is done with its term: it says it stands by.
    eventually("the resumed leader to stand by", TIMEOUT, || async {
        let log = a.output();
        let ended = log.lines().filter(|l| l.contains("leadership ended")).count();
        let standing_by = log.lines().filter(|l| l.contains("\"standing by\"")).count();
        if ended == 1 && standing_by == 1 { Ok(()) } else { Err(format!("log: {}", a.log.display())) }
    })
    .await;
    // Whatever it sent before it said so is in the audit log before the new leader's answer
    // to a change made after it (a sentinel, read back from the same log).
    let sentinel_at = Timestamp::now();
    apply(&workloads, &names[1], spec("nginx:1.28")).await.unwrap();
    eventually("the new leader's write of the sentinel change in the audit log", TIMEOUT, || async {
        let writes = timed_writes_by(&user_b, &ns.name);
        let logged = writes.iter().any(|(t, w)| {
            *t > sentinel_at && w.resource == "deployments" && w.name.as_deref() == Some(names[1].as_str())
        });
        if logged { Ok(()) } else { Err("not yet".to_string()) }
    })
    .await;

    // Attempts count, accepted or not: a write the API server refused was still sent.
    let writes_a = timed_writes_by(&user_a, &ns.name);
    let late = written_after_takeover(writes_a.clone(), &user_b, &ns.name);
    assert!(late.is_empty(), "the paused leader wrote after the new leader's first write: {late:?}");
    // The controls: the old leader was stopped with changes left undone (the new leader
    // applied them, and the same audit log shows it), and it wrote before it stopped.
    let done_by_a = deployment_writes_since(&[&user_a], &ns.name, changed_at).values().sum::<usize>();
    let done_by_b = deployment_writes_since(&[&user_b], &ns.name, changed_at).values().sum::<usize>();
    assert!(done_by_a < names.len(), "the leader finished all {} changes before it was stopped", names.len());
    assert!(done_by_b > names.len() - done_by_a, "the new leader's writes are in the log: {done_by_b}");
    assert!(writes_a.iter().any(|(t, _)| *t > changed_at), "the old leader wrote once the changes came");
    let refused = a.output().lines().filter(|l| l.contains("write refused")).count();
    eprintln!(
        "pause: the standby led {led:?} after the leader's SIGSTOP (lease 15 s); the old leader applied {done_by_a} of \
         {} changes before, the new one the rest; the resumed leader refused {refused} writes",
        names.len()
    );
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn sigterm_finishes_releases_the_lease_and_exits_zero() {
    let ns = TestNamespace::new("shutdown").await;
    let (config_a, _, _) = service_account_kubeconfig(&ns, "op-a").await;
    let (config_b, _, _) = service_account_kubeconfig(&ns, "op-b").await;
    // A long Lease: the standby can only lead well within it if the Lease was released.
    let lease = ["--lease-duration=120", "--lease-grace=10"];
    let mut a =
        Operator::start(&format!("{}-a", ns.name), &config_a, &scoped(&ns, &[&lease[..], &["--identity=a"]].concat()));
    a.wait_leader(LEASE, TIMEOUT).await;
    let b =
        Operator::start(&format!("{}-b", ns.name), &config_b, &scoped(&ns, &[&lease[..], &["--identity=b"]].concat()));
    b.wait_ready(TIMEOUT).await;
    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "web", spec("nginx:1.26")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;

    // Work in flight when the signal comes.
    apply(&workloads, "web", spec("nginx:1.27")).await.unwrap();
    a.signal("TERM");
    let started = Instant::now();
    let status = a.wait_exit(Duration::from_secs(30)).await.expect("the operator to exit within 30 s of SIGTERM");
    let shutdown = started.elapsed();
    assert!(status.success(), "exit status {status:?}; log: {}", a.log.display());
    let log = a.output();
    assert!(log.contains("lease released"), "the Lease was released: {}", a.log.display());

    b.wait_leader(LEASE, Duration::from_secs(60)).await;
    let takeover = started.elapsed();
    eprintln!("shutdown: exited 0 {shutdown:?} after SIGTERM; the standby led {takeover:?} after it (lease 120 s)");
    let held = Api::<Lease>::namespaced(ns.client.clone(), &ns.name).get(LEASE).await.unwrap();
    assert_eq!(held.spec.and_then(|s| s.holder_identity).as_deref(), Some("b"));
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(mw.spec.image, "nginx:1.27");
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn probes_and_metrics_report_what_happened() {
    let ns = TestNamespace::new("metrics").await;
    let (config, _, _) = service_account_kubeconfig(&ns, "op").await;
    let op = Operator::start(&ns.name, &config, &scoped(&ns, &["--concurrency=3"]));
    op.wait_ready(TIMEOUT).await;
    op.wait_leader(LEASE, TIMEOUT).await;
    assert_eq!(op.get("/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(op.get("/nope").await.map(|r| r.0), Some(404));

    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "web", spec("nginx:latest")).await.unwrap();
    apply(&workloads, "broken", spec("kwok.example/image-pull-backoff")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    wait_condition(&workloads, "broken", "Stalled", "True").await;

    eventually("the metrics to show the reconciles, writes and phases", TIMEOUT, || async {
        let (status, body) = op.get("/metrics").await.ok_or("no answer")?;
        let value = |series: &str| sample(&body, series);
        let checks = [
            (status == 200, "status 200".to_string()),
            (
                value(r#"controller_runtime_reconcile_total{controller="managedworkload",result="success"}"#)
                    >= Some(2.0),
                "reconciles".into(),
            ),
            (
                value(r#"controller_runtime_max_concurrent_reconciles{controller="managedworkload"}"#) == Some(3.0),
                "max concurrent".into(),
            ),
            (
                value(r#"controller_runtime_active_workers{controller="managedworkload"}"#).is_some(),
                "active workers".into(),
            ),
            (
                value(r#"controller_runtime_reconcile_time_seconds_count{controller="managedworkload"}"#) >= Some(2.0),
                "duration histogram".into(),
            ),
            (
                value(r#"mw_operator_api_writes_total{resource="deployments",verb="apply"}"#) == Some(2.0),
                "two Deployments applied".into(),
            ),
            (
                value(r#"mw_operator_api_writes_total{resource="managedworkloads/status",verb="patch"}"#) >= Some(2.0),
                "status writes".into(),
            ),
            (value(r#"mw_operator_workloads{phase="Running"}"#) == Some(1.0), "one Running".into()),
            (value(r#"mw_operator_workloads{phase="Failed"}"#) == Some(1.0), "one Failed".into()),
            (value(r#"leader_election_master_status{name="mw-operator"}"#) == Some(1.0), "leading".into()),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            None => Ok(()),
            Some((_, what)) => Err(format!("{what} wrong in:\n{body}")),
        }
    })
    .await;
}

/// The material a kubeconfig's credentials consist of, as it could leak: the token, and the
/// base64 lines of the PEM key and certificate (what a dump of the file or the decoded
/// PEM would show), and the whole base64 of each as it stands in the kubeconfig.
fn secrets_of(token: &str, key_pem: &str, cert_pem: &str, data: &[&str]) -> Vec<String> {
    let mut needles = vec![token.to_string()];
    for pem in [key_pem, cert_pem] {
        needles.extend(pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 40).map(String::from));
    }
    // Any 40-character stretch of the inline data (a line-wrapped dump would still match one).
    for d in data {
        needles
            .extend(d.as_bytes().chunks(40).filter(|c| c.len() == 40).map(|c| String::from_utf8_lossy(c).into_owned()));
    }
    needles
}

/// A burst of workloads (each reconcile with an apply and a status write in flight at once)
/// leaves the operator with one connection per client to the API server: its watches, its
/// reads and writes, and the leader's fenced writes, each multiplexed over HTTP/2. Over
/// HTTP/1.1 every request in flight held a TLS connection of its own, kept for half a minute
/// after the burst.
#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they start operators of their own"]
async fn a_burst_of_workloads_shares_one_connection_per_client() {
    let ns = TestNamespace::new("connections").await;
    let (config, _, _) = service_account_kubeconfig(&ns, "op").await;
    let server =
        kube::config::Kubeconfig::read_from(&config).unwrap().clusters[0].cluster.as_ref().unwrap().server.clone();
    let port: u16 = server.unwrap().rsplit_once(':').unwrap().1.trim_end_matches('/').parse().unwrap();
    let op = Operator::start(&ns.name, &config, &scoped(&ns, &[]));
    op.wait_leader(LEASE, TIMEOUT).await;

    let names: Vec<String> = (0..40).map(|i| format!("w{i:02}")).collect();
    let workloads = ns.api::<ManagedWorkload>();
    futures::future::try_join_all(names.iter().map(|name| apply(&workloads, name, spec("nginx:1.26")))).await.unwrap();
    all_converged(&ns, &names, "nginx:1.26", TIMEOUT).await;
    let open = support::procfs::connections_to(op.pid, port);
    assert!((1..=3).contains(&open), "{open} connections to the API server after the burst; log: {}", op.log.display());
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn credentials_never_appear_in_output_events_or_status() {
    use k8s_openapi::ByteString;
    let ns = TestNamespace::new("redaction").await;
    let (_, token, _) = service_account_kubeconfig(&ns, "leaky").await;
    let admin = std::env::var("MW_TEST_KUBECONFIG").unwrap();
    let pki = std::path::Path::new(&admin).parent().unwrap().join("pki");
    let key = std::fs::read_to_string(pki.join("operator.key")).expect("the operator's client key");
    let cert = std::fs::read_to_string(pki.join("operator.crt")).expect("the operator's client certificate");
    let b64 = |s: &str| serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap().as_str().unwrap().to_string();
    let (key_data, cert_data) = (b64(&key), b64(&cert));
    let user = json!({"token": token, "client-certificate-data": cert_data, "client-key-data": key_data});
    let config = write_kubeconfig(&ns.name, "leaky-full", user.clone());
    // The client certificate wins: it runs as user mw-operator, whose Lease is granted per namespace.
    let operator_user = json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mw-operator"});
    support::operator::grant_leader_election(&ns, "user-leader-election", operator_user).await;

    // A workload blocked by a foreign Deployment and one the API server refuses: errors
    // reported in status and Events.
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "taken"},
        "spec": {"selector": {"matchLabels": {"app": "x"}},
                 "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "redis"}]}}}
    }))
    .unwrap();
    ns.api::<Deployment>().create(&PostParams::default(), &foreign).await.unwrap();
    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "taken", spec("nginx:latest")).await.unwrap();
    apply(&workloads, "fails", spec("kwok.example/image-pull-backoff")).await.unwrap();

    let mut outputs = Vec::new();
    {
        let mut op = Operator::start(&format!("{}-full", ns.name), &config, &scoped(&ns, &[]));
        op.wait_ready(TIMEOUT).await;
        wait_condition(&workloads, "taken", "Stalled", "True").await;
        wait_condition(&workloads, "fails", "Stalled", "True").await;
        // The API server goes away under it for a few seconds: connection errors, retries.
        let stopped = Stopped::stop("kube-apiserver");
        tokio::time::sleep(Duration::from_secs(5)).await;
        stopped.start();
        op.signal("TERM");
        op.wait_exit(Duration::from_secs(30)).await.expect("exit on SIGTERM");
        outputs.push(op.output());
    }
    // Refused credentials, a forbidden namespace, a missing context, an unverified server:
    // each ends the process with an error that must not quote the kubeconfig.
    // One character changed inside the signature, where every bit counts. (Changing the last
    // one did not always invalidate it: the last base64url character of an RS256 signature
    // carries only 2 bits, and a decoder that ignores the rest accepted about one in four of
    // such "wrong" tokens, which then led to a 403, not the 401 this case is about.)
    let at = token.len() - 10;
    let swapped = if token.as_bytes()[at] == b'A' { "B" } else { "A" };
    let wrong_token = format!("{}{swapped}{}", &token[..at], &token[at + 1..]);
    let failing = [
        ("unauthorized", write_kubeconfig(&ns.name, "leaky-wrong", json!({"token": wrong_token})), vec![]),
        (
            "forbidden",
            write_kubeconfig(&ns.name, "leaky-token", json!({"token": token})),
            vec!["--namespace=kube-system".to_string()],
        ),
        ("no-context", config.clone(), vec!["--context=nope".to_string()]),
    ];
    for (label, kubeconfig, extra) in failing {
        let mut op = Operator::start(&format!("{}-{label}", ns.name), &kubeconfig, &extra);
        let status = op.wait_exit(Duration::from_secs(60)).await.expect("the operator to give up");
        assert!(!status.success(), "{label}: {}", op.output());
        outputs.push(op.output());
    }
    let mut insecure: Value = serde_saphyr::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    insecure["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = json!(true);
    let insecure_path = config.with_extension("insecure");
    std::fs::write(&insecure_path, serde_json::to_string(&insecure).unwrap()).unwrap();
    let mut op = Operator::start(&format!("{}-insecure", ns.name), &insecure_path, &[]);
    op.wait_exit(Duration::from_secs(30)).await.expect("refused at once");
    outputs.push(op.output());

    let all_output = outputs.join("\n");
    assert!(all_output.contains("Unauthorized") || all_output.contains("401"), "the errors were driven: {all_output}");
    assert!(all_output.contains("forbidden"), "a forbidden error was driven");
    assert!(all_output.contains("insecure-skip-tls-verify"), "the insecure kubeconfig was refused");

    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name).list(&ListParams::default()).await.unwrap();
    assert!(!events.items.is_empty(), "the operator recorded Events");
    let statuses = workloads.list(&ListParams::default()).await.unwrap();
    let written = format!(
        "{}\n{}",
        serde_json::to_string(&events.items).unwrap(),
        serde_json::to_string(&statuses.items.iter().map(|mw| &mw.status).collect::<Vec<_>>()).unwrap()
    );
    for needle in secrets_of(&token, &key, &cert, &[&key_data, &cert_data]).iter().chain([&wrong_token]) {
        assert!(!all_output.contains(needle.as_str()), "credential material in the operator's output: {needle}");
        assert!(!written.contains(needle.as_str()), "credential material in an Event or status: {needle}");
    }
    eprintln!(
        "redaction: searched {} bytes of output and {} bytes of Events and status",
        all_output.len(),
        written.len()
    );
}

/// A namespace `label` with one operator confined to it (under a ServiceAccount of its own,
/// whose API user is returned for the audit log), leading, and `count` workloads running
/// nginx:1.26 under it.
async fn operator_and_workloads(label: &str, count: usize) -> (TestNamespace, Operator, String, Vec<String>) {
    let ns = TestNamespace::new(label).await;
    let (config, _, user) = service_account_kubeconfig(&ns, "op").await;
    let op = Operator::start(&ns.name, &config, &scoped(&ns, &[]));
    op.wait_leader(LEASE, TIMEOUT).await;
    let names: Vec<String> = (0..count).map(|i| format!("w{i:02}")).collect();
    let workloads = ns.api::<ManagedWorkload>();
    for name in &names {
        apply(&workloads, name, spec("nginx:1.26")).await.unwrap();
    }
    all_converged(&ns, &names, "nginx:1.26", TIMEOUT).await;
    (ns, op, user, names)
}

/// One operator through a fault: five workloads changed just before it, five changed
/// once it is over. Each change is applied once, none twice, and the process never restarted.
/// `settle_first`: let the rollouts of the changes made before the outage finish before it
/// starts, where kwok would otherwise stall them (see the two callers).
async fn survives(label: &str, component: &'static str, down_for: Duration, settle_first: bool) {
    let (ns, mut op, user, names) = operator_and_workloads(label, 10).await;
    let workloads = ns.api::<ManagedWorkload>();

    let (before, after) = names.split_at(5);
    let changed_at = Timestamp::now();
    for name in before {
        apply(&workloads, name, spec("nginx:1.27")).await.unwrap();
    }
    if settle_first {
        all_converged(&ns, before, "nginx:1.27", TIMEOUT).await;
    }
    let stopped = Stopped::stop(component);
    let outage = Instant::now();
    tokio::time::sleep(down_for).await;
    stopped.start();
    for name in after {
        apply(&workloads, name, spec("nginx:1.27")).await.unwrap();
    }
    all_converged(&ns, &names, "nginx:1.27", Duration::from_secs(180)).await;
    eprintln!("{label}: {component} down for {down_for:?}; all converged {:?} after it stopped", outage.elapsed());
    assert!(op.running(), "the operator process restarted or died; log: {}", op.log.display());
    let counts = deployment_writes_since(&[&user], &ns.name, changed_at);
    if settle_first {
        exactly_once(&counts, &names, label);
    } else {
        // The API server records a write in the audit log only after etcd has it, so a write
        // in flight when it was SIGKILLed can be made with no record (the operator's re-list
        // then finds that Deployment done and rightly writes nothing): none twice, but one of
        // those changed before may show no write at all. CI met this once (w03, 2026-12-07).
        written(&counts, before, 0..=1, label);
        exactly_once(&counts, after, label);
    }
    let deployments = ns.api::<Deployment>().list(&ListParams::default()).await.unwrap();
    assert_eq!(deployments.items.len(), names.len());
    let restarts = op.metric("mw_operator_watch_restarts_total{resource=\"managedworkloads\"}").await;
    eprintln!("{label}: watch restarts of the ManagedWorkload watch: {restarts:?}");
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn kube_apiserver_stopped_for_30_seconds() {
    // Changes still rolling out when it dies: kwok's watches break with it, and the re-list
    // after the restart picks them up. (Rollouts finished before it would not do: 30 s
    // outlasts the node-monitor grace period, kube-controller-manager marks their Pods not
    // ready, and kwok, unlike a kubelet, never reports them ready again.)
    survives("apiserver-outage", "kube-apiserver", Duration::from_secs(30), false).await;
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn etcd_stopped_and_started_again() {
    // Rollouts finish first: a Pod status patch kwok sends while etcd is down gets a 500, and
    // kwok, unlike a kubelet, never retries it (its watches did not break, so nothing makes
    // it look at that Pod again), which would stall a rollout for a reason outside the operator.
    survives("etcd-outage", "etcd", Duration::from_secs(10), true).await;
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn sigkill_mid_rollout_then_restart() {
    let ns = TestNamespace::new("sigkill").await;
    let (config, _, user) = service_account_kubeconfig(&ns, "op").await;
    // A fixed identity, as a restarted Pod keeps its name: the new process is the Lease's holder.
    let args = scoped(&ns, &["--identity=op-0"]);
    let mut op = Operator::start(&format!("{}-1", ns.name), &config, &args);
    op.wait_leader(LEASE, TIMEOUT).await;
    let workloads = ns.api::<ManagedWorkload>();
    apply(&workloads, "web", spec("nginx:1.26")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;

    // Mid-rollout: the operator has applied the new template; the rollout is not done yet.
    let changed_at = Timestamp::now();
    let changed = apply(&workloads, "web", spec("nginx:1.27")).await.unwrap();
    let deployments = ns.api::<Deployment>();
    support::wait_until(&deployments, "web", "the new template applied", TIMEOUT, |d: Option<&Deployment>| {
        d.and_then(image_of).as_deref() == Some("nginx:1.27")
    })
    .await;
    op.signal("KILL");
    op.wait_exit(Duration::from_secs(10)).await.expect("SIGKILL ends it");

    let restarted = Operator::start(&format!("{}-2", ns.name), &config, &args);
    restarted.wait_leader(LEASE, TIMEOUT).await;
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(mw.status.as_ref().unwrap().observed_generation, changed.metadata.generation);
    assert_eq!(condition(&mw, "Available").observed_generation, changed.metadata.generation);
    assert_eq!(phase_of(&mw), Some(Phase::Running));
    let all = deployments.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1, "no duplicate Deployment");
    exactly_once(&deployment_writes_since(&[&user], &ns.name, changed_at), &["web".to_string()], "across the restart");
}

#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn the_charts_two_replicas_pass_their_probes() {
    let ns = TestNamespace::new("chart-replicas").await;
    let helm = std::env::var("MW_TEST_HELM").expect("MW_TEST_HELM");
    let rendered = std::process::Command::new(&helm)
        .args(["template", &ns.name, "charts/mw-operator", "--namespace", &ns.name])
        .args(["--set", &format!("watchNamespaces={{{}}}", ns.name), "--show-only", "templates/deployment.yaml"])
        .output()
        .expect("running helm");
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let deployment: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&rendered.stdout)).unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], container["ports"][0]["name"]);
    let env_names: Vec<&str> =
        container["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert!(env_names.contains(&"POD_NAME") && env_names.contains(&"POD_NAMESPACE"), "{env_names:?}");

    // Its ServiceAccount and RBAC from the chart, and a token for that account: the replicas
    // run as the chart's identity with the chart's arguments, as two Pods would.
    let all = std::process::Command::new(&helm)
        .args(["template", &ns.name, "charts/mw-operator", "--namespace", &ns.name])
        .args(["--set", &format!("watchNamespaces={{{}}}", ns.name)])
        .args(["--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"])
        .output()
        .expect("running helm");
    let kubectl = std::process::Command::new("bash").args(["hack/controlplane.sh", "bin-dir"]).output().unwrap();
    let kubectl = format!("{}/kubectl", String::from_utf8_lossy(&kubectl.stdout).trim());
    let mut apply = std::process::Command::new(kubectl)
        .args(["--kubeconfig", &std::env::var("MW_TEST_KUBECONFIG").unwrap(), "apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(apply.stdin.as_mut().unwrap(), &all.stdout).unwrap();
    drop(apply.stdin.take());
    assert!(apply.wait().unwrap().success(), "kubectl apply of the chart's account and RBAC");
    let account = pod["serviceAccountName"].as_str().unwrap();
    let token = support::operator::token_for(&ns, account).await;
    let kubeconfig = write_kubeconfig(&ns.name, account, json!({"token": token}));

    let args: Vec<String> =
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let mut replicas = Vec::new();
    for pod_name in ["replica-a", "replica-b"] {
        let address = support::operator::free_address();
        let args: Vec<String> =
            args.iter()
                .map(|a| {
                    if a.starts_with("--metrics-address=") { format!("--metrics-address={address}") } else { a.clone() }
                })
                .collect();
        assert!(args.iter().any(|a| a == &format!("--metrics-address={address}")), "{args:?}");
        let kubeconfig = kubeconfig.display().to_string();
        let env = [("POD_NAME", pod_name), ("POD_NAMESPACE", ns.name.as_str()), ("MW_KUBECONFIG", kubeconfig.as_str())];
        replicas.push(Operator::spawn(&format!("{}-{pod_name}", ns.name), &args, &env, address));
    }
    let (readiness, liveness) = (
        container["readinessProbe"]["httpGet"]["path"].as_str().unwrap(),
        container["livenessProbe"]["httpGet"]["path"].as_str().unwrap(),
    );
    for replica in &replicas {
        eventually("both probes to pass", TIMEOUT, || async {
            let ready = http_get(replica.metrics, readiness).await;
            let live = http_get(replica.metrics, liveness).await;
            match (ready, live) {
                (Some((200, _)), Some((200, _))) => Ok(()),
                other => Err(format!("{other:?}; log {}", replica.log.display())),
            }
        })
        .await;
    }
    // Exactly one leads, and the Lease names it by its Pod name.
    let leader = eventually_leader(&replicas).await;
    let lease = Api::<Lease>::namespaced(ns.client.clone(), &ns.name).get(LEASE).await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(["replica-a", "replica-b"][leader]));
    eprintln!("chart: both replicas ready and live on port {port}'s probes; replica {leader} leads");
}

async fn eventually_leader(replicas: &[Operator]) -> usize {
    let series = format!("leader_election_master_status{{name=\"{LEASE}\"}}");
    let statuses = || async {
        let mut values = Vec::new();
        for r in replicas {
            values.push(r.metric(&series).await);
        }
        values
    };
    eventually("exactly one replica to lead", TIMEOUT, || async {
        let values = statuses().await;
        let leaders = values.iter().filter(|v| **v == Some(1.0)).count();
        if leaders == 1 && values.iter().all(Option::is_some) { Ok(()) } else { Err(format!("{values:?}")) }
    })
    .await;
    statuses().await.iter().position(|v| *v == Some(1.0)).unwrap_or(usize::MAX)
}

/// Workloads deleted and re-created under their names just after kube-apiserver comes back,
/// while the operator's watches are still reconnecting (their last resourceVersion has expired
/// in the restarted server's watch cache, so each re-lists). What it guards: every successor is
/// seen and reconciled at once, not at the next periodic resync, and gets exactly one
/// Deployment write. It does not reproduce the race `make soak` found at 5,000 workloads (a
/// reconcile reading a predecessor from a cache still re-listing): at 20 workloads the re-list
/// is usually over before the first successor is reconciled, so this test seldom meets that
/// race and is no proof of its fix; `make soak` is where the race shows.
#[tokio::test]
#[ignore = "hack/test.sh runs these alone, after the main suite: they stop control-plane components"]
async fn workloads_recreated_as_the_api_server_returns_are_reconciled() {
    let (ns, mut op, user, names) = operator_and_workloads("recreate-outage", 20).await;
    let workloads = ns.api::<ManagedWorkload>();

    let stopped = Stopped::stop("kube-apiserver");
    tokio::time::sleep(Duration::from_secs(5)).await;
    stopped.start();
    let returned = Instant::now();
    let recreated_at = Timestamp::now();
    for name in &names {
        workloads.delete(name, &Default::default()).await.unwrap();
        apply(&workloads, name, spec("nginx:1.27")).await.unwrap();
    }
    // kube-controller-manager's garbage collector stops collecting once its API server was
    // killed under it (see docs/performance.md); a restart collects the predecessors' objects.
    Stopped::stop("kube-controller-manager").start();
    all_converged(&ns, &names, "nginx:1.27", Duration::from_secs(120)).await;
    eprintln!("re-created after the outage: all converged {:?} after the API server returned", returned.elapsed());
    assert!(op.running(), "the operator process restarted or died; log: {}", op.log.display());
    exactly_once(&deployment_writes_since(&[&user], &ns.name, recreated_at), &names, "recreate-outage");
}
