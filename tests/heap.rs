//! Heap accounting: what the operator's caches keep per workload, counted by the allocator
//! (bytes asked for and not yet given back, on this test's own thread), for objects as a
//! control plane serves them (tests/fixtures/cluster), and what is remembered of a workload at
//! rest. The RSS figures of `make bench` add the allocator's own overhead and the runtime;
//! these are the objects' own share, kind by kind, so a change to what a cache keeps shows
//! here first. `make bench` prints them (`cargo test --release --test heap -- --nocapture`).
//! The bounds are today's figures with a little room (docs/performance.md): a cache that
//! starts keeping more fails here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use mw_operator::bridge::cached::{CachedSecret, CachedWorkload};
use mw_operator::bridge::env::DefaultEnv;
use mw_operator::bridge::mapping::{self, Context};
use mw_operator::bridge::rows::{ContainerRow, Grants};
use mw_operator::operator::memory::PerObject;
use mw_operator::operator::pod_index::PodIndex;
use mw_operator::operator::replica_sets::ReplicaSets;
use mw_operator::operator::slim::{self, CachedClaim, CachedDeployment, CachedPod, CachedService};
use mw_operator::resource::ManagedWorkload;

/// Counts the bytes allocated and not freed by the current thread.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the counter is a plain
// thread-local cell that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|l| l.set(l.get() + layout.size() as isize));
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|l| l.set(l.get() - layout.size() as isize));
        // SAFETY: a pointer this allocator gave out, with its layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LIVE.try_with(|l| l.set(l.get() + new_size as isize - layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// Workloads per measurement: enough for the stores' tables to reach a typical load.
const N: usize = 1000;

/// What the bridge keeps per Manager row of its caches: the CR it made and its env Secret's
/// metadata, as trimmed now (`bridge::cached`) and as the whole objects it kept before
/// (without managed fields and conditions), for a CR made from a row of `make bench`'s shape.
#[test]
fn what_the_bridge_keeps_per_row() {
    let row = ContainerRow {
        id: 1,
        node_id: 1,
        site_id: 1,
        hostname: "w000001".into(),
        username: "user1".into(),
        template: Some("docker.io/library/nginx:1.27".into()),
        environment_vars: Some(r#"{"TZ":"UTC","ID":"1"}"#.into()),
        entrypoint: Some(r#"nginx -g "daemon off;""#.into()),
        nvidia_requested: 0,
        container_id: None,
        ipv4_address: None,
        mac_address: None,
        created_at: "2026-12-02 12:00:00.000 +00:00".into(),
        updated_at: "2026-12-02 12:00:00.000 +00:00".into(),
        services: vec![],
    };
    let (defaults, grants) = (DefaultEnv::default(), Grants::default());
    let cx = Context {
        namespace: "workloads",
        field_manager: "mw-bridge",
        defaults: &defaults,
        grants: &grants,
        requests_percent: 100,
        rootfs: &Default::default(),
        service: &Default::default(),
        system_images: &Default::default(),
        isolation: &None,
    };
    let desired = mapping::desired(&row, &cx).expect("a row that maps");
    // As the API server returns it: identity, and a status of the operator's.
    let mut cr = serde_json::to_value(&desired.workload).unwrap();
    cr["metadata"]["uid"] = "8babc3c4-a8c1-489a-b498-3d50ed9d8868".into();
    cr["metadata"]["resourceVersion"] = "25813".into();
    cr["metadata"]["generation"] = 1.into();
    cr["metadata"]["creationTimestamp"] = "2026-12-02T12:00:01Z".into();
    cr["status"] = fixture("managedworkload")["status"].clone();
    cr["status"]["providerId"] = "workloads/w000001".into();
    let before = per_object(&cr, |v| {
        let mut mw = parse::<ManagedWorkload>(v);
        mw.metadata.managed_fields = None;
        if let Some(status) = mw.status.as_mut() {
            status.conditions.clear();
        }
        mw
    });
    let after = per_object(&cr, |v| CachedWorkload::from(parse::<ManagedWorkload>(v)));
    let secret = serde_json::json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {
            "name": "w000001-manager-env", "namespace": "workloads",
            "uid": "0123c4a8-a8c1-489a-b498-3d50ed9d8868", "resourceVersion": "25812",
            "creationTimestamp": "2026-12-02T12:00:01Z",
            "labels": cr["metadata"]["labels"].clone(),
            "ownerReferences": [{"apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
                                 "name": "w000001", "uid": "8babc3c4-a8c1-489a-b498-3d50ed9d8868"}]
        }
    });
    let secret_before = per_object(&secret, |v| {
        let mut meta = parse::<PartialObjectMeta<Secret>>(v);
        meta.metadata.annotations = None;
        meta
    });
    let secret_after = per_object(&secret, |v| CachedSecret::from(parse::<PartialObjectMeta<Secret>>(v)));
    println!(
        "heap kept per bridge row (bytes): CR {after:.0} (whole, as before: {before:.0}), Secret {secret_after:.0} \
         (as before: {secret_before:.0})"
    );
    assert!(after + secret_after < 2.5 * 1024.0, "{:.0} bytes per row", after + secret_after);
}

fn fixture(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/fixtures/cluster/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).expect("a fixture that parses")
}

/// Object `i` of a fixture: its own name and UID, as `N` workloads' objects have.
fn nth(template: &serde_json::Value, i: usize) -> serde_json::Value {
    let mut v = template.clone();
    let meta = &mut v["metadata"];
    let name = format!("{}-{i:04}", meta["name"].as_str().unwrap_or("x"));
    meta["name"] = name.into();
    meta["uid"] = format!("0000{i:04}-1111-2222-3333-444455556666").into();
    v
}

/// Bytes per object that a store of `N` objects built by `make` from `fixture` keeps: the
/// objects as cached, their keys and the store's table. The JSON is parsed first, outside the
/// count, as the watch's own buffers are not the cache's.
fn per_object<K>(template: &serde_json::Value, make: impl Fn(serde_json::Value) -> K) -> f64
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let inputs: Vec<serde_json::Value> = (0..N).map(|i| nth(template, i)).collect();
    let (store, mut writer) = reflector::store::<K>();
    let before = live();
    for input in &inputs {
        // The copy is consumed (and freed) by `make`: only what the store keeps stays counted.
        let obj = make(input.clone());
        writer.apply_watcher_event(&Event::Apply(obj));
    }
    let kept = live() - before;
    drop(inputs);
    assert_eq!(store.state().len(), N);
    kept as f64 / N as f64
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a fixture of its kind")
}

/// A claim as a control plane serves it, made from the workload's: the fixtures hold no claim
/// of their own, so its managed fields are the operator's apply record of a claim's size.
fn claim_fixture() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "web-data", "namespace": "default", "uid": "u", "resourceVersion": "1234",
            "creationTimestamp": "2026-12-01T07:21:11Z",
            "labels": {"app.kubernetes.io/instance": "web", "app.kubernetes.io/managed-by": "mw-operator",
                       "opensource-server.mieweb.org/managed": "true"},
            "annotations": {"opensource-server.mieweb.org/applied-hash": "0123456789abcdef0123",
                            "opensource-server.mieweb.org/volume-of": "web/data",
                            "opensource-server.mieweb.org/workload-uid": "0000-1111-2222-3333-444455556666",
                            "pv.kubernetes.io/bind-completed": "yes",
                            "pv.kubernetes.io/bound-by-controller": "yes"},
            "finalizers": ["kubernetes.io/pvc-protection"],
            "ownerReferences": [{"apiVersion": "opensource-server.mieweb.org/v1alpha1", "kind": "ManagedWorkload",
                                 "name": "web", "uid": "0000-1111-2222-3333-444455556666"}],
            "managedFields": [
                {"manager": "mw-operator", "operation": "Apply", "apiVersion": "v1", "time": "2026-12-01T07:21:11Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:annotations": {"f:opensource-server.mieweb.org/applied-hash": {},
                                                      "f:opensource-server.mieweb.org/volume-of": {},
                                                      "f:opensource-server.mieweb.org/workload-uid": {}},
                                   "f:labels": {"f:app.kubernetes.io/instance": {},
                                                "f:app.kubernetes.io/managed-by": {},
                                                "f:opensource-server.mieweb.org/managed": {}},
                                   "f:ownerReferences": {"k:{\"uid\":\"0000-1111-2222-3333-444455556666\"}": {}}},
                    "f:spec": {"f:accessModes": {}, "f:resources": {"f:requests": {"f:storage": {}}},
                               "f:storageClassName": {}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-12-01T07:21:12Z", "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:annotations": {".": {}, "f:pv.kubernetes.io/bind-completed": {},
                                                      "f:pv.kubernetes.io/bound-by-controller": {}}},
                    "f:spec": {"f:volumeName": {}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-12-01T07:21:12Z", "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:accessModes": {}, "f:capacity": {".": {}, "f:storage": {}},
                                           "f:phase": {}}}}
            ]
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "standard", "volumeMode": "Filesystem", "volumeName": "pvc-0123"},
        "status": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "phase": "Bound"}
    })
}

#[test]
fn what_the_caches_keep_per_workload() {
    let workload = per_object(&fixture("managedworkload"), |v| {
        let mut mw = DeserializeGuard::<ManagedWorkload>(Ok(parse(v)));
        slim::workload(&mut mw);
        mw
    });
    let exposed_workload = per_object(&fixture("service-workload"), |v| {
        let mut mw = DeserializeGuard::<ManagedWorkload>(Ok(parse(v)));
        slim::workload(&mut mw);
        mw
    });
    let deployment = per_object(&fixture("deployment"), |v| CachedDeployment::from(parse::<Deployment>(v)));
    let pod = per_object(&fixture("pod"), |v| CachedPod::from(parse::<Pod>(v)));
    let service = per_object(&fixture("service"), |v| CachedService::from(parse::<Service>(v)));
    // ReplicaSets and Pods are also indexed (which Deployment controls each ReplicaSet; which
    // Pods are each workload's): what the indexes keep per workload.
    let replica_set = {
        let index = ReplicaSets::default();
        let before = live();
        for i in 0..N {
            let mut rs = PartialObjectMeta::<ReplicaSet>::default();
            rs.metadata.name = Some(format!("w{i:04}-5fc66497dc"));
            rs.metadata.namespace = Some("default".into());
            rs.metadata.uid = Some(format!("0000{i:04}-1111-2222-3333-444455556666"));
            rs.metadata.owner_references = Some(vec![OwnerReference {
                kind: "Deployment".into(),
                controller: Some(true),
                uid: format!("1111{i:04}-1111-2222-3333-444455556666"),
                ..Default::default()
            }]);
            index.observe(&Event::Apply(rs));
        }
        (live() - before) as f64 / N as f64
    };
    let pod_index = {
        let template = fixture("pod");
        // Each workload's Pod under its own instance label, as N workloads' are.
        let pods: Vec<CachedPod> = (0..N)
            .map(|i| {
                let mut pod = nth(&template, i);
                pod["metadata"]["labels"]["app.kubernetes.io/instance"] = format!("w{i:04}").into();
                CachedPod::from(parse::<Pod>(pod))
            })
            .collect();
        let index = PodIndex::default();
        let before = live();
        for pod in &pods {
            index.observe(&Event::Apply(pod.clone()));
        }
        let kept = (live() - before) as f64 / N as f64;
        drop(pods);
        kept
    };
    let claim = per_object(&claim_fixture(), |v| CachedClaim::from(parse::<PersistentVolumeClaim>(v)));
    // What is remembered of a workload at rest: its last status write, once the CR watch has
    // brought that write back (memory.rs), leaves only when it was made.
    let remembered = {
        let objects = PerObject::default();
        let template = fixture("managedworkload");
        let workloads: Vec<ManagedWorkload> = (0..N).map(|i| parse(nth(&template, i))).collect();
        let before = live();
        for mw in &workloads {
            let status = mw.status.clone().expect("a fixture with a status");
            objects.wrote(mw, mw.metadata.resource_version.clone(), status);
            objects.observe(&Event::Apply(DeserializeGuard(Ok(mw.clone()))));
        }
        let kept = (live() - before) as f64 / N as f64;
        drop(workloads);
        kept
    };
    let plain = workload + deployment + pod + replica_set + pod_index + remembered;
    let full = exposed_workload + deployment + pod + replica_set + pod_index + remembered + service + claim;
    let kib = |b: f64| b / 1024.0;
    println!(
        "heap kept per object (bytes): workload {workload:.0}, workload with a port and a Service \
         {exposed_workload:.0}, Deployment {deployment:.0}, Pod {pod:.0}, ReplicaSet index {replica_set:.0}, Pod index {pod_index:.0}, \
         remembered at rest {remembered:.0}, Service {service:.0}, claim {claim:.0}"
    );
    println!("heap kept per workload: plain {:.2} KiB; with a Service and a volume {:.2} KiB", kib(plain), kib(full));
    assert!(plain < 8.0 * 1024.0, "plain: {:.2} KiB", kib(plain));
    assert!(full < 12.5 * 1024.0, "with a Service and a volume: {:.2} KiB", kib(full));
}
