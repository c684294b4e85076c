//! Is the live Deployment already what we would apply? Answering this without a write is
//! what keeps an idle operator from touching the API server.
//!
//! Two checks, both pure:
//! - the live object carries the fingerprint of the desired object (catches every change of
//!   ours, including removed fields, which a subset check cannot see);
//! - every field we set has the same value live (catches hand edits: `kubectl scale`,
//!   `kubectl set image`, edited labels). Fields the API server defaulted or another manager
//!   added are ignored: re-applying would not change them.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

use crate::desired::APPLIED_HASH_ANNOTATION;

/// True when applying `desired` would change nothing on `live`.
pub fn up_to_date(desired: &Deployment, live: &Deployment) -> bool {
    let annotation =
        |d: &Deployment| d.metadata.annotations.as_ref().and_then(|a| a.get(APPLIED_HASH_ANNOTATION)).cloned();
    if annotation(desired).is_none() || annotation(desired) != annotation(live) {
        return false;
    }
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(mut d), Ok(l)) => {
            // Status is not ours, and kind/apiVersion are the same type by construction.
            if let Value::Object(map) = &mut d {
                map.remove("status");
            }
            contains(&d, &l, false)
        }
        _ => false,
    }
}

/// `live` was last applied from exactly this desired object, so any difference between them is
/// someone else's edit (drift) rather than a change of the workload's spec.
pub fn same_desired(desired: &Deployment, live: &Deployment) -> bool {
    let fingerprint = |d: &Deployment| d.metadata.annotations.as_ref()?.get(APPLIED_HASH_ANNOTATION).cloned();
    fingerprint(desired).is_some() && fingerprint(desired) == fingerprint(live)
}

/// `want` is contained in `have`: objects key by key (extra keys in `have` allowed), arrays
/// element by element with equal length, scalars equal. `resource_list` marks the value of a
/// `requests`/`limits` key, whose quantities the API server rewrites (`1000m` becomes `1`).
fn contains(want: &Value, have: &Value, resource_list: bool) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) if resource_list => w.iter().all(|(k, wv)| {
            h.get(k).is_some_and(|hv| match (wv, hv) {
                (Value::String(a), Value::String(b)) => a == b || quantity_eq(a, b),
                _ => wv == hv,
            })
        }),
        (Value::Object(w), Value::Object(h)) => {
            w.iter().all(|(k, wv)| h.get(k).is_some_and(|hv| contains(wv, hv, k == "requests" || k == "limits")))
        }
        (Value::Array(w), Value::Array(h)) => w.len() == h.len() && w.iter().zip(h).all(|(a, b)| contains(a, b, false)),
        _ => want == have,
    }
}

fn quantity_eq(a: &str, b: &str) -> bool {
    matches!((parse_quantity(a), parse_quantity(b)), (Some(x), Some(y)) if x == y)
}

/// A resource quantity in nano-units (so `1`, `1000m` and `1000000000n` are all 10^9), or
/// None if it is not one. Exact for every value a CPU or memory field can hold.
pub fn parse_quantity(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (multiplier, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse().ok()?),
        _ => return None,
    };
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits: i128 = format!("{int}{frac}").parse().ok()?;
    // value = digits * 10^(exp10 - len(frac)) * multiplier, expressed in units of 10^-9.
    let scale = exp10 - frac.len() as i32 + 9;
    let scaled = if scale >= 0 {
        digits.checked_mul(10_i128.checked_pow(scale as u32)?)?
    } else {
        digits / 10_i128.checked_pow((-scale) as u32)?
    };
    let value = scaled.checked_mul(multiplier)?;
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired;
    use crate::resource::{ManagedWorkload, ManagedWorkloadSpec, Quantity, ResourceList, Resources};
    use k8s_openapi::api::core::v1::Container;

    fn workload() -> ManagedWorkload {
        let mut mw = ManagedWorkload::new(
            "web",
            ManagedWorkloadSpec {
                image: "nginx:latest".into(),
                resources: Some(Resources {
                    requests: Some(ResourceList {
                        cpu: Some(Quantity("1000m".into())),
                        memory: Some(Quantity("1024Mi".into())),
                    }),
                    limits: None,
                }),
                ..Default::default()
            },
        );
        mw.metadata.namespace = Some("apps".into());
        mw.metadata.uid = Some("uid-1".into());
        mw
    }

    /// What the API server returns for an applied Deployment: defaults filled in, quantities
    /// canonicalized, system metadata added.
    fn as_stored(d: &Deployment) -> Deployment {
        let mut live = d.clone();
        live.metadata.uid = Some("dep-uid".into());
        live.metadata.resource_version = Some("42".into());
        live.metadata.generation = Some(1);
        let spec = live.spec.as_mut().unwrap();
        let pod = spec.template.spec.as_mut().unwrap();
        pod.restart_policy = Some("Always".into());
        pod.dns_policy = Some("ClusterFirst".into());
        let c: &mut Container = &mut pod.containers[0];
        c.image_pull_policy = Some("Always".into());
        c.termination_message_path = Some("/dev/termination-log".into());
        let requests = c.resources.as_mut().unwrap().requests.as_mut().unwrap();
        requests.insert("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()));
        requests.insert("memory".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()));
        live.status = Some(Default::default());
        live
    }

    #[test]
    fn server_defaults_and_canonical_quantities_are_up_to_date() {
        let desired = desired::deployment(&workload()).unwrap();
        assert!(up_to_date(&desired, &as_stored(&desired)));
    }

    #[test]
    fn hand_edits_of_our_fields_are_drift() {
        let desired = desired::deployment(&workload()).unwrap();
        let mut scaled = as_stored(&desired);
        scaled.spec.as_mut().unwrap().replicas = Some(3);
        assert!(!up_to_date(&desired, &scaled));

        let mut reimaged = as_stored(&desired);
        reimaged.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].image = Some("evil:1".into());
        assert!(!up_to_date(&desired, &reimaged));

        let mut relabelled = as_stored(&desired);
        relabelled.metadata.labels.as_mut().unwrap().remove(desired::MANAGED_LABEL);
        assert!(!up_to_date(&desired, &relabelled));

        assert!(same_desired(&desired, &scaled), "a hand edit leaves our fingerprint in place");

        let mut extra_env = as_stored(&desired);
        extra_env.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].env =
            Some(vec![Default::default()]);
        assert!(up_to_date(&desired, &extra_env), "a field we never set is not ours to fight over");
    }

    #[test]
    fn a_changed_spec_is_not_up_to_date_even_when_it_only_removes_fields() {
        let mut mw = workload();
        mw.spec.hostname = Some("box".into());
        let before = desired::deployment(&mw).unwrap();
        mw.spec.hostname = None;
        let after = desired::deployment(&mw).unwrap();
        assert!(!up_to_date(&after, &as_stored(&before)));
    }

    #[test]
    fn quantities_compare_by_value() {
        let q = |s| parse_quantity(s).unwrap();
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_ne!(q("1G"), q("1Gi"));
        assert_eq!(q("-1"), -q("1"));
        for bad in ["", "abc", "1x", "1.2.3", "Mi"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }
}
