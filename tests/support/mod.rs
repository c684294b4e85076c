//! What every integration test needs: a client for the local control plane that `make test`
//! started, an isolated namespace of its own (so tests run in parallel), and waits that fail
//! with the object's last state and a pointer to the component logs.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;

/// A namespace created for one test and deleted when it is dropped.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

/// Where the control plane's component logs (and the operator's) are.
pub fn log_dir() -> String {
    std::env::var("MW_TEST_LOG_DIR").unwrap_or_else(|_| "target/controlplane/test".into())
}

/// A client for the test control plane. Integration tests never fall back to $KUBECONFIG:
/// pointing them at a real cluster by accident must be impossible.
pub async fn client() -> Client {
    let path = std::env::var("MW_TEST_KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "MW_TEST_KUBECONFIG is not set. Integration tests run against the local control plane: \
             use `make test`, or `make cluster-up` and export MW_TEST_KUBECONFIG=$(hack/controlplane.sh kubeconfig)"
        )
    });
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading {path}: {e}"));
    Client::try_from(config).expect("building a client for the test control plane")
}

impl TestNamespace {
    /// A fresh namespace named after the test, ready for Pods (its default ServiceAccount
    /// exists, which Pod admission requires).
    pub async fn new(test: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let client = client().await;
        let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
            ^ (u128::from(std::process::id()) << 20)
            ^ u128::from(COUNTER.fetch_add(1, Ordering::Relaxed));
        let slug: String =
            test.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        let slug = slug.trim_matches('-');
        let name = format!("t-{}-{:06x}", &slug[..slug.len().min(48)], unique % 0xff_ffff);

        let namespaces: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        ns.metadata.labels = Some([("mw-operator.test/suite".to_string(), "true".to_string())].into());
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));

        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_until(&accounts, "default", "the namespace's default ServiceAccount", Duration::from_secs(60), |sa| {
            sa.is_some()
        })
        .await;
        TestNamespace { client, name }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("MW_TEST_KEEP_NAMESPACES").is_some() {
            return;
        }
        // Drop cannot await, and the test's own client cannot be used from here: its
        // connection task runs on the test's runtime, which is blocked in this very call. A
        // short-lived runtime on its own thread, with its own client, deletes the namespace.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let _ = Api::<Namespace>::all(client().await).delete(&name, &DeleteParams::background()).await;
            });
        })
        .join();
    }
}

/// The objects of a multi-document YAML text.
pub fn documents(text: &str) -> Vec<serde_json::Value> {
    text.split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

/// Wait until `condition` holds for the object (None while it does not exist). On timeout,
/// panic with the object's last state and where the logs are.
pub async fn wait_until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(Ok(obj)) => obj,
        Ok(Err(e)) => panic!("watching {name} for {what}: {e}"),
        Err(_) => {
            let last = api.get_opt(name).await;
            panic!(
                "timed out after {timeout:?} waiting for {what} ({name}).\nlast state: {last:#?}\ncontrol plane and operator logs: {}",
                log_dir()
            )
        }
    }
}

/// Poll `check` until it returns Ok, for state no single watch can express (several lists,
/// Events). On timeout, panic with `what`, the last Err (what was still wrong) and the logs.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(()) => return,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}: {last}\nlogs: {}", log_dir())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Wait for an Event of this reason in the namespace (the operator publishes events.k8s.io
/// Events on the workload).
pub async fn wait_for_event(ns: &TestNamespace, reason: &str, timeout: Duration) {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = ns.api();
    eventually(&format!("a {reason} Event"), timeout, || async {
        let list = events.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let reasons: Vec<_> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        if reasons.iter().any(|r| r == reason) { Ok(()) } else { Err(format!("events: {reasons:?}")) }
    })
    .await;
}

pub mod audit;
pub mod bridge;
pub mod controlplane;
pub mod helm;
pub mod manager;
pub mod operator;
pub mod procfs;
pub mod proxy;
pub mod realnode;
pub mod scoped;
pub mod storage;
pub mod workload;
