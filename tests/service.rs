//! The workload's Service (`spec.service`, issue 15) against the local control plane: its
//! ports are the workload's, drift is reverted, a foreign Service blocks untouched and the
//! workload recovers once it goes, garbage collection, a digit-leading name, a load balancer
//! whose address the test writes as a cloud controller would, `status.address` unchanged
//! through a rollout and a Pod deletion, and no writes while nothing of the workload changes,
//! also while kube-controller-manager updates the Service's endpoints.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use mw_operator::resource::{ManagedWorkload, Phase};
use serde_json::json;
use support::workload::{TIMEOUT, WatchLog, apply, condition, wait_condition, wait_ready};
use support::{TestNamespace, audit, wait_until};

/// A workload with a named TCP port and an unnamed UDP one, and a Service of `type_`.
fn spec(image: &str, type_: &str) -> serde_json::Value {
    json!({
        "image": image,
        "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 5353, "protocol": "UDP"}],
        "service": {"type": type_},
    })
}

fn cluster_ip(s: &Service) -> Option<String> {
    s.spec.as_ref()?.cluster_ip.clone()
}

fn address(mw: &ManagedWorkload) -> Option<String> {
    mw.status.as_ref()?.address.clone()
}

async fn events_with_reason(ns: &TestNamespace, reason: &str) -> Result<(), String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let list = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
    let reasons: Vec<_> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
    if reasons.iter().any(|r| r == reason) { Ok(()) } else { Err(format!("events: {reasons:?}")) }
}

#[tokio::test]
async fn the_service_has_the_workloads_ports_and_drift_is_reverted() {
    let ns = TestNamespace::new("svc-ports").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    apply(&workloads, "web", spec("nginx:latest", "ClusterIP")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;

    let svc = services.get("web").await.unwrap();
    assert_eq!(svc.owner_references()[0].uid, mw.uid().unwrap(), "owned by the workload, as its controller");
    assert_eq!(svc.owner_references()[0].controller, Some(true));
    let spec = svc.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let selector = spec.selector.clone().unwrap();
    assert_eq!(selector["app.kubernetes.io/instance"], "web");
    let ports: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.port, p.protocol.clone().unwrap(), p.target_port.clone().unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            ("http".to_string(), 80, "TCP".to_string(), IntOrString::String("http".into())),
            ("udp-5353".to_string(), 5353, "UDP".to_string(), IntOrString::Int(5353)),
        ]
    );
    // What the workload reports: the Service, and its cluster IP as the address.
    let status = mw.status.as_ref().unwrap();
    let reported = status.service.as_ref().expect("status.service");
    assert_eq!((reported.name.as_str(), reported.type_.as_str()), ("web", "ClusterIP"));
    assert_eq!(reported.cluster_ip, cluster_ip(&svc));
    assert_eq!(reported.dns_name, format!("web.{}.svc", ns.name));
    assert_eq!(reported.ports.len(), 2);
    assert_eq!(address(&mw), cluster_ip(&svc));
    assert_ne!(address(&mw), status.pod_ip, "the Service's address, not the Pod's");

    // kubectl patch service web -p '{"spec":{"selector":{"app":"evil"}}}': the selector is
    // atomic, so the whole of it is taken over; the operator takes it back.
    let patch = json!({"spec": {"selector": {"app": "evil"}}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_until(&services, "web", "the selector restored", TIMEOUT, |s: Option<&Service>| {
        s.and_then(|s| s.spec.as_ref()?.selector.clone()) == Some(selector.clone())
    })
    .await;
    support::eventually("a DriftCorrected event", TIMEOUT, || events_with_reason(&ns, "DriftCorrected")).await;

    // A port edited by hand (kubectl's merge patch replaces the whole list) is restored too:
    // the Service's ports are exactly the workload's.
    let patch = json!({"spec": {"ports": [{"name": "http", "port": 8080, "protocol": "TCP", "targetPort": 80}]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_until(&services, "web", "the ports restored", TIMEOUT, |s: Option<&Service>| {
        let ports: Vec<i32> =
            s.and_then(|s| s.spec.as_ref()?.ports.clone()).unwrap_or_default().iter().map(|p| p.port).collect();
        ports == [80, 5353]
    })
    .await;

    // kubectl delete service web: made again (with a new cluster IP, reported).
    let old = services.get("web").await.unwrap();
    services.delete("web", &DeleteParams::background()).await.unwrap();
    let again = wait_until(&services, "web", "the Service recreated", TIMEOUT, |s: Option<&Service>| {
        s.is_some_and(|s| s.uid() != old.uid())
    })
    .await
    .unwrap();
    wait_until(&workloads, "web", "the new cluster IP reported", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.and_then(address) == cluster_ip(&again)
    })
    .await;
}

#[tokio::test]
async fn a_foreign_service_blocks_untouched_and_the_workload_recovers_when_it_goes() {
    let ns = TestNamespace::new("svc-conflict").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "theirs"}},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 6379}]}
    }))
    .unwrap();
    let theirs = services.create(&PostParams::default(), &theirs).await.unwrap();

    apply(&workloads, "web", spec("nginx:latest", "ClusterIP")).await.unwrap();
    let mw = wait_condition(&workloads, "web", "Stalled", "True").await;
    assert_eq!(condition(&mw, "Stalled").reason, "ServiceConflict");
    assert!(condition(&mw, "Stalled").message.contains("not controlled by this ManagedWorkload"));
    assert_eq!(condition(&mw, "Ready").status, "False");
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Failed));
    assert_eq!(address(&mw), None, "no address of someone else's Service");
    let after = services.get("web").await.unwrap();
    assert_eq!(after.resource_version(), theirs.resource_version(), "their Service was never written");
    // No GET before the create: the create-only apply was the look, and the API server refused
    // it (409) without touching their Service; the rechecks since look with a GET.
    let user = std::env::var("MW_TEST_OPERATOR_USER").unwrap_or_else(|_| "mw-operator".into());
    let accepted: Vec<_> = audit::timed_accepted_writes_by(&user, &ns.name).into_iter().map(|(_, w)| w).collect();
    assert!(accepted.iter().all(|w| w.resource != "services"), "the operator wrote to their Service: {accepted:?}");
    let attempts = audit::operator_writes(&ns.name).into_iter().filter(|w| w.resource == "services").count();
    assert_eq!(attempts, 1, "one refused create, then GETs");

    services.delete("web", &DeleteParams::foreground()).await.unwrap();
    let started = std::time::Instant::now();
    let recovered = wait_until(&workloads, "web", "Running after the conflict went", Duration::from_secs(30), |mw| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Ready", "True"))
    })
    .await
    .unwrap();
    eprintln!("recovered {:?} after the foreign Service's deletion", started.elapsed());
    let ours = services.get("web").await.unwrap();
    assert_eq!(ours.owner_references()[0].uid, mw.uid().unwrap());
    assert_eq!(address(&recovered), cluster_ip(&ours));
}

#[tokio::test]
async fn the_service_goes_with_the_workload_or_with_spec_service() {
    let ns = TestNamespace::new("svc-gc").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    for name in ["gone", "kept"] {
        apply(&workloads, name, spec("nginx:latest", "ClusterIP")).await.unwrap();
    }
    for name in ["gone", "kept"] {
        wait_ready(&workloads, name, Phase::Running).await;
        services.get(name).await.unwrap();
    }
    // The workload is deleted: garbage collection removes its Service.
    workloads.delete("gone", &DeleteParams::background()).await.unwrap();
    wait_until(&services, "gone", "the Service garbage-collected", TIMEOUT, |s: Option<&Service>| s.is_none()).await;

    // spec.service is removed from a workload that stays: its Service goes, and the address
    // is the Pod's again.
    apply(&workloads, "kept", json!({"image": "nginx:latest", "ports": [{"containerPort": 80, "name": "http"}]}))
        .await
        .unwrap();
    wait_until(&services, "kept", "the Service deleted", TIMEOUT, |s: Option<&Service>| s.is_none()).await;
    wait_until(&workloads, "kept", "the Pod IP as the address", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| {
            let s = mw.status.as_ref();
            s.is_some_and(|s| s.service.is_none() && s.address.is_some() && s.address == s.pod_ip)
        })
    })
    .await;
    wait_ready(&workloads, "kept", Phase::Running).await;
    let deletes: Vec<_> =
        audit::operator_writes(&ns.name).into_iter().filter(|w| w.verb == "delete").map(|w| w.name).collect();
    assert_eq!(deletes, [Some("kept".to_string())], "the one delete: the Service spec.service no longer asks for");
}

#[tokio::test]
async fn a_digit_leading_name_gets_a_prefixed_service() {
    let ns = TestNamespace::new("svc-digit").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    apply(&workloads, "1web", spec("nginx:latest", "NodePort")).await.unwrap();
    let mw = wait_ready(&workloads, "1web", Phase::Running).await;
    let svc = services.get("mw-1web").await.unwrap();
    assert_eq!(svc.owner_references()[0].uid, mw.uid().unwrap());
    assert_eq!(svc.spec.as_ref().unwrap().type_.as_deref(), Some("NodePort"));
    let reported = mw.status.as_ref().unwrap().service.clone().unwrap();
    assert_eq!(reported.name, "mw-1web");
    assert_eq!(reported.dns_name, format!("mw-1web.{}.svc", ns.name));
    assert!(reported.ports.iter().all(|p| p.node_port.is_some()), "NodePort: each port's node port: {reported:?}");
    assert_eq!(address(&mw), cluster_ip(&svc));
}

#[tokio::test]
async fn a_load_balancer_is_ready_once_the_cloud_gives_it_an_address() {
    let ns = TestNamespace::new("svc-lb").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    apply(&workloads, "web", spec("nginx:latest", "LoadBalancer")).await.unwrap();
    // The control plane runs no cloud controller: the Pod is available, the load balancer
    // never answers by itself. The workload waits, and says so where kstatus, `kubectl wait`
    // and Argo CD look (which step it waits on, `WaitingForLoadBalancer`, is a detail written
    // with the next write or within minutes: docs/resource.md, "When the status is written").
    support::workload::wait_pod_available(&ns.client, &ns.name, "web").await;
    let mw = wait_until(&workloads, "web", "the operator's status", TIMEOUT, |mw: Option<&ManagedWorkload>| {
        mw.is_some_and(|mw| support::workload::condition_current(mw, "Reconciling", "True"))
    })
    .await
    .unwrap();
    assert_eq!(condition(&mw, "Ready").status, "False");
    assert_eq!(condition(&mw, "Stalled").status, "False", "a wait, not a failure");
    assert_eq!(mw.status.as_ref().unwrap().phase, Some(Phase::Creating));
    let svc = services.get("web").await.unwrap();
    assert_eq!(address(&mw), cluster_ip(&svc), "the cluster IP meanwhile");

    // The test as the cloud controller: the load balancer's address, on the Service's status.
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
    services.patch_status("web", &PatchParams::default(), &Patch::Merge(&ingress)).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_eq!(address(&mw).as_deref(), Some("192.0.2.10"));
    assert_eq!(mw.status.as_ref().unwrap().service.as_ref().unwrap().load_balancer_ingress, ["192.0.2.10"]);
}

#[tokio::test]
async fn the_address_does_not_move_through_a_rollout_or_a_pod_deletion() {
    let ns = TestNamespace::new("svc-stable").await;
    let workloads = ns.api::<ManagedWorkload>();
    let pods = ns.api::<Pod>();
    apply(&workloads, "web", spec("nginx:1.27", "ClusterIP")).await.unwrap();
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    let stable = address(&mw).expect("an address");
    let first_pod_ip = mw.status.as_ref().unwrap().pod_ip.clone();
    let log = WatchLog::start(&workloads, "web", |mw| Some(address(mw))).await;

    // A rollout: a new Pod (a new Pod IP), the same address throughout.
    let phases = support::workload::PhaseLog::start(&workloads, "web").await;
    apply(&workloads, "web", spec("nginx:1.28", "ClusterIP")).await.unwrap();
    let seen = phases.until(Phase::Running).await;
    assert!(seen.contains(&Phase::Updating), "a rollout happened: {seen:?}");
    let mw = wait_ready(&workloads, "web", Phase::Running).await;
    assert_ne!(mw.status.as_ref().unwrap().pod_ip, first_pod_ip, "a new Pod");

    // kubectl delete pod: replaced, the address stays. The new Pod is told by its name: kwok
    // may give it the IP the deleted one has just released.
    let selector = ListParams::default().labels("app.kubernetes.io/instance=web");
    let deleted: Vec<String> = pods.list(&selector).await.unwrap().items.iter().map(|p| p.name_any()).collect();
    for name in &deleted {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    support::eventually("Running on a new Pod (web)", TIMEOUT, || async {
        let new_ip = pods
            .list(&selector)
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|p| !deleted.contains(&p.name_any()) && p.metadata.deletion_timestamp.is_none())
            .find_map(|p| p.status?.pod_ip);
        let mw = workloads.get("web").await.map_err(|e| e.to_string())?;
        let reported = mw.status.as_ref().and_then(|s| s.pod_ip.clone());
        if new_ip.is_some() && reported == new_ip && support::workload::condition_current(&mw, "Ready", "True") {
            Ok(())
        } else {
            Err(format!("the new Pod's IP {new_ip:?}, the status's {reported:?}"))
        }
    })
    .await;
    log.alive().await;
    assert_eq!(log.seen(), [Some(stable)], "status.address through a rollout and a Pod deletion");
}

#[tokio::test]
async fn nothing_is_written_in_steady_state_while_the_endpoints_change() {
    let ns = TestNamespace::new("svc-idle").await;
    let workloads = ns.api::<ManagedWorkload>();
    let services = ns.api::<Service>();
    let pods = ns.api::<Pod>();
    let slices = ns.api::<EndpointSlice>();
    // Every status from the first on: its phase, and whether it has the Service's cluster IP.
    let statuses = WatchLog::start(&workloads, "web", |mw| {
        let status = mw.status.as_ref()?;
        Some((status.phase, status.service.as_ref().and_then(|s| s.cluster_ip.as_ref()).is_some()))
    })
    .await;
    apply(&workloads, "web", spec("nginx:latest", "ClusterIP")).await.unwrap();
    wait_ready(&workloads, "web", Phase::Running).await;
    let before = audit::settled_writes(&ns.name).await;
    let service_writes = before.iter().filter(|w| w.resource == "services").count();
    assert_eq!(service_writes, 1, "the Service's one apply: {before:?}");
    // The Service is made beside the Deployment, and the first status waits for it: two status
    // writes, each with the cluster IP.
    let status_writes = before.iter().filter(|w| w.subresource.as_deref() == Some("status")).count();
    assert_eq!(status_writes, 2, "Creating, then Running: {before:?}");
    assert_eq!(statuses.seen(), [(Some(Phase::Creating), true), (Some(Phase::Running), true)]);

    // A Pod that is not the workload's but carries its labels: the Service selects it, so
    // kube-controller-manager adds it to the Service's EndpointSlice; the operator sees it (its
    // Pod watch selects those labels too) and must count it for nothing, and write nothing.
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "labels": {
            "app.kubernetes.io/instance": "web", "opensource-server.mieweb.org/managed": "true"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:latest", "ports": [{"containerPort": 80, "name": "http"}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stray).await.unwrap();
    support::eventually("the stray Pod among the Service's endpoints", TIMEOUT, || async {
        let list = slices.list(&ListParams::default().labels("kubernetes.io/service-name=web")).await;
        let list = list.map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        if ready == 2 { Ok(()) } else { Err(format!("{ready} ready endpoints")) }
    })
    .await;
    // A label on the CR and one on the Service reconcile it too, changing nothing it owns.
    let patch = json!({"metadata": {"labels": {"team": "blue"}}});
    workloads.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    pods.delete("stray", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(audit::QUIET).await;
    let after = audit::operator_writes(&ns.name);
    assert_eq!(after[before.len()..], [], "writes by the operator while nothing of the workload changed");
    wait_ready(&workloads, "web", Phase::Running).await;
    // The positive control: a change the operator must write is seen by the same reading.
    apply(&workloads, "web", spec("nginx:1.28", "ClusterIP")).await.unwrap();
    audit::wait_for_operator_write(&ns.name, after.len()).await;
}
