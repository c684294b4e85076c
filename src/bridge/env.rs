//! The effective environment of a Manager container, built as Manager's `buildLxcEnvConfig`
//! does: `Settings.default_container_env_vars` < NVIDIA defaults < the row's own
//! `environmentVars`, later wins. Values are normalised as Manager does. Where Manager
//! silently drops a malformed row value (an invalid key, `environmentVars` not a JSON object),
//! the bridge reports the row instead, so an administrator sees it.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::RowError;

/// Variables Manager adds when `nvidiaRequested` is set, except `NVIDIA_VISIBLE_DEVICES=all`:
/// on Kubernetes the device plugin sets it to the GPU it allocated, and `all` would override
/// that and, where the NVIDIA runtime reads it, show the container every GPU of the node.
pub const NVIDIA_DEFAULTS: [(&str, &str); 1] = [("NVIDIA_DRIVER_CAPABILITIES", "utility compute")];
/// Left to the device plugin for rows with a GPU (see `NVIDIA_DEFAULTS`).
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The system-wide defaults from `Settings.default_container_env_vars`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultEnv {
    pub vars: BTreeMap<String, String>,
    /// Keys Manager would skip (not a valid variable name); reported once per change.
    pub skipped_keys: Vec<String>,
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, Manager's `normalizeEnvVars` rule.
pub fn valid_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A value as Manager keeps it, or `None` when Manager skips it.
fn normalise(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => return None,
    };
    (!text.contains('\0')).then_some(text)
}

/// Parse the setting: a JSON array of `{key, value, description}` or a plain `{KEY: value}`
/// object. Invalid keys are skipped and listed, as Manager skips them. An unparsable setting
/// is an error: the caller keeps the last good defaults instead of rolling every workload out
/// without them.
pub fn parse_defaults(setting: &str) -> Result<DefaultEnv, String> {
    let parsed: Value = serde_json::from_str(setting).map_err(|e| format!("not JSON: {e}"))?;
    let pairs: Vec<(String, &Value)> = match &parsed {
        Value::Array(items) => items
            .iter()
            .filter_map(|item| Some((item.get("key")?.as_str()?.trim().to_string(), item.get("value")?)))
            .collect(),
        Value::Object(map) => map.iter().map(|(k, v)| (k.trim().to_string(), v)).collect(),
        _ => return Err("neither a JSON array of {key, value} nor a JSON object".into()),
    };
    let mut defaults = DefaultEnv::default();
    for (key, value) in pairs {
        if !valid_key(&key) {
            defaults.skipped_keys.push(key);
        } else if let Some(value) = normalise(value) {
            defaults.vars.insert(key, value);
        }
    }
    Ok(defaults)
}

/// The effective environment of one row.
pub fn effective(defaults: &DefaultEnv, nvidia: bool, own: Option<&str>) -> Result<BTreeMap<String, String>, RowError> {
    let mut env = defaults.vars.clone();
    if nvidia {
        // Manager's NVIDIA defaults replace a system-wide value; here the device plugin's does.
        env.remove(NVIDIA_VISIBLE_DEVICES);
        env.extend(NVIDIA_DEFAULTS.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    }
    let own = own.map(str::trim).filter(|s| !s.is_empty());
    if let Some(own) = own {
        let parsed: Value = serde_json::from_str(own).map_err(|e| RowError::EnvNotJson(e.to_string()))?;
        let Value::Object(map) = parsed else {
            return Err(RowError::EnvNotJson("a JSON value that is not an object".into()));
        };
        for (key, value) in &map {
            let key = key.trim();
            if !valid_key(key) {
                return Err(RowError::EnvKey(key.to_string()));
            }
            if let Some(value) = normalise(value) {
                env.insert(key.to_string(), value);
            }
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDED: &str = r#"[
        {"key":"WAZUH_MANAGER","value":"wazuh.example.org","description":"Wazuh manager"},
        {"key":"WAZUH_REGISTRATION_PASSWORD","value":"","description":"secret"},
        {"key":"SSSD_LDAP_URI","value":"ldaps://ldap.example.org","description":""},
        {"key":"bad key","value":"x","description":"skipped as Manager skips it"},
        {"key":"N","value":3},
        {"key":"GONE","value":null}
    ]"#;

    #[test]
    fn settings_array_and_object_forms() {
        let d = parse_defaults(SEEDED).unwrap();
        assert_eq!(d.vars.get("WAZUH_MANAGER").map(String::as_str), Some("wazuh.example.org"));
        assert_eq!(d.vars.get("WAZUH_REGISTRATION_PASSWORD").map(String::as_str), Some(""));
        assert_eq!(d.vars.get("N").map(String::as_str), Some("3"));
        assert!(!d.vars.contains_key("GONE"));
        assert_eq!(d.skipped_keys, vec!["bad key".to_string()]);
        let o = parse_defaults(r#"{"A":"1","B":true}"#).unwrap();
        assert_eq!(o.vars.get("B").map(String::as_str), Some("true"));
        assert!(parse_defaults("nope").is_err());
        assert!(parse_defaults("42").is_err());
    }

    #[test]
    fn later_sources_win() {
        let d = parse_defaults(r#"{"TZ":"UTC","NVIDIA_VISIBLE_DEVICES":"none","KEEP":"1"}"#).unwrap();
        let env = effective(&d, true, Some(r#"{"TZ":"America/Chicago","EDITOR":"vim"}"#)).unwrap();
        assert_eq!(env["TZ"], "America/Chicago");
        assert!(!env.contains_key("NVIDIA_VISIBLE_DEVICES"), "the device plugin sets it");
        assert_eq!(env["NVIDIA_DRIVER_CAPABILITIES"], "utility compute");
        assert_eq!(env["KEEP"], "1");
        // The row's own value still wins, as in Manager.
        let own = effective(&d, true, Some(r#"{"NVIDIA_VISIBLE_DEVICES":"0"}"#)).unwrap();
        assert_eq!(own["NVIDIA_VISIBLE_DEVICES"], "0");
        assert_eq!(env["EDITOR"], "vim");
        let without = effective(&d, false, None).unwrap();
        assert_eq!(without["NVIDIA_VISIBLE_DEVICES"], "none");
    }

    #[test]
    fn bad_row_env_is_a_row_error() {
        let d = DefaultEnv::default();
        assert!(matches!(effective(&d, false, Some("{not json")), Err(RowError::EnvNotJson(_))));
        assert!(matches!(effective(&d, false, Some("[1,2]")), Err(RowError::EnvNotJson(_))));
        assert!(matches!(effective(&d, false, Some(r#"{"1ABC":"x"}"#)), Err(RowError::EnvKey(k)) if k == "1ABC"));
        assert!(matches!(effective(&d, false, Some(r#"{"A-B":"x"}"#)), Err(RowError::EnvKey(_))));
        // Skipped as Manager skips them, not errors.
        let env = effective(&d, false, Some(r#"{"A":null,"B":{"x":1},"C":"nul\u0000","D":1.5}"#)).unwrap();
        assert_eq!(env.into_iter().collect::<Vec<_>>(), vec![("D".to_string(), "1.5".to_string())]);
        assert!(effective(&d, false, Some("  ")).unwrap().is_empty());
    }
}
