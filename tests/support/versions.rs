//! The oldest Kubernetes the project supports, as the chart states it (a `#[path]` module of
//! tests/docs.rs and tests/chart.rs: no cluster needed).

/// The oldest Kubernetes minor version supported, `1.N`, from the chart's `kubeVersion:
/// ">=1.N.0-0"` (the one place a tool enforces it: helm refuses an older cluster).
pub fn minimum_kubernetes() -> String {
    let path = "charts/mw-operator/Chart.yaml";
    let chart = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let constraint = chart.lines().find_map(|l| l.strip_prefix("kubeVersion: ")).expect("Chart.yaml sets kubeVersion");
    let minimum = constraint.strip_prefix("\">=").and_then(|v| v.strip_suffix(".0-0\""));
    minimum.unwrap_or_else(|| panic!("kubeVersion {constraint} is not \">=1.N.0-0\"")).to_string()
}
