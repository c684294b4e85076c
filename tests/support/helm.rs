//! The helm binary `make test` builds (MW_TEST_HELM), run to completion.

use std::process::Command;

/// `helm ARGS…`: (exit success, stdout, stderr).
pub fn run_helm<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> (bool, String, String) {
    let helm = std::env::var("MW_TEST_HELM").expect("MW_TEST_HELM: the helm binary (make test sets it)");
    let out = Command::new(&helm).args(args).output().unwrap_or_else(|e| panic!("running {helm}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `helm ARGS…`, which must succeed: its stdout.
pub fn helm<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let (ok, stdout, stderr) = run_helm(args);
    assert!(ok, "helm {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}
