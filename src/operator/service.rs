//! The Service a ManagedWorkload with `spec.service` should have (a pure function of the CR),
//! and what the live Service says about the workload's address.
//!
//! Naming: a Service name must start with a letter, but a workload's name (like Manager's
//! hostnames) may start with a digit. A name starting with a letter is used as is; one
//! starting with a digit gets the prefix `mw-` (`1web` → `mw-1web`), and if that passes 63
//! characters it is cut and ends in `-` plus 8 hex digits of its fingerprint, so long names
//! sharing a prefix still differ. Workloads `mw-1web` and `1web` in one namespace would want
//! the same Service: the second is blocked (`ServiceConflict`), as with any foreign Service.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec as KubeServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::ownership::{fingerprint, labels, selector_labels, stamp_applied_hash};
use crate::resource::{ContainerPort, ManagedWorkload, Protocol, ServicePortStatus, ServiceStatus, ServiceType};

/// Prefix of the Service of a workload whose name starts with a digit.
pub const DIGIT_PREFIX: &str = "mw-";
/// Longest Service name Kubernetes accepts (a DNS-1035 label).
const MAX_NAME: usize = 63;
/// Hex digits of the fingerprint that end a shortened name.
const SHORT_HASH: usize = 8;

/// The name of the workload's Service (see the module comment).
pub fn service_name(workload: &str) -> String {
    if workload.starts_with(|c: char| c.is_ascii_lowercase()) {
        return workload.to_string();
    }
    let prefixed = format!("{DIGIT_PREFIX}{workload}");
    if prefixed.len() <= MAX_NAME {
        return prefixed;
    }
    let hash = &fingerprint(&workload)[..SHORT_HASH];
    let keep = MAX_NAME - DIGIT_PREFIX.len() - 1 - SHORT_HASH;
    // Workload names are ASCII (an RFC 1123 subdomain), so any byte index is a boundary.
    format!("{DIGIT_PREFIX}{}-{hash}", &workload[..keep])
}

/// The desired Service, ready for server-side apply; `None` when none is asked for, or the
/// CR has no UID yet (never stored, so nothing can be owned by it).
pub fn service(mw: &ManagedWorkload) -> Option<Service> {
    let wanted = mw.spec.service.as_ref()?;
    let owner = mw.controller_owner_ref(&())?;
    let type_ = wanted.service_type();
    let load_balancer = type_ == ServiceType::LoadBalancer;
    let mut service = Service {
        metadata: ObjectMeta {
            name: Some(service_name(&mw.name_any())),
            namespace: mw.namespace(),
            labels: Some(labels(mw)),
            annotations: (!wanted.annotations.is_empty()).then(|| wanted.annotations.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(KubeServiceSpec {
            type_: Some(type_.as_str().into()),
            selector: Some(selector_labels(mw)),
            ports: Some(ports(&mw.spec.ports)),
            load_balancer_class: wanted.load_balancer_class.clone().filter(|_| load_balancer),
            load_balancer_source_ranges: (load_balancer && !wanted.load_balancer_source_ranges.is_empty())
                .then(|| wanted.load_balancer_source_ranges.clone()),
            external_traffic_policy: wanted
                .external_traffic_policy
                .filter(|_| type_ != ServiceType::ClusterIP)
                .map(|p| p.as_str().into()),
            ..Default::default()
        }),
        status: None,
    };
    stamp_applied_hash(&mut service);
    Some(service)
}

/// One Service port per container port, targeting it by name when it has one (so a
/// renumbered container port stays targeted), else by number. A multi-port Service needs
/// every port named: an unnamed one becomes `<protocol>-<number>`, unique among the names.
fn ports(ports: &[ContainerPort]) -> Vec<ServicePort> {
    let mut taken: BTreeSet<String> = ports.iter().filter_map(|p| p.name.clone()).collect();
    ports
        .iter()
        .map(|p| {
            let protocol = p.protocol.unwrap_or(Protocol::TCP);
            let (name, target) = match &p.name {
                Some(name) => (name.clone(), IntOrString::String(name.clone())),
                None => {
                    let name =
                        unique(format!("{}-{}", protocol.as_str().to_ascii_lowercase(), p.container_port), &taken);
                    taken.insert(name.clone());
                    (name, IntOrString::Int(p.container_port))
                }
            };
            ServicePort {
                name: Some(name),
                port: p.container_port,
                protocol: Some(protocol.as_str().into()),
                target_port: Some(target),
                ..Default::default()
            }
        })
        .collect()
}

/// `name`, or `name-2`, `name-3`, ... : the first not in `taken`.
fn unique(name: String, taken: &BTreeSet<String>) -> String {
    if !taken.contains(&name) {
        return name;
    }
    (2..).map(|n| format!("{name}-{n}")).find(|n| !taken.contains(n)).unwrap_or(name)
}

/// What `status.service` reports of the live Service.
pub fn status(service: &Service) -> ServiceStatus {
    let name = service.name_any();
    let namespace = service.namespace().unwrap_or_default();
    let spec = service.spec.as_ref();
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| ServicePortStatus {
            name: p.name.clone().unwrap_or_default(),
            port: p.port,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            node_port: p.node_port,
        })
        .collect();
    ServiceStatus {
        dns_name: format!("{name}.{namespace}.svc"),
        name,
        type_: spec.and_then(|s| s.type_.clone()).unwrap_or_else(|| ServiceType::ClusterIP.as_str().into()),
        cluster_ip: cluster_ip(service).map(str::to_owned),
        ports,
        load_balancer_ingress: ingress(service),
    }
}

/// The cluster IP, unless the Service has none (`None`, a headless Service).
fn cluster_ip(service: &Service) -> Option<&str> {
    service.spec.as_ref()?.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The load balancer's addresses: an IP, else a host name (AWS's ELBs have only names).
pub fn ingress(service: &Service) -> Vec<String> {
    // Only while it is a LoadBalancer: after a change of type, the status keeps the old ingress
    // until the cloud tears it down, and an address on its way out must not reach clients (or
    // Manager, through the bridge).
    if !is_load_balancer(service) {
        return Vec::new();
    }
    let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    ingress.into_iter().flatten().filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone())).collect()
}

/// The address clients should use: the load balancer's first address, else the cluster IP.
pub fn address(service: &Service) -> Option<String> {
    ingress(service).into_iter().next().or_else(|| cluster_ip(service).map(str::to_owned))
}

/// A `LoadBalancer` Service still waiting for its load balancer's address.
pub fn waiting_for_load_balancer(service: &Service) -> bool {
    is_load_balancer(service) && ingress(service).is_empty()
}

fn is_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some(ServiceType::LoadBalancer.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{APPLIED_HASH_ANNOTATION, INSTANCE_LABEL, MANAGED_LABEL};

    use crate::resource::{ManagedWorkloadSpec, ServiceSpec, TrafficPolicy};
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus as KubeServiceStatus};
    use std::collections::BTreeMap;

    fn port(number: i32, name: Option<&str>, protocol: Option<Protocol>) -> ContainerPort {
        ContainerPort { container_port: number, name: name.map(Into::into), protocol }
    }

    fn workload(name: &str, service: Option<ServiceSpec>) -> ManagedWorkload {
        let spec = ManagedWorkloadSpec {
            image: "nginx".into(),
            ports: vec![port(80, Some("http"), None), port(5353, None, Some(Protocol::UDP))],
            service,
            ..Default::default()
        };
        let mut mw = ManagedWorkload::new(name, spec);
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("u1".into());
        mw
    }

    fn is_dns_1035(name: &str) -> bool {
        let b = name.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_lowercase()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    }

    #[test]
    fn no_service_unless_asked() {
        assert!(service(&workload("web", None)).is_none());
        let mut unstored = workload("web", Some(ServiceSpec::default()));
        unstored.metadata.uid = None;
        assert!(service(&unstored).is_none(), "nothing can be owned by a CR that was never stored");
    }

    #[test]
    fn the_service_has_the_workloads_ports_selector_labels_and_owner() {
        let mw = workload("web", Some(ServiceSpec::default()));
        let s = service(&mw).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(s.metadata.labels.as_ref(), Some(&labels(&mw)));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("u1", Some(true)));
        assert!(s.metadata.annotations.as_ref().unwrap().contains_key(APPLIED_HASH_ANNOTATION));
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        let selector = spec.selector.unwrap();
        assert_eq!(selector[INSTANCE_LABEL], "web");
        assert_eq!(selector[MANAGED_LABEL], "true");
        let ports = spec.ports.unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].port, ports[0].protocol.as_deref()),
            (Some("http"), 80, Some("TCP"))
        );
        assert_eq!(ports[0].target_port, Some(IntOrString::String("http".into())), "a named port: by name");
        assert_eq!(
            (ports[1].name.as_deref(), ports[1].port, ports[1].protocol.as_deref()),
            (Some("udp-5353"), 5353, Some("UDP"))
        );
        assert_eq!(ports[1].target_port, Some(IntOrString::Int(5353)), "an unnamed port: by number");
        assert!(spec.load_balancer_class.is_none() && spec.external_traffic_policy.is_none());
    }

    #[test]
    fn generated_port_names_never_clash_with_given_ones() {
        let made = ports(&[port(8080, Some("tcp-9090"), None), port(9090, None, None), port(9091, None, None)]);
        let names: Vec<_> = made.iter().map(|p| p.name.clone().unwrap()).collect();
        assert_eq!(names, ["tcp-9090", "tcp-9090-2", "tcp-9091"]);
    }

    #[test]
    fn load_balancer_settings_only_with_a_load_balancer() {
        let lb = ServiceSpec {
            type_: Some(ServiceType::LoadBalancer),
            load_balancer_class: Some("metallb.io/metallb".into()),
            load_balancer_source_ranges: vec!["203.0.113.0/24".into()],
            external_traffic_policy: Some(TrafficPolicy::Local),
            annotations: BTreeMap::from([("metallb.io/address-pool".into(), "public".into())]),
        };
        let s = service(&workload("web", Some(lb.clone()))).unwrap();
        assert_eq!(s.metadata.annotations.as_ref().unwrap()["metallb.io/address-pool"], "public");
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.load_balancer_class.as_deref(), Some("metallb.io/metallb"));
        assert_eq!(spec.load_balancer_source_ranges.unwrap(), ["203.0.113.0/24"]);
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));

        // The schema refuses these combinations; the builder never emits them either.
        let cluster_ip = ServiceSpec { type_: Some(ServiceType::ClusterIP), ..lb };
        let spec = service(&workload("web", Some(cluster_ip))).unwrap().spec.unwrap();
        assert!(spec.load_balancer_class.is_none());
        assert!(spec.load_balancer_source_ranges.is_none());
        assert!(spec.external_traffic_policy.is_none());
    }

    #[test]
    fn a_spec_change_changes_the_fingerprint() {
        let a = service(&workload("web", Some(ServiceSpec::default()))).unwrap();
        let b =
            service(&workload("web", Some(ServiceSpec { type_: Some(ServiceType::NodePort), ..Default::default() })))
                .unwrap();
        let hash = |s: &Service| s.metadata.annotations.as_ref().unwrap()[APPLIED_HASH_ANNOTATION].clone();
        assert_ne!(hash(&a), hash(&b));
        assert_eq!(hash(&a), hash(&service(&workload("web", Some(ServiceSpec::default()))).unwrap()), "stable");
    }

    #[test]
    fn every_valid_workload_name_gets_a_valid_service_name() {
        assert_eq!(service_name("web"), "web", "a letter first: the workload's own name");
        assert_eq!(service_name("1web"), "mw-1web", "a digit first: prefixed");
        assert_eq!(service_name("42"), "mw-42");
        let long_letter = format!("a{}", "b".repeat(62));
        assert_eq!(service_name(&long_letter), long_letter);
        let long_digit = format!("1{}", "x".repeat(62));
        let short = service_name(&long_digit);
        assert_eq!(short.len(), 63);
        assert!(short.starts_with("mw-1xxx"));
        let other = format!("1{}y", "x".repeat(61));
        assert_ne!(service_name(&other), short, "long names sharing a prefix still differ");
        let cut_at_dash = format!("1{}-{}", "x".repeat(49), "y".repeat(12));
        for name in ["0", "9-a", "1web", "123", &long_letter, &long_digit, &other, &cut_at_dash, "a-1", "z"] {
            assert!(is_dns_1035(&service_name(name)), "{name} → {}", service_name(name));
        }
        assert_eq!(service_name("1web"), service_name("1web"), "stable");
    }

    fn live(type_: &str, cluster_ip: Option<&str>, ingress: &[(Option<&str>, Option<&str>)]) -> Service {
        let mut s = service(&workload("1web", Some(ServiceSpec::default()))).unwrap();
        let spec = s.spec.as_mut().unwrap();
        spec.type_ = Some(type_.into());
        spec.cluster_ip = cluster_ip.map(Into::into);
        for p in spec.ports.iter_mut().flatten() {
            p.node_port = (type_ != "ClusterIP").then_some(30000 + p.port % 1000);
        }
        s.status = Some(KubeServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ingress
                        .iter()
                        .map(|(ip, host)| LoadBalancerIngress {
                            ip: ip.map(Into::into),
                            hostname: host.map(Into::into),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            conditions: None,
        });
        s
    }

    #[test]
    fn the_address_is_the_load_balancers_else_the_cluster_ip() {
        let cluster = live("ClusterIP", Some("10.96.0.10"), &[]);
        assert_eq!(address(&cluster).as_deref(), Some("10.96.0.10"));
        assert!(!waiting_for_load_balancer(&cluster));

        let pending = live("LoadBalancer", Some("10.96.0.10"), &[]);
        assert_eq!(address(&pending).as_deref(), Some("10.96.0.10"), "until the load balancer answers");
        assert!(waiting_for_load_balancer(&pending));

        let served = live("LoadBalancer", Some("10.96.0.10"), &[(Some("192.0.2.10"), None)]);
        assert_eq!(address(&served).as_deref(), Some("192.0.2.10"));
        assert!(!waiting_for_load_balancer(&served));
        let named = live("LoadBalancer", Some("10.96.0.10"), &[(None, Some("lb.example.com"))]);
        assert_eq!(address(&named).as_deref(), Some("lb.example.com"), "a load balancer known by name only");

        // Changed from LoadBalancer: the cloud has yet to tear the load balancer down.
        let dying = live("ClusterIP", Some("10.96.0.10"), &[(Some("192.0.2.10"), None)]);
        assert_eq!(address(&dying).as_deref(), Some("10.96.0.10"), "never the load balancer on its way out");
        assert!(ingress(&dying).is_empty() && !waiting_for_load_balancer(&dying));
        let node_port = live("NodePort", Some("10.96.0.10"), &[(Some("192.0.2.10"), None)]);
        assert_eq!(address(&node_port).as_deref(), Some("10.96.0.10"));

        assert_eq!(address(&live("ClusterIP", Some("None"), &[])), None, "headless: no address of its own");
        assert_eq!(address(&live("ClusterIP", None, &[])), None, "not allocated yet");
    }

    #[test]
    fn the_status_describes_the_live_service() {
        let s = status(&live("LoadBalancer", Some("10.96.0.10"), &[(Some("192.0.2.10"), None)]));
        assert_eq!(s.name, "mw-1web");
        assert_eq!(s.type_, "LoadBalancer");
        assert_eq!(s.cluster_ip.as_deref(), Some("10.96.0.10"));
        assert_eq!(s.dns_name, "mw-1web.apps.svc");
        assert_eq!(s.load_balancer_ingress, ["192.0.2.10"]);
        assert_eq!(
            s.ports,
            [
                ServicePortStatus { name: "http".into(), port: 80, protocol: "TCP".into(), node_port: Some(30080) },
                ServicePortStatus {
                    name: "udp-5353".into(),
                    port: 5353,
                    protocol: "UDP".into(),
                    node_port: Some(30353)
                },
            ]
        );
    }
}
