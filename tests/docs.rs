//! The docs say what the code does (no cluster needed): where a page states something the
//! code or the shipped files decide, it is compared with them here.

use mw_operator::check::{
    Component, Crd, Facts, Identity, LeaseScope, Review, asks, checklist, lease_required, required, unwanted,
};
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The documents of a multi-document YAML file.
fn documents(path: &str) -> Vec<Value> {
    read(path)
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

/// The first fenced code block after `marker` in `text`.
fn block_after<'a>(text: &'a str, marker: &str) -> &'a str {
    let start = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let open = start + text[start..].find("```").expect("a code block") + 3;
    let open = open + text[open..].find('\n').unwrap() + 1;
    let close = open + text[open..].find("```").expect("its end");
    &text[open..close]
}

/// `check`'s checklist for a healthy install, as the operator's identity would get it.
fn healthy_checklist(namespaces: &[&str], lease: &LeaseScope) -> String {
    let namespaces: Vec<String> = namespaces.iter().map(|s| s.to_string()).collect();
    let reviews = asks(Component::Operator, &namespaces, Some(lease))
        .unwrap()
        .into_iter()
        .map(|a| Review {
            namespace: a.namespace,
            permission: a.permission,
            required: a.required,
            allowed: Ok(a.required),
        })
        .collect();
    let facts = Facts {
        component: Component::Operator,
        server: "https://10.0.0.1:6443".into(),
        connection: Ok("v1.36.3".into()),
        identity: Some(Ok(Identity {
            username: "system:serviceaccount:mw-system:mw-operator".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:mw-system".into(),
                "system:authenticated".into(),
            ],
        })),
        crd: Some(Ok(Crd::Served { status_subresource: true })),
        reviews,
    };
    checklist(&facts).to_text()
}

#[test]
fn install_md_shows_the_checklist_check_prints() {
    let install = read("docs/install.md");
    // The sample is for the command above it: two namespaces, the Lease in mw-system.
    assert!(
        install.contains("mw-operator check --kubeconfig $KC --namespace team-a,team-b --lease-namespace mw-system")
    );
    let sample = block_after(&install, "A healthy namespace-scoped install prints:");
    let real = healthy_checklist(
        &["team-a", "team-b"],
        &LeaseScope { namespace: "mw-system".into(), name: "mw-operator".into() },
    );
    // The count, from the same code `check` runs.
    let count = sample.lines().last().unwrap();
    assert_eq!(count, real.lines().last().unwrap(), "docs/install.md's sample check output counts wrong");
    let expected = 3
        + 2 * (required(Component::Operator).unwrap().len() + unwanted(Component::Operator).len())
        + lease_required(Component::Operator, "mw-operator").unwrap().len();
    assert!(count.starts_with(&format!("{expected} checks: {expected} passed")), "{count}");
    // Every line shown (but the elisions) is a line check prints.
    for line in sample.lines().filter(|l| *l != "…") {
        assert!(real.lines().any(|r| r == line), "docs/install.md shows a line check does not print: {line:?}\n{real}");
    }
}

/// The operator's Deployment in the plain manifests (rendered from the chart).
fn shipped_deployment(path: &str) -> Value {
    documents(path)
        .into_iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "mw-operator")
        .unwrap_or_else(|| panic!("no operator Deployment in {path}"))
}

/// Every number written as "`replicas: N`" in `text`.
fn replicas_mentioned(text: &str) -> Vec<u64> {
    text.match_indices("`replicas: ")
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            rest[..rest.find('`')?].parse().ok()
        })
        .collect()
}

#[test]
fn install_and_operations_md_state_the_charts_replicas_and_strategy() {
    for path in ["config/install/cluster-wide.yaml", "config/install/namespaced.yaml"] {
        let deployment = shipped_deployment(path);
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
        let strategy = deployment["spec"]["strategy"]["type"].as_str().unwrap();
        let values: Value = serde_saphyr::from_str(&read("charts/mw-operator/values.yaml")).unwrap();
        assert_eq!(values["replicas"].as_u64(), Some(replicas));

        // install.md is about the operator's install: every replica count and strategy it
        // names is the shipped one.
        let install = read("docs/install.md");
        let counts = replicas_mentioned(&install);
        assert!(!counts.is_empty(), "docs/install.md does not say how many replicas run");
        assert!(
            counts.iter().all(|n| *n == replicas),
            "docs/install.md says replicas {counts:?}, the chart {replicas}"
        );
        assert!(install.contains(&format!("`strategy: {strategy}`")), "docs/install.md does not name {strategy}");
        for other in ["Recreate", "RollingUpdate"].into_iter().filter(|s| *s != strategy) {
            assert!(!install.contains(other), "docs/install.md names strategy {other}; the chart's is {strategy}");
        }
        assert!(!install.contains("one-replica Deployment"), "docs/install.md");

        // operations.md: the default first, and the strategy.
        let operations = read("docs/operations.md");
        assert_eq!(replicas_mentioned(&operations).first(), Some(&replicas), "docs/operations.md");
        assert!(operations.contains(&format!("`{strategy}`")), "docs/operations.md does not name {strategy}");
        let rolling = &deployment["spec"]["strategy"]["rollingUpdate"];
        for key in ["maxSurge", "maxUnavailable"] {
            let said = format!("`{key}: {}`", rolling[key]);
            assert!(operations.contains(&said) && install.contains(&said), "{said} is not what the docs say");
        }
    }
}

#[test]
fn manager_md_names_the_provider_as_shipped() {
    let manager = read("docs/manager.md");
    // Every file of the provider it links exists.
    let mut links = 0;
    for (i, _) in manager.match_indices("](../integrations/manager/") {
        let rest = &manager[i + 5..];
        let path = &rest[..rest.find(')').unwrap()];
        assert!(std::path::Path::new(path).exists(), "docs/manager.md links {path}, which does not exist");
        links += 1;
    }
    assert!(links >= 4, "docs/manager.md links the provider's files");
    // The package name, the tarball `npm pack` makes of it, and the patch file.
    let package: Value = serde_json::from_str(&read("integrations/manager/package.json")).unwrap();
    let name = package["name"].as_str().unwrap();
    assert!(manager.contains(&format!("require('{name}')")), "docs/manager.md does not name the package {name}");
    let tarball =
        format!("{}-{}.tgz", name.trim_start_matches('@').replace('/', "-"), package["version"].as_str().unwrap());
    assert!(manager.contains(&tarball), "docs/manager.md does not name {tarball}");
    assert!(read("integrations/manager/lib/kubernetes-api.js").contains("module.exports"));
    let patch = "integrations/manager/patches/manager-v2026.7.4.patch";
    assert!(manager.contains(patch) && std::path::Path::new(patch).exists(), "{patch}");
    // Each provider setting it lists is read by the provider and is also the bridge's flag.
    let mapping = read("integrations/manager/lib/mapping.js");
    let bridge = read("src/bridge/mod.rs");
    let table = &manager[manager.find("| `MW_ROOTFS_MOUNT_PATH`").expect("the settings table")..];
    let mut settings = 0;
    for line in table.lines().map(str::trim_start).take_while(|l| l.starts_with('|')) {
        for var in line.split('`').filter(|w| w.starts_with("MW_")) {
            assert!(mapping.contains(&format!("env.{var}")), "the provider does not read {var}");
            // The bridge's Service annotations are a repeated flag, not an environment variable.
            let flag = match var {
                "MW_SERVICE_ANNOTATIONS" => "long = \"service-annotation\"".to_string(),
                _ => format!("env = \"{var}\""),
            };
            assert!(bridge.contains(&flag), "the bridge has no flag for {var}");
            settings += 1;
        }
    }
    assert!(settings >= 6, "{settings} settings");
    // And it does not send users to `check` with a Manager node's credentials.
    assert!(!manager.contains("check --kubeconfig <node's kubeconfig>"), "docs/manager.md");
}

/// The CRD's schema of `spec.ports[].containerPort`.
fn container_port_schema() -> Value {
    let crd = documents("crds/managedworkloads.opensource-server.mieweb.org.yaml").remove(0);
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    spec["properties"]["ports"]["items"]["properties"]["containerPort"].clone()
}

#[test]
fn resource_md_quotes_the_crds_container_port_bounds() {
    let schema = container_port_schema();
    let (min, max) = (schema["minimum"].as_f64().unwrap(), schema["maximum"].as_f64().unwrap());
    let resource = read("docs/resource.md");
    let row = |input: &str| -> String {
        resource
            .lines()
            .find(|l| l.starts_with(&format!("| `containerPort: {input}`")))
            .unwrap_or_else(|| panic!("docs/resource.md has no row for containerPort: {input}"))
            .to_string()
    };
    let below = row("0");
    assert!(below.contains(&format!("greater than or equal to {min}")), "{below}");
    let above = row("70000");
    assert!(70000.0 > max);
    assert!(above.contains(&format!("less than or equal to {max}")), "{above}");
    // And tests/validation.rs applies the same input and expects the same words.
    let validation = read("tests/validation.rs");
    assert!(
        validation.contains("\"containerPort\": 70000") && validation.contains(&format!("less than or equal to {max}"))
    );
}

#[test]
fn operations_md_names_stalled_reasons_not_condition_types() {
    let operations = read("docs/operations.md");
    let table = &operations[operations.find("**`Stalled=True`, by reason.**").expect("the Stalled table")..];
    let reasons: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("| reason"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('`').nth(1).unwrap_or(""))
        .collect();
    assert!(reasons.contains(&"FailedCreate"), "{reasons:?}");
    // A mirrored Deployment condition's type is never a reason: the reason is copied from it.
    for type_ in mw_operator::operator::status::MIRRORED {
        assert!(!reasons.contains(&type_), "docs/operations.md gives the condition type {type_} as a reason");
    }
}

#[test]
fn the_readme_leads_with_installing_and_says_no_image_is_published() {
    let readme = read("README.md");
    let install = readme.find("## Install on your cluster").expect("an install section");
    let no_image = readme.find("No image is published").expect("says no image is published");
    let build = readme.find("docker build").expect("how to build the image");
    let push = readme.find("docker push").expect("how to push it");
    let local = readme.find("make demo").expect("local development");
    assert!(
        install < no_image && no_image < build && build < push && push < local,
        "install first, then local development"
    );
    let first_section = readme.find("\n## ").unwrap();
    assert_eq!(first_section + 1, install, "the first section is the install");
}

#[test]
fn the_docs_stand_alone() {
    let mut pages = vec!["README.md".to_string()];
    for entry in std::fs::read_dir("docs").unwrap() {
        pages.push(entry.unwrap().path().display().to_string());
    }
    for page in &pages {
        let text = read(page);
        let lower = text.to_lowercase();
        for phrase in ["design brief", "the brief", "the design lists", "design.md"] {
            assert!(!lower.contains(phrase), "{page} cites {phrase:?}, which is not in the repository");
        }
        // Every relative link points at a file of the repository.
        let dir = std::path::Path::new(page).parent().unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            // Not a link: `](` inside code (a regular expression, say).
            let path_like = target.chars().all(|c| c.is_ascii_alphanumeric() || "._/#-".contains(c));
            if !path_like || target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            assert!(dir.join(file).exists(), "{page} links to {target}, which does not exist");
        }
    }
}

#[test]
fn performance_md_reads_as_sizing_guidance() {
    let performance = read("docs/performance.md");
    let sizing = performance.find("## Sizing the operator").expect("a sizing section");
    let measured = performance.find("## Measurements").expect("the measurements");
    assert!(sizing < measured, "sizing first, then the measurements it comes from");
    assert!(performance[sizing..measured].contains("per 1,000 workloads"));
    for progress in ["this round", "What changed", "Against the targets"] {
        assert!(!performance.contains(progress), "docs/performance.md reads as a progress report: {progress:?}");
    }
}
