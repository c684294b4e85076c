//! The mapping on rows as each engine returns them: the sample rows of
//! `tests/fixtures/manager-schema/sample-rows.sql` (Manager's schema at ee03a1b), read from
//! SQLite (timestamps as stored) and from PostgreSQL (timestamps as `db` renders them).

use super::*;
use crate::bridge::rows::{Approved, GrantRow};
use crate::resource::DesiredState;

fn team_wiki() -> ContainerRow {
    ContainerRow {
        id: 1,
        node_id: 2,
        site_id: 2,
        hostname: "team-wiki".into(),
        username: "jsmith".into(),
        template: Some("docker.io/library/nginx:1.27".into()),
        environment_vars: Some(
            r#"{"PATH":"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","NGINX_VERSION":"1.27.5","TZ":"America/New_York"}"#
                .into(),
        ),
        entrypoint: Some("/docker-entrypoint.sh nginx -g daemon off;".into()),
        nvidia_requested: 0,
        container_id: Some("default/team-wiki".into()),
        ipv4_address: Some("10.15.10.141".into()),
        mac_address: None,
        created_at: "2026-07-21 09:12:40.208 +00:00".into(),
        updated_at: "2026-07-21 09:13:55.671 +00:00".into(),
        services: vec![],
    }
}

/// The same row as PostgreSQL gives it: booleans as 0/1 through the cast, timestamps in
/// microseconds.
fn pg_analytics_from_postgres() -> ContainerRow {
    ContainerRow {
        id: 2,
        hostname: "pg-analytics".into(),
        template: Some("docker.io/library/postgres:16".into()),
        environment_vars: Some(
            r#"{"PG_MAJOR":"16","POSTGRES_DB":"analytics","POSTGRES_PASSWORD":"s3cr3t-change-me"}"#.into(),
        ),
        entrypoint: Some("docker-entrypoint.sh postgres".into()),
        created_at: "2026-07-22 15:40:03.917000 +00:00".into(),
        updated_at: "2026-07-22 15:41:28.044000 +00:00".into(),
        ..team_wiki()
    }
}

fn defaults() -> DefaultEnv {
    env::parse_defaults(
        r#"[{"key":"WAZUH_MANAGER","value":"wazuh.lab.internal","description":""},
            {"key":"WAZUH_REGISTRATION_PASSWORD","value":"hunter2","description":"secret"}]"#,
    )
    .unwrap()
}

fn map(row: &ContainerRow, grants: &Grants) -> Result<Desired, RowError> {
    let defaults = defaults();
    let cx = Context {
        namespace: "workloads",
        field_manager: "mw-bridge",
        defaults: &defaults,
        grants,
        requests_percent: 100,
        rootfs: &Default::default(),
        service: &Default::default(),
        system_images: &Default::default(),
        isolation: &None,
    };
    desired(row, &cx)
}

#[test]
fn sqlite_row_becomes_a_workload() {
    let d = map(&team_wiki(), &Grants::default()).unwrap();
    let mw = &d.workload;
    assert_eq!((d.namespace.as_str(), d.name.as_str()), ("workloads", "team-wiki"));
    assert_eq!(mw.metadata.namespace.as_deref(), Some("workloads"));
    assert_eq!(mw.spec.image, "docker.io/library/nginx:1.27");
    assert_eq!(mw.spec.command, ["/docker-entrypoint.sh", "nginx", "-g", "daemon", "off;"]);
    assert_eq!(mw.spec.hostname.as_deref(), Some("team-wiki"));
    assert_eq!(mw.spec.state, None, "the bridge never sets spec.state");
    assert_eq!(mw.spec.desired_state(), DesiredState::Running);
    let labels = mw.labels();
    assert_eq!(labels[NODE_ID_LABEL], "2");
    assert_eq!(labels[CONTAINER_ID_LABEL], "1");
    assert_eq!(labels[SYNCED_BY_LABEL], "mw-bridge");
    assert_eq!(mw.annotations()[ROW_CREATED_ANNOTATION], "2026-07-21 09:12:40.208 +00:00");
    assert_eq!(mw.annotations()[OWNER_ANNOTATION], "jsmith");
    assert_eq!(mw.annotations()[BRIDGE_HASH_ANNOTATION], d.hash);
    // Defaults (4 cpus, 4096 MB) as limits and requests.
    let r = mw.spec.resources.as_ref().unwrap();
    assert_eq!(r.limits.as_ref().unwrap().cpu, Some(Quantity("4".into())));
    assert_eq!(r.limits.as_ref().unwrap().memory, Some(Quantity("4096Mi".into())));
    assert_eq!(r.requests.as_ref().unwrap().cpu, Some(Quantity("4000m".into())));
}

#[test]
fn env_values_stay_in_the_secret() {
    let d = map(&pg_analytics_from_postgres(), &Grants::default()).unwrap();
    let cr = serde_json::to_string(&d.workload).unwrap();
    for secret in ["s3cr3t-change-me", "hunter2", "wazuh.lab.internal"] {
        assert!(!cr.contains(secret), "the CR must not carry env values: {cr}");
    }
    let names: Vec<_> = d.workload.spec.env.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["PG_MAJOR", "POSTGRES_DB", "POSTGRES_PASSWORD", "WAZUH_MANAGER", "WAZUH_REGISTRATION_PASSWORD"]);
    for e in &d.workload.spec.env {
        assert_eq!(e.value, None);
        let r = e.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("pg-analytics-manager-env", e.name.as_str()));
    }
    let secret = secret(&d, "mw-bridge", None);
    let data = secret.data.unwrap();
    assert_eq!(data["POSTGRES_PASSWORD"].0, b"s3cr3t-change-me");
    assert_eq!(data["WAZUH_REGISTRATION_PASSWORD"].0, b"hunter2");
    assert_eq!(secret.metadata.labels.unwrap()[SYNCED_BY_LABEL], "mw-bridge");
    assert_eq!(d.workload.spec.pod_annotations[ENV_DIGEST_ANNOTATION], env_digest(&d.env));
}

#[test]
fn a_changed_env_value_changes_the_pod_template_but_never_shows() {
    let before = map(&pg_analytics_from_postgres(), &Grants::default()).unwrap();
    let mut row = pg_analytics_from_postgres();
    row.environment_vars = Some(row.environment_vars.unwrap().replace("s3cr3t-change-me", "rotated"));
    let after = map(&row, &Grants::default()).unwrap();
    assert_ne!(before.hash, after.hash);
    assert_ne!(before.workload.spec.pod_annotations, after.workload.spec.pod_annotations);
    assert_eq!(before.workload.spec.env, after.workload.spec.env);
}

#[test]
fn mapping_is_deterministic_and_ignores_written_back_columns() {
    let a = map(&team_wiki(), &Grants::default()).unwrap();
    let mut row = team_wiki();
    row.container_id = Some("workloads/team-wiki".into());
    row.ipv4_address = None;
    row.updated_at = "2026-11-30 08:00:00.000 +00:00".into();
    let b = map(&row, &Grants::default()).unwrap();
    assert_eq!(a.hash, b.hash, "the bridge's own write-back must not change the desired CR");
    assert_eq!(serde_json::to_value(&a.workload).unwrap(), serde_json::to_value(&b.workload).unwrap());
    assert_eq!(a.env, b.env);
}

#[test]
fn approved_resources_latest_wins() {
    let grant = |t: &str, v| GrantRow {
        site_id: 2,
        hostname: "pg-analytics".into(),
        username: "jsmith".into(),
        resource_type: t.into(),
        value: v,
    };
    let grants = Grants::from_rows([grant("memory", 2048), grant("memory", 8192), grant("cpus", 2), grant("swap", 1)]);
    assert_eq!(
        grants.for_row(&pg_analytics_from_postgres()),
        Approved { cpus: Some(2), memory_mb: Some(8192), rootfs_gb: None }
    );
    let d = map(&pg_analytics_from_postgres(), &grants).unwrap();
    let limits = d.workload.spec.resources.unwrap().limits.unwrap();
    assert_eq!((limits.cpu.unwrap().0, limits.memory.unwrap().0), ("2".to_string(), "8192Mi".to_string()));
    // Matched by (site, hostname, username): another user's approval does not apply.
    let mut other = pg_analytics_from_postgres();
    other.username = "akumar".into();
    assert_eq!(grants.for_row(&other), Approved::default());

    let defaults = defaults();
    let cx = Context {
        namespace: "w",
        field_manager: "b",
        defaults: &defaults,
        grants: &Grants::default(),
        requests_percent: 25,
        rootfs: &Default::default(),
        service: &Default::default(),
        system_images: &Default::default(),
        isolation: &None,
    };
    let r = desired(&team_wiki(), &cx).unwrap().workload.spec.resources.unwrap().requests.unwrap();
    assert_eq!((r.cpu.unwrap().0, r.memory.unwrap().0), ("1000m".to_string(), "1024Mi".to_string()));
    let bad = Grants::from_rows([GrantRow { value: 0, ..grant("cpus", 0) }]);
    assert!(matches!(map(&pg_analytics_from_postgres(), &bad), Err(RowError::BadResource { resource: "cpus", .. })));
}

#[test]
fn entrypoint_is_split_like_a_shell() {
    let mut row = team_wiki();
    row.entrypoint = Some(r#"  sh -c 'echo "hello world" && sleep 1' --flag="a b"  "#.into());
    let d = map(&row, &Grants::default()).unwrap();
    assert_eq!(d.workload.spec.command, ["sh", "-c", r#"echo "hello world" && sleep 1"#, "--flag=a b"]);
    row.entrypoint = Some("   ".into());
    assert!(map(&row, &Grants::default()).unwrap().workload.spec.command.is_empty());
    row.entrypoint = Some("sh -c 'unterminated".into());
    assert!(matches!(map(&row, &Grants::default()), Err(RowError::BadEntrypoint(_))));
}

#[test]
fn bad_rows_are_named_errors() {
    let with = |f: fn(&mut ContainerRow)| {
        let mut row = team_wiki();
        f(&mut row);
        map(&row, &Grants::default()).unwrap_err()
    };
    assert_eq!(with(|r| r.template = None), RowError::MissingImage);
    assert_eq!(with(|r| r.template = Some("debian-12-standard".into())).reason(), "bad_image");
    assert_eq!(with(|r| r.template = Some("local:vztmpl/debian.tar.zst".into())).reason(), "bad_image");
    assert_eq!(with(|r| r.hostname = "Bad_Host".into()).reason(), "bad_hostname");
    assert_eq!(with(|r| r.environment_vars = Some("{".into())).reason(), "bad_env_json");
    assert_eq!(with(|r| r.environment_vars = Some(r#"{"BAD-KEY":"x"}"#.into())).reason(), "bad_env_key");
    // A hostname may start with a digit in Manager; it is still a valid CR name.
    let mut row = team_wiki();
    row.hostname = "1st-box".into();
    assert!(map(&row, &Grants::default()).is_ok());
}

#[test]
fn nvidia_defaults() {
    let mut row = team_wiki();
    row.nvidia_requested = 1;
    let d = map(&row, &Grants::default()).unwrap();
    assert!(!d.env.contains_key("NVIDIA_VISIBLE_DEVICES"), "left to the device plugin: {:?}", d.env.keys());
    assert_eq!(d.env["NVIDIA_DRIVER_CAPABILITIES"], "utility compute");
}

#[test]
fn nvidia_requested_is_one_gpu() {
    let gpus = |nvidia: i64| {
        let mut row = team_wiki();
        row.nvidia_requested = nvidia;
        map(&row, &Grants::default()).unwrap().workload.spec.resources.unwrap().gpus
    };
    assert_eq!(gpus(1), Some(1));
    assert_eq!(gpus(0), None, "no GPU field at all, so rows without GPUs keep their CRs as they were");
    let mut row = team_wiki();
    let without = map(&row, &Grants::default()).unwrap().hash;
    row.nvidia_requested = 1;
    assert_ne!(map(&row, &Grants::default()).unwrap().hash, without, "a changed flag is applied");
}

#[test]
fn keys_round_trip_through_labels() {
    let key = RowKey { node_id: 7, id: 42 };
    assert_eq!(key_of(&labels(key, "x")), Some(key));
    assert_eq!(key_of(&BTreeMap::new()), None);
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any row maps or is a named row error, never a panic; a mapped row carries no env
        /// value in its CR, names a valid object, and maps the same way twice.
        #[test]
        fn any_row_maps_safely(
            hostname in "[a-z0-9-]{0,70}",
            template in proptest::option::of("[a-zA-Z0-9./:@_-]{0,40}"),
            entrypoint in proptest::option::of(".{0,40}"),
            values in proptest::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,8}", "[a-z]{12,20}", 0..5),
            nvidia in 0i64..2,
        ) {
            let mut row = team_wiki();
            row.hostname = hostname;
            row.template = template;
            row.entrypoint = entrypoint;
            row.environment_vars = Some(serde_json::to_string(&values).unwrap());
            row.nvidia_requested = nvidia;
            if let Ok(d) = map(&row, &Grants::default()) {
                prop_assert!(is_dns_label(&d.name));
                let cr = serde_json::to_string(&d.workload).unwrap();
                for value in values.values() {
                    prop_assert!(!cr.contains(value.as_str()), "env value in the CR");
                }
                let again = map(&row, &Grants::default()).unwrap();
                prop_assert_eq!(d.hash, again.hash);
            }
        }
    }
}

#[test]
fn the_approved_rootfs_becomes_the_workloads_volume() {
    use crate::resource::RetentionPolicy;
    let grant = |v| GrantRow {
        site_id: 2,
        hostname: "pg-analytics".into(),
        username: "jsmith".into(),
        resource_type: "rootfs".into(),
        value: v,
    };
    let grants = Grants::from_rows([grant(20), grant(80)]);
    assert_eq!(grants.for_row(&pg_analytics_from_postgres()).rootfs_gb, Some(80), "the latest approval");
    let mapped = map(&pg_analytics_from_postgres(), &grants).unwrap();
    let v = &mapped.workload.spec.volumes[0];
    assert_eq!((v.name.as_str(), v.mount_path.as_str(), v.size.as_str()), ("rootfs", "/data", "80Gi"));
    assert_eq!((v.storage_class_name.as_deref(), v.retention_policy), (None, Some(RetentionPolicy::Retain)));
    // Manager's default disk when none is approved.
    let v = &map(&team_wiki(), &Grants::default()).unwrap().workload.spec.volumes[0];
    assert_eq!(v.size, format!("{DEFAULT_ROOTFS_GB}Gi"));

    let defaults = defaults();
    let settings = RootfsVolume {
        mount_path: Some("/srv".into()),
        storage_class: Some("fast".into()),
        on_delete: RetentionPolicy::Delete,
    };
    let cx = Context {
        namespace: "w",
        field_manager: "b",
        defaults: &defaults,
        grants: &grants,
        requests_percent: 100,
        rootfs: &settings,
        service: &Default::default(),
        system_images: &Default::default(),
        isolation: &None,
    };
    let v = desired(&pg_analytics_from_postgres(), &cx).unwrap().workload.spec.volumes[0].clone();
    assert_eq!((v.mount_path.as_str(), v.storage_class_name.as_deref()), ("/srv", Some("fast")));
    assert_eq!(v.retention_policy, Some(RetentionPolicy::Delete));
    let off = RootfsVolume { mount_path: None, ..settings.clone() };
    let cx = Context { rootfs: &off, ..cx };
    assert!(desired(&pg_analytics_from_postgres(), &cx).unwrap().workload.spec.volumes.is_empty(), "turned off");

    let bad = Grants::from_rows([grant(0)]);
    assert!(matches!(map(&pg_analytics_from_postgres(), &bad), Err(RowError::BadResource { resource: "rootfs", .. })));
}

fn service_row(kind: &str, port: i64, protocol: Option<&str>) -> crate::bridge::rows::ServiceRow {
    crate::bridge::rows::ServiceRow {
        container_id: 1,
        kind: kind.into(),
        internal_port: port,
        protocol: protocol.map(Into::into),
    }
}

#[test]
fn http_and_transport_services_become_the_ports_and_the_service() {
    use crate::resource::{Protocol, ServiceType};
    let mut row = team_wiki();
    row.services = vec![
        service_row("http", 8080, None),
        // A second hostname on the same port: the same port.
        service_row("http", 8080, None),
        service_row("transport", 5432, Some("tcp")),
        service_row("transport", 5353, Some("udp")),
        // tcp on an http port: still one port.
        service_row("transport", 8080, Some("tcp")),
    ];
    let d = map(&row, &Grants::default()).unwrap();
    let ports: Vec<_> = d
        .workload
        .spec
        .ports
        .iter()
        .map(|p| (p.container_port, p.name.clone().unwrap(), p.protocol.unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            (5353, "udp-5353".to_string(), Protocol::UDP),
            (5432, "tcp-5432".to_string(), Protocol::TCP),
            (8080, "http-8080".to_string(), Protocol::TCP),
        ]
    );
    let service = d.workload.spec.service.as_ref().unwrap();
    assert_eq!(service.type_, Some(ServiceType::ClusterIP), "the bridge's default");

    // A row without services: no ports, and no Service (Kubernetes refuses one without ports).
    let plain = map(&team_wiki(), &Grants::default()).unwrap();
    assert!(plain.workload.spec.ports.is_empty() && plain.workload.spec.service.is_none());

    // The bridge's settings: a load balancer with its class and annotations, or no Service.
    let defaults = defaults();
    let settings = ServiceSettings {
        type_: Some(ServiceType::LoadBalancer),
        load_balancer_class: Some("metallb.io/metallb".into()),
        annotations: [("metallb.io/address-pool".to_string(), "manager".to_string())].into(),
    };
    let grants = Grants::default();
    let cx = Context {
        namespace: "workloads",
        field_manager: "mw-bridge",
        defaults: &defaults,
        grants: &grants,
        requests_percent: 100,
        rootfs: &Default::default(),
        service: &settings,
        system_images: &Default::default(),
        isolation: &None,
    };
    let lb = desired(&row, &cx).unwrap().workload.spec.service.unwrap();
    assert_eq!(lb.type_, Some(ServiceType::LoadBalancer));
    assert_eq!(lb.load_balancer_class.as_deref(), Some("metallb.io/metallb"));
    assert_eq!(lb.annotations["metallb.io/address-pool"], "manager");
    let none = ServiceSettings { type_: None, ..settings.clone() };
    let cx = Context { service: &none, ..cx };
    let d = desired(&row, &cx).unwrap();
    assert_eq!(d.workload.spec.ports.len(), 3, "ports are declared either way");
    assert!(d.workload.spec.service.is_none());
}

#[test]
fn bad_services_are_row_errors_naming_the_service() {
    for (service, why) in [
        (service_row("http", 0, None), "not a port number"),
        (service_row("http", 70000, None), "not a port number"),
        (service_row("transport", 2000, None), "TransportServices row"),
        (service_row("transport", 2000, Some("sctp")), "TransportServices row"),
    ] {
        let mut row = team_wiki();
        row.services = vec![service.clone()];
        let err = map(&row, &Grants::default()).unwrap_err();
        assert_eq!(err.reason(), "bad_service");
        let text = err.to_string();
        assert!(text.contains(why) && text.contains(&service.internal_port.to_string()), "{text}");
    }
    // dns services have no port of the container's own: ignored (the query reads none).
    let mut row = team_wiki();
    row.services = vec![service_row("dns", 53, None)];
    assert!(map(&row, &Grants::default()).unwrap().workload.spec.ports.is_empty());
}

#[test]
fn isolation_entries_name_where_connections_may_come_from() {
    let entries = |list: &[&str]| list.iter().map(|e| e.to_string()).collect::<Vec<_>>();
    assert_eq!(isolation(&[]).unwrap(), None, "unset: no isolation");
    assert_eq!(isolation(&entries(&[" "])).unwrap(), None);
    assert_eq!(isolation(&entries(&["none"])).unwrap(), Some(Isolation::default()), "isolated, nothing allowed");
    let both =
        isolation(&entries(&["cidr:10.0.0.0/24", "namespace:ingress-nginx", "cidr:fd00::/64"])).unwrap().unwrap();
    assert_eq!(both.allow_from[0].cidr.as_deref(), Some("10.0.0.0/24"));
    let labels = both.allow_from[1].namespace_labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/metadata.name"], "ingress-nginx");
    assert_eq!(both.allow_from[2].cidr.as_deref(), Some("fd00::/64"));
    for bad in
        ["10.0.0.0/24", "cidr:10.0.0.0", "cidr:10.0.0.0/33", "namespace:Ingress", "pods:web", "none,cidr:1.2.3.4/32"]
    {
        let err = isolation(&entries(&bad.split(',').collect::<Vec<_>>())).unwrap_err();
        assert!(err.contains("cidr:<address>/<bits>, namespace:<name> or none"), "{bad}: {err}");
    }
}
