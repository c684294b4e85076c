//! The shared table of `integrations/manager/mapping-cases.json`: the bridge must map each
//! Manager container to exactly the workload the table says, which is also what Manager's own
//! provider (`integrations/manager`, checked by its `node --test`) makes from it. One mapping,
//! not two: a node moves between the bridge and the provider without a rollout.

use serde::Deserialize;
use serde_json::Value;

use super::*;
use crate::bridge::env::parse_defaults;
use crate::bridge::rows::GrantRow;

const CASES: &str = include_str!("../../../integrations/manager/mapping-cases.json");

#[derive(Deserialize)]
struct Table {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    context: CaseContext,
    default_env: Option<String>,
    row: Row,
    grants: BTreeMap<String, i64>,
    services: Vec<Service>,
    expect: Option<Expect>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaseContext {
    namespace: String,
    requests_percent: u32,
    rootfs: CaseRootfs,
    service: CaseService,
    /// Image prefixes that are system containers; unset: the default (Manager's templates).
    system_images: Option<Vec<String>>,
    /// The isolation setting's entries (`--isolation-allow-from`); unset: none.
    #[serde(default)]
    isolation_allow_from: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaseRootfs {
    mount_path: Option<String>,
    storage_class: Option<String>,
    on_delete: RetentionPolicy,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaseService {
    #[serde(rename = "type")]
    type_: Option<ServiceType>,
    load_balancer_class: Option<String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    id: i64,
    node_id: i64,
    site_id: i64,
    hostname: String,
    username: String,
    template: Option<String>,
    environment_vars: Option<String>,
    entrypoint: Option<String>,
    nvidia_requested: bool,
    created_at: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Service {
    #[serde(rename = "type")]
    kind: String,
    internal_port: i64,
    protocol: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Expect {
    spec: Value,
    labels: BTreeMap<String, String>,
    secret_name: String,
    env: BTreeMap<String, String>,
}

fn map(case: &Case) -> Desired {
    let row = ContainerRow {
        id: case.row.id,
        node_id: case.row.node_id,
        site_id: case.row.site_id,
        hostname: case.row.hostname.clone(),
        username: case.row.username.clone(),
        template: case.row.template.clone(),
        environment_vars: case.row.environment_vars.clone(),
        entrypoint: case.row.entrypoint.clone(),
        nvidia_requested: i64::from(case.row.nvidia_requested),
        container_id: None,
        ipv4_address: None,
        mac_address: None,
        created_at: case.row.created_at.clone(),
        updated_at: case.row.created_at.clone(),
        services: case
            .services
            .iter()
            .map(|s| ServiceRow {
                container_id: case.row.id,
                kind: s.kind.clone(),
                internal_port: s.internal_port,
                protocol: s.protocol.clone(),
            })
            .collect(),
    };
    let defaults = case.default_env.as_deref().map(|s| parse_defaults(s).unwrap()).unwrap_or_default();
    let grants = Grants::from_rows(case.grants.iter().map(|(resource_type, value)| GrantRow {
        site_id: row.site_id,
        hostname: row.hostname.clone(),
        username: row.username.clone(),
        resource_type: resource_type.clone(),
        value: *value,
    }));
    let rootfs = RootfsVolume {
        mount_path: case.context.rootfs.mount_path.clone(),
        storage_class: case.context.rootfs.storage_class.clone(),
        on_delete: case.context.rootfs.on_delete,
    };
    let service = ServiceSettings {
        type_: case.context.service.type_,
        load_balancer_class: case.context.service.load_balancer_class.clone(),
        annotations: case.context.service.annotations.clone(),
    };
    let cx = Context {
        namespace: &case.context.namespace,
        field_manager: "mw-bridge",
        defaults: &defaults,
        grants: &grants,
        requests_percent: case.context.requests_percent,
        rootfs: &rootfs,
        service: &service,
        system_images: &case.context.system_images.clone().map(SystemImages).unwrap_or_default(),
        isolation: &crate::bridge::mapping::isolation(&case.context.isolation_allow_from).expect("isolation entries"),
    };
    desired(&row, &cx).unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

#[test]
fn the_bridge_maps_every_shared_case_as_the_table_says() {
    let table: Table = serde_json::from_str(CASES).expect("mapping-cases.json");
    assert!(!table.cases.is_empty());
    for case in &table.cases {
        let d = map(case);
        let spec = serde_json::to_value(&d.workload.spec).unwrap();
        let Some(expect) = &case.expect else {
            panic!("{}: no expectation; the bridge makes\n{}", case.name, serde_json::to_string(&spec).unwrap());
        };
        assert_eq!(spec, expect.spec, "{}: spec\n{}", case.name, serde_json::to_string(&spec).unwrap());
        // The identity labels; the bridge adds its own ownership label, the provider its own.
        let labels = d.workload.metadata.labels.clone().unwrap_or_default();
        for (k, v) in &expect.labels {
            assert_eq!(labels.get(k), Some(v), "{}: label {k}", case.name);
        }
        assert_eq!(labels.len(), expect.labels.len() + 1, "{}: only the bridge's own label besides", case.name);
        assert_eq!(d.secret_name, expect.secret_name, "{}", case.name);
        assert_eq!(d.env, expect.env, "{}: env", case.name);
    }
}
