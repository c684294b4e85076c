//! The metrics a registry exports, read from its text exposition: each family by the name a
//! scrape shows (a counter with its `_total`), its type, and the values of each label.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::registry::Registry;

#[derive(Debug, Default)]
pub struct Family {
    pub kind: String,
    /// Label name → the values exported (`le` left out).
    pub labels: BTreeMap<String, BTreeSet<String>>,
    /// Whether any sample was exported (a labelled family shows none until a series exists).
    pub sampled: bool,
}

pub fn families(registry: &Registry) -> BTreeMap<String, Family> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encoding the registry");
    let mut bases: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            bases.insert(name.to_string(), Family { kind: kind.to_string(), ..Default::default() });
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..name_end];
        let (_, family) = bases
            .iter_mut()
            .filter(|(base, _)| {
                sample == base.as_str()
                    || ["_total", "_bucket", "_sum", "_count", "_created"]
                        .iter()
                        .any(|suffix| sample.strip_suffix(suffix) == Some(base.as_str()))
            })
            .max_by_key(|(base, _)| base.len())
            .unwrap_or_else(|| panic!("sample {sample} of no family"));
        family.sampled = true;
        if let Some(labels) = line[name_end..].strip_prefix('{').and_then(|l| l.split_once('}')).map(|(l, _)| l) {
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once("=\"").expect("label=\"value\"");
                if key != "le" {
                    family.labels.entry(key.to_string()).or_default().insert(value.trim_end_matches('"').to_string());
                }
            }
        }
    }
    bases
        .into_iter()
        .map(|(base, family)| (if family.kind == "counter" { format!("{base}_total") } else { base }, family))
        .collect()
}
