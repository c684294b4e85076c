//! The docs say what the code does: where a page states something the code or the shipped
//! files decide (a metric, a label value, a flag and its default, a permission, an object's
//! name, a link), it is derived here from the code or those files and compared, never from a
//! copy of the wording. No cluster is needed; the chart's object names need helm
//! (`MW_TEST_HELM`, which `make test` sets).

// The test's own helpers, beside it (a test file is a crate root: its modules resolve from
// tests/, where a file would be taken for a test target of its own).
#[path = "docs/exposition.rs"]
mod exposition;
#[path = "docs/markdown.rs"]
mod markdown;
#[path = "support/versions.rs"]
mod versions;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::CommandFactory;
use mw_operator::check::{
    Component, Crd, Facts, Identity, LeaseScope, Review, asks, checklist, lease_required, required, unwanted,
};
use prometheus_client::registry::Registry;
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
        lists: Some(mw_operator::reflect::Lists::Streamed),
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
    let expected = 4
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
    // And it does not send users to `check` with a Manager node's credentials.
    assert!(!manager.contains("check --kubeconfig <node's kubeconfig>"), "docs/manager.md");
}

/// The `MW_*` names `code` mentions, found as the provider's own test finds them
/// (integrations/manager/test/package.test.js: `\bMW_[A-Z_]+[A-Z]\b`).
fn mw_names(code: &str) -> BTreeSet<String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = code.as_bytes();
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("MW_") {
        if i > 0 && word(bytes[i - 1]) {
            continue;
        }
        let len = bytes[i..].iter().take_while(|b| b.is_ascii_uppercase() || **b == b'_').count();
        let name = &code[i..i + len];
        if len > 3 && !name.ends_with('_') && !bytes.get(i + len).is_some_and(|b| word(*b)) {
            names.insert(name.to_string());
        }
    }
    names
}

/// The rows of the first table after `marker` whose header starts with `header`, indented or
/// not (a table inside a list item is indented).
fn indented_table(text: &str, marker: &str, header: &str) -> Vec<Vec<String>> {
    let start = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let lines: Vec<&str> = text[start..].lines().map(str::trim_start).collect();
    let head = lines.iter().position(|l| l.starts_with(header)).unwrap_or_else(|| panic!("no table {header:?}"));
    lines[head + 2..].iter().take_while(|l| l.starts_with('|')).map(|l| markdown::cells(l)).collect()
}

#[test]
fn manager_md_lists_every_setting_the_provider_reads_beside_the_bridges() {
    // What the provider reads: every MW_* name in its code (index.js and lib/).
    let mut code = read("integrations/manager/index.js");
    let mut lib: Vec<_> = std::fs::read_dir("integrations/manager/lib").unwrap().map(|e| e.unwrap().path()).collect();
    lib.sort();
    for path in lib.iter().filter(|p| p.extension().is_some_and(|e| e == "js")) {
        code.push_str(&read(&path.display().to_string()));
    }
    let read_by_provider = mw_names(&code);
    assert!(read_by_provider.len() >= 10, "the scan finds the provider's settings: {read_by_provider:?}");
    let rows = indented_table(&read("docs/manager.md"), "3. **Settings**", "| variable |");
    let documented: BTreeSet<String> = rows
        .iter()
        .flat_map(|row| markdown::backticked(&row[0]))
        .filter(|name| name.starts_with("MW_"))
        .map(String::from)
        .collect();
    assert_eq!(
        documented, read_by_provider,
        "docs/manager.md's settings table against the MW_* names the provider reads"
    );

    // The bridge's column, against `mw-operator bridge`'s flags: each flag it names exists, with
    // the environment variable it gives (none where the flag has none), and a provider setting
    // that is also a bridge flag's environment variable names that flag.
    let bridge = flags(&subcommand("bridge"));
    let env_of = |arg: &clap::Arg| arg.get_env().map(|e| e.to_string_lossy().into_owned());
    let mut compared = 0;
    for row in &rows {
        let setting = markdown::backticked(&row[0]).into_iter().find(|s| s.starts_with("MW_"));
        let cell = row.get(3).unwrap_or_else(|| panic!("docs/manager.md: no bridge column in {row:?}"));
        let spans = markdown::backticked(cell);
        let named: Vec<&str> =
            spans.iter().filter(|s| s.starts_with("--")).map(|s| s.split_whitespace().next().unwrap()).collect();
        let envs: Vec<&str> = spans.iter().copied().filter(|s| s.starts_with("MW_")).collect();
        for flag in &named {
            let arg =
                bridge.get(*flag).unwrap_or_else(|| panic!("docs/manager.md names bridge {flag}, which bridge lacks"));
            match env_of(arg) {
                Some(env) => {
                    assert!(envs.contains(&env.as_str()), "docs/manager.md: bridge {flag}'s variable is {env}")
                }
                None => {
                    assert!(envs.is_empty(), "docs/manager.md gives bridge {flag} a variable {envs:?}; it has none")
                }
            }
            compared += 1;
        }
        if let Some((flag, _)) = setting.and_then(|s| bridge.iter().find(|(_, arg)| env_of(arg).as_deref() == Some(s)))
        {
            assert!(named.contains(&flag.as_str()), "docs/manager.md: {setting:?} is also bridge {flag}'s; say so");
        }
    }
    assert!(compared >= 7, "{compared} bridge flags compared");
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

// ---- Metrics: names, types and label values from the registries themselves ----

/// A metric as a docs table row states it: name, type, and per label the values listed
/// (`None` when the cell names the label without a closed list of values).
#[derive(Debug)]
struct DocMetric {
    name: String,
    kind: String,
    labels: BTreeMap<String, Option<BTreeSet<String>>>,
}

/// The labels cell: `` `controller="managedworkload"`, `result` (`success`, `error`) ``. A
/// list with `…` is open: only its named values are checked.
fn doc_labels(cell: &str) -> BTreeMap<String, Option<BTreeSet<String>>> {
    let mut labels = BTreeMap::new();
    let mut rest = cell;
    while let Some(open) = rest.find('`') {
        let Some(len) = rest[open + 1..].find('`') else { break };
        let token = &rest[open + 1..open + 1 + len];
        rest = &rest[open + len + 2..];
        if let Some((name, value)) = token.split_once("=\"") {
            labels.insert(name.to_string(), Some(BTreeSet::from([value.trim_end_matches('"').to_string()])));
            continue;
        }
        let after = rest.trim_start();
        let values = after.strip_prefix('(').and_then(|inner| {
            let list = &inner[..inner.find(')')?];
            let named: BTreeSet<String> = markdown::backticked(list).into_iter().map(String::from).collect();
            (!named.is_empty() && !list.contains('…')).then_some(named)
        });
        if after.starts_with('(') {
            rest = &after[after.find(')').map_or(after.len(), |i| i + 1)..];
        }
        labels.insert(token.to_string(), values);
    }
    labels
}

/// The metrics table of a page: `| metric | type | labels | meaning |`.
fn doc_metrics(page: &str, marker: &str) -> Vec<DocMetric> {
    markdown::table(&read(page), marker, "| metric | type | labels |")
        .into_iter()
        .map(|row| DocMetric {
            name: markdown::backticked(&row[0]).first().unwrap_or_else(|| panic!("{page}: {row:?}")).to_string(),
            kind: row[1].clone(),
            labels: doc_labels(&row[2]),
        })
        .collect()
}

/// Every metric of `page`'s table is exported by `registry` under that name and type, with
/// those labels and exactly the label values listed, and every exported metric is in the table.
fn metrics_table_is_the_registry(page: &str, marker: &str, registry: &Registry) {
    let exported = exposition::families(registry);
    let documented = doc_metrics(page, marker);
    let names: BTreeSet<&str> = documented.iter().map(|m| m.name.as_str()).collect();
    let real: BTreeSet<&str> = exported.keys().map(String::as_str).collect();
    assert_eq!(names, real, "{page}'s metrics table against what the registry exports");
    for metric in &documented {
        let family = &exported[&metric.name];
        assert_eq!(metric.kind, family.kind, "{page}: the type of {}", metric.name);
        if !family.sampled {
            continue;
        }
        let labels: BTreeSet<&String> = metric.labels.keys().collect();
        assert_eq!(labels, family.labels.keys().collect(), "{page}: the labels of {}", metric.name);
        for (label, values) in &metric.labels {
            if let Some(values) = values {
                assert_eq!(values, &family.labels[label], "{page}: the values of {}'s {label}", metric.name);
            }
        }
    }
}

/// The operator's registry as it is once running: every family registered, and the series
/// that are set at start-up (not leading yet, no workloads counted yet) or on the first
/// reconcile.
fn operator_registry() -> Registry {
    let mut registry = Registry::default();
    let metrics = mw_operator::metrics::Metrics::register(&mut registry);
    metrics.set_leader(mw_operator::metrics::DEFAULT_LEASE, false);
    metrics.set_workloads(&Default::default());
    metrics.set_max_concurrent(1);
    metrics.reconcile_started().finish(true);
    registry
}

#[test]
fn operations_md_lists_every_metric_and_label_value_the_operator_exports() {
    metrics_table_is_the_registry("docs/operations.md", "## Metrics", &operator_registry());
}

fn bridge_registry() -> Registry {
    let mut registry = Registry::default();
    let metrics = mw_operator::bridge::metrics::Metrics::register(&mut registry);
    metrics.set_leader(mw_operator::bridge::DEFAULT_LEASE, false);
    registry
}

#[test]
fn bridge_md_lists_every_metric_and_label_value_the_bridge_exports() {
    metrics_table_is_the_registry("docs/bridge.md", "## Metrics and probes", &bridge_registry());
    // `reason` takes exactly the values of the row errors table.
    let reasons: BTreeSet<String> = markdown::table(&read("docs/bridge.md"), "## Row errors", "| reason |")
        .iter()
        .map(|row| markdown::backticked(&row[0])[0].to_string())
        .collect();
    let exported = &exposition::families(&bridge_registry())["mw_bridge_row_errors_total"].labels["reason"];
    assert_eq!(&reasons, exported, "docs/bridge.md's row errors table against the reasons the bridge counts");
}

// ---- Watches: what /readyz waits for and the architecture's watch table ----

#[test]
fn readyz_and_the_watch_table_name_every_watch() {
    let watched = mw_operator::metrics::WATCHED;
    // Each watch by its resource (`persistentvolumeclaims`), as the kind's plural is written.
    let named = |text: &str| -> Vec<&str> {
        let lower = text.to_lowercase();
        watched.iter().copied().filter(|w| lower.contains(w)).collect()
    };
    let table: Vec<String> =
        markdown::table(&read("docs/architecture.md"), "## Watches and what triggers a reconcile", "| watch |")
            .into_iter()
            .map(|row| row[0].clone())
            .collect();
    assert_eq!(named(&table.join(" ")), watched, "docs/architecture.md's watch table names every watch");
    assert_eq!(table.len(), watched.len(), "docs/architecture.md's watch table: one row per watch");
    let readyz = markdown::table(&read("docs/operations.md"), "## Probes", "| path |")
        .into_iter()
        .find(|row| row[0].contains("/readyz"))
        .expect("the /readyz row");
    assert_eq!(named(&readyz[1]), watched, "docs/operations.md's /readyz row names every watch");
}

// ---- Flags, defaults and environment variables from clap ----

fn cli() -> clap::Command {
    let mut cli = mw_operator::cli::Cli::command();
    // Propagates the global flags (--log-format) and --help into the subcommands.
    cli.build();
    cli
}

fn subcommand(name: &str) -> clap::Command {
    cli().find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {name}")).clone()
}

/// The long flags of a subcommand, without --help and --version.
fn flags(command: &clap::Command) -> BTreeMap<String, clap::Arg> {
    command
        .get_arguments()
        .filter(|a| !matches!(a.get_action(), clap::ArgAction::Help | clap::ArgAction::Version))
        .filter_map(|a| Some((format!("--{}", a.get_long()?), a.clone())))
        .collect()
}

/// The `--flags` of a command line written after `mw-operator <sub>`, until the line ends.
fn invocations(text: &str) -> Vec<(String, Vec<String>)> {
    let mut lines: Vec<String> = markdown::code_blocks(text).iter().flat_map(|b| b.lines().map(String::from)).collect();
    lines.extend(markdown::inline_code(text));
    let mut out = Vec::new();
    for line in lines {
        for (i, _) in line.match_indices("mw-operator ") {
            let mut words = line[i + "mw-operator ".len()..].split_whitespace();
            let Some(sub) = words.next().filter(|w| ["run", "check", "bridge", "crd"].contains(w)) else { continue };
            let used = words
                .take_while(|w| !["|", "&&", ";", "#"].contains(w))
                .map(|w| w.trim_start_matches('['))
                .filter(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().unwrap().trim_end_matches([',', ')', '`']).to_string())
                .collect();
            out.push((sub.to_string(), used));
        }
    }
    out
}

fn pages() -> Vec<String> {
    let mut pages: Vec<String> =
        ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"].iter().map(|s| s.to_string()).collect();
    let mut docs: Vec<String> =
        std::fs::read_dir("docs").unwrap().map(|e| e.unwrap().path().display().to_string()).collect();
    docs.sort();
    pages.extend(docs.into_iter().filter(|p| p.ends_with(".md")));
    pages
}

#[test]
fn every_mw_operator_command_line_in_the_docs_uses_real_flags() {
    let mut seen = 0;
    for page in pages() {
        for (sub, used) in invocations(&read(&page)) {
            let known = flags(&subcommand(&sub));
            for flag in used {
                let builtin = flag == "--help"; // clap's, on every subcommand
                assert!(
                    known.contains_key(&flag) || builtin,
                    "{page}: `mw-operator {sub} {flag}`: {sub} has no such flag"
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 10, "only {seen} flags found in the docs' command lines: is the parser broken?");
}

#[test]
fn operations_md_names_run_flags_that_all_have_an_environment_variable() {
    let run = flags(&subcommand("run"));
    let operations = read("docs/operations.md");
    let prose = operations.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(prose.contains("The flags below are `mw-operator run`'s; each has an environment variable"));
    for (flag, arg) in &run {
        assert!(arg.get_env().is_some(), "run {flag} has no environment variable, which docs/operations.md promises");
    }
    for span in markdown::inline_code(&operations) {
        let Some(flag) = span.split_whitespace().next().filter(|w| w.starts_with("--")) else { continue };
        assert!(run.contains_key(flag), "docs/operations.md names {flag}, which `run` does not take");
    }
}

#[test]
fn install_md_says_which_of_runs_flags_check_takes() {
    let install = read("docs/install.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let start = install.find("`mw-operator check` takes").expect("install.md says which flags check takes");
    let sentence = &install[start..start + install[start..].find(". ").expect("the sentence's end")];
    // "takes A, B and C …; it does not take D, E or F, …"
    let (takes, lacks) = sentence.split_once("not").expect("then what it does not take");
    let named = |part: &str| -> BTreeSet<String> {
        markdown::backticked(part).into_iter().filter(|s| s.starts_with("--")).map(String::from).collect()
    };
    let (run, check) = (flags(&subcommand("run")), flags(&subcommand("check")));
    let global: BTreeSet<String> = flags(&cli()).into_keys().collect();
    let shared: BTreeSet<String> =
        check.keys().filter(|f| run.contains_key(*f) && !global.contains(*f)).cloned().collect();
    let missing: BTreeSet<String> = run.keys().filter(|f| !check.contains_key(*f)).cloned().collect();
    assert_eq!(named(takes), shared, "docs/install.md: the flags check takes from run");
    assert_eq!(named(lacks), missing, "docs/install.md: run's flags check does not take");
}

/// The default column of a flags table as clap would say it.
fn stated_default(arg: &clap::Arg) -> Option<String> {
    if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        return Some("off".into());
    }
    if arg.is_required_set() {
        return Some("required".into());
    }
    let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    match defaults.as_slice() {
        [] => None,
        [d] if d.is_empty() => Some("empty".into()),
        [d] => Some(format!("`{d}`")),
        more => panic!("{:?} has several defaults {more:?}", arg.get_id()),
    }
}

#[test]
fn bridge_md_flags_table_is_the_bridge_command_line() {
    let bridge = flags(&subcommand("bridge"));
    let rows = markdown::table(&read("docs/bridge.md"), "## 4. Flags", "| flag | env | default |");
    let mut documented = BTreeSet::new();
    for row in &rows {
        let names: Vec<&str> = markdown::backticked(&row[0]);
        let envs: Vec<&str> = markdown::backticked(&row[1]);
        let defaults: Vec<&str> = row[2].split(" / ").collect();
        for (i, name) in names.iter().enumerate() {
            let flag = name.split_whitespace().next().unwrap().to_string();
            let arg = bridge.get(&flag).unwrap_or_else(|| panic!("docs/bridge.md lists {flag}, which bridge lacks"));
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(envs.get(i).map(|e| e.to_string()), env, "docs/bridge.md: the environment variable of {flag}");
            if let Some(default) = stated_default(arg) {
                assert_eq!(
                    defaults.get(i).map(|d| d.trim()),
                    Some(default.as_str()),
                    "docs/bridge.md: default of {flag}"
                );
            }
            documented.insert(flag);
        }
    }
    let all: BTreeSet<String> = bridge.into_keys().collect();
    assert_eq!(documented, all, "docs/bridge.md's flags table against `mw-operator bridge`'s flags");
}

// ---- RBAC: install.md's tables are the shipped roles ----

/// (API group, resource, resourceNames, verb) of every rule in a shipped Role.
fn granted(path: &str) -> BTreeSet<(String, String, String, String)> {
    let role = documents(path).remove(0);
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                .unwrap_or_default()
        };
        let names = strings("resourceNames").join(",");
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    out.insert((group.clone(), resource.clone(), names.clone(), verb));
                }
            }
        }
    }
    out
}

/// The same from a table of install.md: `| API group | resource | [names |] verbs | why |`.
fn documented_grants(marker: &str) -> BTreeSet<(String, String, String, String)> {
    let install = read("docs/install.md");
    let mut out = BTreeSet::new();
    for row in markdown::table(&install, marker, "| API group |") {
        // The core group, `""` in the table, is "" in a Role.
        let group = markdown::backticked(&row[0])[0].trim_matches('"').to_string();
        let resource = markdown::backticked(&row[1])[0].to_string();
        let (names, verbs) =
            if row.len() == 5 { (markdown::backticked(&row[2]).join(","), &row[3]) } else { (String::new(), &row[2]) };
        for verb in verbs.split(',') {
            out.insert((group.clone(), resource.clone(), names.clone(), verb.trim().to_string()));
        }
    }
    out
}

#[test]
fn install_md_rbac_tables_are_the_shipped_roles() {
    for (marker, role) in [
        ("### The operator", "config/rbac/role.yaml"),
        ("### Leader election", "config/rbac/leader-election-role.yaml"),
        ("### The bridge", "config/rbac/bridge-role.yaml"),
        ("### The bridge's leader election", "config/rbac/bridge-leader-election-role.yaml"),
    ] {
        assert_eq!(documented_grants(marker), granted(role), "docs/install.md \"{marker}\" against {role}");
    }
    // The cluster-wide forms grant the same.
    assert_eq!(granted("config/rbac/cluster-role.yaml"), granted("config/rbac/role.yaml"));
    assert_eq!(granted("config/rbac/bridge-cluster-role.yaml"), granted("config/rbac/bridge-role.yaml"));
}

// ---- Object names: what the chart renders ----

/// `helm template` of the chart for `release`, bridge and ServiceMonitors on: every (kind, name).
fn rendered_names(release: &str) -> BTreeSet<(String, String)> {
    let helm = std::env::var("MW_TEST_HELM")
        .expect("MW_TEST_HELM: the helm binary (make test sets it; `bash hack/helm.sh` prints or builds one)");
    let out = std::process::Command::new(&helm)
        .args(["template", release, "charts/mw-operator", "--namespace", "mw-system"])
        .args(["--set", "bridge.enabled=true", "--set", "bridge.nodes[0].node=k8s-lab-1"])
        .args(["--set", "bridge.nodes[0].namespace=workloads", "--set", "bridge.database.urlSecret.name=db"])
        .args(["--set", "metrics.serviceMonitor.enabled=true"])
        .output()
        .unwrap_or_else(|e| panic!("running {helm}: {e}"));
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter_map(|doc| Some((doc["kind"].as_str()?.to_string(), doc["metadata"]["name"].as_str()?.to_string())))
        .collect()
}

#[test]
fn object_names_in_the_docs_are_what_the_chart_renders() {
    // `<full name>` as the docs define it: the release's name when it contains mw-operator
    // (the README's `helm install mw-operator`), else `<release>-mw-operator`.
    let install = read("docs/install.md").split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(install.contains(
        "`<full name>` is the release name when that contains `mw-operator` (as in `helm install mw-operator`), \
         else the release name followed by `-mw-operator`"
    ));
    let releases = [("mw-operator", "mw-operator"), ("prod", "prod-mw-operator")];
    let renders: Vec<BTreeSet<String>> =
        releases.iter().map(|(release, _)| rendered_names(release).into_iter().map(|(_, n)| n).collect()).collect();
    for ((_, full), names) in releases.iter().zip(&renders) {
        assert!(names.contains(*full), "the operator's objects are named {full}: {names:?}");
    }
    let mut checked = 0;
    for page in pages() {
        for span in markdown::inline_code(&read(&page)) {
            for (placeholder, i) in [("<full name>", 1), ("<release>", 0)] {
                let Some(suffix) = span.strip_prefix(placeholder) else { continue };
                for ((release, full), names) in releases.iter().zip(&renders) {
                    let name = format!("{}{suffix}", [*release, *full][i]);
                    assert!(
                        names.contains(&name),
                        "{page}: `{span}` is {name} for release {release}, which the chart does not render: {names:?}"
                    );
                }
                checked += 1;
            }
        }
        // A name the README's release (mw-operator) gets, written out.
        for span in markdown::inline_code(&read(&page)) {
            if span.starts_with("mw-operator-") && !span.contains([' ', '/', '.', '<']) {
                assert!(
                    renders[0].contains(&span),
                    "{page}: `{span}` is not an object the chart renders for release mw-operator"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} chart object names found in the docs");
}

// ---- Links and anchors ----

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = Path::new(&page).parent().unwrap();
        for (line, target) in markdown::links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() { Path::new(&page).to_path_buf() } else { dir.join(file) };
            assert!(path.exists(), "{page}:{line} links to {target}: {} does not exist", path.display());
            if let Some(anchor) = anchor.filter(|_| path.extension().is_some_and(|e| e == "md")) {
                let anchors = markdown::anchors(&read(&path.display().to_string()));
                assert!(
                    anchors.contains(anchor),
                    "{page}:{line} links to {target}: {} has no heading with anchor #{anchor}; it has {anchors:?}",
                    path.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found: is the parser broken?");
}

#[test]
fn no_table_is_split_by_a_blank_line() {
    for page in pages() {
        let split = markdown::split_tables(&read(&page));
        assert!(split.is_empty(), "{page}: a blank line inside a table at line(s) {split:?} ends the table there");
    }
}

#[test]
fn the_docs_stand_alone() {
    for page in pages() {
        let lower = read(&page).to_lowercase();
        for phrase in ["design brief", "the brief", "the design", "design.md"] {
            assert!(!lower.contains(phrase), "{page} cites {phrase:?}, which is not in the repository");
        }
    }
}

#[test]
fn the_license_file_is_the_one_cargo_toml_names() {
    let manifest = read("Cargo.toml");
    let license = manifest.lines().find_map(|l| l.strip_prefix("license = ")).expect("Cargo.toml names a license");
    assert_eq!(license, "\"MIT\"", "the test below checks for the MIT license text");
    let license = read("LICENSE");
    assert!(license.starts_with("MIT License\n"), "LICENSE is not the MIT license");
    assert!(license.contains("Permission is hereby granted, free of charge"));
}

#[test]
fn the_providers_licence_is_the_projects() {
    let manifest = read("Cargo.toml");
    let crate_licence = manifest
        .lines()
        .find_map(|l| l.strip_prefix("license = "))
        .map(|l| l.trim_matches('"').to_string())
        .expect("Cargo.toml names a license");
    for path in ["integrations/manager/package.json", "integrations/manager/package-lock.json"] {
        let package: Value = serde_json::from_str(&read(path)).unwrap();
        // package-lock.json keeps the root package's licence under packages[""].
        let licence = package.get("license").or_else(|| package["packages"][""].get("license"));
        assert_eq!(
            licence.and_then(Value::as_str),
            Some(crate_licence.as_str()),
            "{path}'s licence against Cargo.toml's"
        );
    }
}

// ---- The chart's PrometheusRule: the alerts docs/operations.md and docs/bridge.md document ----

/// `helm template` of the chart as release `mw-operator` in `mw-system`, with `--set` values.
fn helm_template(sets: &[&str]) -> Vec<Value> {
    let helm = std::env::var("MW_TEST_HELM")
        .expect("MW_TEST_HELM: the helm binary (make test sets it; `bash hack/helm.sh` prints or builds one)");
    let mut command = std::process::Command::new(&helm);
    command.args(["template", "mw-operator", "charts/mw-operator", "--namespace", "mw-system"]);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command.output().unwrap_or_else(|e| panic!("running {helm}: {e}"));
    assert!(out.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

/// Every alert of the rendered PrometheusRule: (name, `for`).
fn rendered_alerts(sets: &[&str]) -> BTreeSet<(String, String)> {
    let docs = helm_template(&[&["prometheusRule.enabled=true"], sets].concat());
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").expect("a PrometheusRule");
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .map(|r| (r["alert"].as_str().unwrap().to_string(), r["for"].as_str().unwrap_or("").to_string()))
        .collect()
}

/// The alerts of docs/operations.md: its YAML blocks' `- alert:` entries.
fn operations_alerts() -> BTreeSet<(String, String)> {
    markdown::code_blocks(&read("docs/operations.md"))
        .iter()
        .filter_map(|block| serde_saphyr::from_str::<Value>(block).ok())
        .filter_map(|doc| doc.as_array().cloned())
        .flatten()
        .filter(|rule| rule["alert"].is_string())
        .map(|rule| (rule["alert"].as_str().unwrap().to_string(), rule["for"].as_str().unwrap_or("").to_string()))
        .collect()
}

/// docs/bridge.md's alerts table: `| alert | expression | for | … |`.
fn bridge_alert_rows() -> Vec<Vec<String>> {
    markdown::table(&read("docs/bridge.md"), "### Alerts", "| alert | expression | for |")
}

#[test]
fn the_prometheus_rule_holds_the_alerts_the_docs_document() {
    let operations = operations_alerts();
    assert!(operations.len() >= 5, "docs/operations.md's alerts: {operations:?}");
    let bridge: BTreeSet<(String, String)> = bridge_alert_rows()
        .iter()
        .map(|row| (markdown::backticked(&row[0])[0].to_string(), markdown::backticked(&row[2])[0].to_string()))
        .collect();
    assert!(!bridge.is_empty(), "docs/bridge.md documents the bridge's alerts");
    assert_eq!(rendered_alerts(&[]), operations, "the chart's alerts without the bridge are docs/operations.md's");
    let with_bridge = rendered_alerts(&[
        "bridge.enabled=true",
        "bridge.nodes[0].node=k8s-lab-1",
        "bridge.nodes[0].namespace=workloads",
        "bridge.database.urlSecret.name=db",
    ]);
    let documented: BTreeSet<_> = operations.union(&bridge).cloned().collect();
    assert_eq!(
        with_bridge, documented,
        "the chart's alerts with the bridge are docs/operations.md's and docs/bridge.md's"
    );
}

#[test]
fn bridge_md_alerts_read_what_the_bridge_exports() {
    let exported = exposition::families(&bridge_registry());
    for row in bridge_alert_rows() {
        let expr = markdown::backticked(&row[1])[0];
        let mut read = 0;
        // Each series it reads (a name followed by its selector, or any `mw_` name) and each
        // `label="value"` of a selector.
        let mut rest = expr;
        while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
            let len =
                rest[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len() - start);
            let (name, after) = (&rest[start..start + len], &rest[start + len..]);
            rest = after;
            if !(after.starts_with('{') || name.starts_with("mw_")) {
                continue; // a function, a keyword or a label name
            }
            let family = exported
                .get(name)
                .unwrap_or_else(|| panic!("docs/bridge.md: {expr} reads {name}, which the bridge does not export"));
            read += 1;
            if let Some(selector) = after.strip_prefix('{') {
                let selector = &selector[..selector.find('}').unwrap()];
                for matcher in selector.split(',').map(str::trim) {
                    let (label, value) = matcher.split_once("=\"").unwrap();
                    let values = family.labels.get(label).unwrap_or_else(|| panic!("{name} has no label {label}"));
                    assert!(values.contains(value.trim_end_matches('"')), "{name} never has {matcher}: {values:?}");
                }
                rest = &after[selector.len() + 2..];
            }
        }
        assert!(read > 0, "docs/bridge.md: {expr} reads no series the bridge exports");
    }
}

// ---- CONTRIBUTING.md's layout: every module and test file ----

/// A module's or test's name as the layout table writes it: `reconcile`, `bridge_db`.
fn is_module_name(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The `.rs` files directly in `dir`, by name.
fn rust_files(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn contributing_md_lists_every_module_and_test_file() {
    let rows = markdown::table(&read("CONTRIBUTING.md"), "## Layout", "| path |");
    // Listed: each `src/…` path, and for a directory each module its row names.
    let (mut listed, mut tests_listed) = (BTreeSet::new(), BTreeSet::new());
    for row in &rows {
        let paths = markdown::backticked(&row[0]);
        for path in paths.iter().filter(|p| p.starts_with("src/")) {
            listed.insert(path.to_string());
            if path.ends_with('/') {
                let names = markdown::backticked(&row[1]).into_iter().filter(|w| is_module_name(w));
                listed.extend(names.map(|name| format!("{path}{name}.rs")));
            }
        }
        if paths.contains(&"tests/") {
            let names = markdown::backticked(&row[1]).into_iter().filter(|w| is_module_name(w));
            tests_listed.extend(names.map(|name| format!("tests/{name}.rs")));
        }
    }
    // The modules: each src/*.rs, and each file of a directory under src/ (its mod.rs is the
    // directory itself); files deeper down are parts of the module beside their directory.
    let mut modules: BTreeSet<String> = rust_files("src").into_iter().map(|f| format!("src/{f}")).collect();
    for entry in std::fs::read_dir("src").unwrap() {
        let dir = entry.unwrap().path();
        if dir.is_dir() {
            let dir = format!("{}/", dir.display());
            for file in rust_files(&dir) {
                modules.insert(if file == "mod.rs" { dir.clone() } else { format!("{dir}{file}") });
            }
        }
    }
    assert!(modules.contains("src/write.rs") && modules.contains("src/operator/"), "{modules:?}");
    assert_eq!(listed, modules, "CONTRIBUTING.md's layout against the modules under src/");
    let tests: BTreeSet<String> = rust_files("tests").into_iter().map(|f| format!("tests/{f}")).collect();
    assert_eq!(tests_listed, tests, "CONTRIBUTING.md's layout against the test files in tests/");
}

// ---- The README ----

/// A node of the chart's values schema as written (`{"allOf": [{"$ref": "#/definitions/x"}]}`)
/// to the node it stands for.
fn resolve<'a>(schema: &'a Value, mut node: &'a Value) -> &'a Value {
    loop {
        if let Some(name) = node["$ref"].as_str().and_then(|r| r.strip_prefix("#/definitions/")) {
            node = &schema["definitions"][name];
        } else if node["properties"].is_null() && node["items"].is_null() && node["allOf"].is_array() {
            node = &node["allOf"][0];
        } else {
            return node;
        }
    }
}

#[test]
fn the_readme_takes_a_newcomer_from_prerequisites_to_a_verified_install() {
    let readme = read("README.md");
    // What it is and what stock Manager does with it, then a quick start on a real cluster,
    // the local demo, and the details: each needle found after the one before it.
    let order = [
        "Manager v2026.7.4",
        "## Quick start on a real cluster",
        "make image",
        "skopeo copy oci-archive:target/image/mw-operator.oci.tar",
        "kubectl apply --server-side -f crds/",
        "helm install",
        "mw-operator check",
        "config/samples/nginx.yaml",
        "## Try it locally",
        "make demo",
        "make test",
        "## Prerequisites",
        "## Install",
        "No image is published",
        "## Verify",
        "mw-operator check",
        "## Using it from Manager",
    ];
    let mut at = 0;
    for (i, needle) in order.iter().enumerate() {
        let found = readme[at..].find(needle).unwrap_or_else(|| {
            panic!("README.md: no {needle:?} after {:?}", order[..i].last().copied().unwrap_or("the start"))
        });
        at += found + needle.len();
    }
    // The archive the quick start pushes is the one `make image` writes.
    assert!(read("Makefile").contains("--out target/image/mw-operator.oci.tar"), "Makefile's image archive");
    // Every `--set` of its command lines is a value the chart's schema knows.
    let schema: Value = serde_json::from_str(&read("charts/mw-operator/values.schema.json")).unwrap();
    let mut sets = 0;
    for block in markdown::code_blocks(&readme) {
        for (i, _) in block.match_indices("--set ") {
            let value = block[i + "--set ".len()..].split_whitespace().next().unwrap().trim_matches('\'');
            let key = value.split_once('=').map_or(value, |(k, _)| k);
            let mut node = &schema;
            for part in key.split('.') {
                let (name, indexed) = part.split_once('[').map_or((part, false), |(n, _)| (n, true));
                node = &resolve(&schema, node)["properties"][name];
                if indexed {
                    node = &resolve(&schema, node)["items"];
                }
                assert!(node.is_object(), "README.md: --set {value}: the chart has no value {key}");
            }
            sets += 1;
        }
    }
    assert!(sets >= 5, "only {sets} --set found in README.md");
    // The demo output shows the columns `kubectl get mw -o wide` prints.
    let crd = documents("crds/managedworkloads.opensource-server.mieweb.org.yaml").remove(0);
    let columns: Vec<String> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_uppercase())
        .collect();
    let header = format!("NAME {}", columns.join(" "));
    let output = block_after(&readme, "`make demo` prints");
    let shown = output.lines().find(|l| l.starts_with("NAME")).expect("a kubectl get header");
    assert_eq!(shown.split_whitespace().collect::<Vec<_>>().join(" "), header, "README.md's demo output header");
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

// ---- Supported Kubernetes versions ----

/// The first `1.N` in `text`, as N.
fn first_minor(text: &str) -> Option<u32> {
    let at = text.find("1.")?;
    let digits: String = text[at + 2..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[test]
fn the_minimum_kubernetes_is_the_same_in_the_chart_the_docs_and_make_test_compat() {
    let minimum = versions::minimum_kubernetes();
    let readme = read("README.md");
    assert!(readme.contains(&format!("| Kubernetes | **{minimum} or later**")), "README.md's prerequisites");
    assert!(read("docs/install.md").contains(&format!("A Kubernetes cluster, {minimum} or later")), "install.md");
    // `make test-compat` builds and runs that minor version.
    let module = read("hack/controlplane-compat/go.mod");
    assert!(module.contains(&format!("\tk8s.io/kubernetes v{minimum}.")), "hack/controlplane-compat/go.mod");
    let script = read("hack/controlplane.sh");
    let compat = &script[script.find("    compat)").expect("the compat line in hack/controlplane.sh")..];
    assert!(compat.contains(&format!("K8S_VERSION=v{minimum}.")), "hack/controlplane.sh's compat line");
}

/// Every function the CRD's CEL rules call, by name (string literals left out).
fn cel_functions(schema: &Value, out: &mut BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            for rule in map.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
                let text: String = rule["rule"].as_str().unwrap().split('\'').step_by(2).collect();
                let mut name = String::new();
                for c in text.chars() {
                    match c {
                        c if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                        '(' if !name.is_empty() => {
                            out.insert(std::mem::take(&mut name));
                        }
                        _ => name.clear(),
                    }
                }
            }
            map.values().for_each(|v| cel_functions(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| cel_functions(v, out)),
        _ => {}
    }
}

#[test]
fn install_md_dates_every_cel_library_function_the_crd_calls_and_the_newest_sets_the_minimum() {
    let crd = documents("crds/managedworkloads.opensource-server.mieweb.org.yaml").remove(0);
    let mut called = BTreeSet::new();
    cel_functions(&crd, &mut called);
    // CEL's own macros and functions: in every API server that runs CRD rules at all (1.25+).
    let standard = ["all", "exists", "exists_one", "has", "int", "matches", "size", "startsWith", "string", "type"];
    let library: Vec<&String> = called.iter().filter(|f| !standard.contains(&f.as_str())).collect();
    assert!(library.iter().any(|f| *f == "isCIDR"), "the parser finds the library calls: {called:?}");
    let rows =
        markdown::table(&read("docs/install.md"), "## Supported Kubernetes versions", "| what the operator uses");
    let mut newest = 0;
    for function in library {
        let row = rows
            .iter()
            .find(|r| markdown::backticked(&r[0]).iter().any(|s| s.trim_end_matches("(…)") == function))
            .unwrap_or_else(|| {
                panic!("docs/install.md's version table does not name `{function}`, which the CRD calls")
            });
        newest = newest.max(first_minor(&row[1]).unwrap_or_else(|| panic!("no version in {row:?}")));
    }
    assert_eq!(
        format!("1.{newest}"),
        versions::minimum_kubernetes(),
        "the newest CEL library the CRD calls sets the minimum"
    );
}
