//! Storage for tests of volumes: a StorageClass with no provisioner and hostPath
//! PersistentVolumes that kube-controller-manager's binder binds claims to. hostPath works
//! on kwok's nodes (nothing mounts it) and on the real node, which shares this machine's
//! filesystem, so a file a container writes there is really kept.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::TestNamespace;

/// A StorageClass and hostPath PersistentVolumes of the test's own (cluster-scoped, so named
/// after its namespace), deleted with it.
pub struct Storage {
    client: kube::Client,
    pub class: String,
    pub volumes: Vec<String>,
}

impl Storage {
    pub async fn new(ns: &TestNamespace, volumes: usize, capacity: &str) -> Storage {
        Storage::with_expansion(ns, volumes, capacity, true).await
    }

    /// With `expandable` false, the class refuses every claim expansion (the API server's
    /// PersistentVolumeClaimResize admission answers 403), as many clouds' default classes do.
    pub async fn with_expansion(ns: &TestNamespace, volumes: usize, capacity: &str, expandable: bool) -> Storage {
        let class = format!("{}-sc", ns.name);
        let classes: Api<StorageClass> = Api::all(ns.client.clone());
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class, "labels": {"mw-operator.test/suite": "true"}},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": expandable,
            "reclaimPolicy": "Retain",
        }))
        .unwrap();
        classes.create(&PostParams::default(), &sc).await.unwrap();
        let pvs: Api<PersistentVolume> = Api::all(ns.client.clone());
        let mut names = Vec::new();
        for i in 0..volumes {
            let name = format!("{}-pv{i}", ns.name);
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"mw-operator.test/suite": "true"}},
                "spec": {
                    "capacity": {"storage": capacity},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": class,
                    "hostPath": {"path": host_path(&name), "type": "DirectoryOrCreate"},
                },
            }))
            .unwrap();
            pvs.create(&PostParams::default(), &pv).await.unwrap();
            names.push(name);
        }
        Storage { client: ns.client.clone(), class, volumes: names }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if std::env::var_os("MW_TEST_KEEP_NAMESPACES").is_some() {
            return;
        }
        let (class, volumes) = (self.class.clone(), self.volumes.clone());
        let _ = &self.client;
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let client = super::client().await;
                for pv in volumes {
                    let _ = Api::<PersistentVolume>::all(client.clone()).delete(&pv, &DeleteParams::background()).await;
                    // What a real node's containers wrote there (kwok's nodes write nothing).
                    let _ = std::fs::remove_dir_all(host_path(&pv));
                }
                let _ = Api::<StorageClass>::all(client).delete(&class, &DeleteParams::background()).await;
            });
        })
        .join();
    }
}

/// Where a test volume's data is on this machine.
fn host_path(volume: &str) -> String {
    format!("/tmp/mw-operator-test-pv/{volume}")
}
