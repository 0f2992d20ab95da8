//! Config patches and redaction, as pure functions over `serde_json::Value`.
//!
//! A patch is a partial config in the config's own nested shape (`{"replication":
//! {"max_lag_ms": 500}}`), merged over the effective config like a JSON merge patch (objects
//! merge key by key, anything else replaces), then deserialized with the config's own
//! `deny_unknown_fields` structs and checked with `Config::validate`. [`changed_keys`] lists the
//! `section.key` settings whose value differs; only [`LIVE_KEYS`] may change without a restart.
//!
//! Secrets are replaced by [`REDACTED`] on the way out, and a patch that sends [`REDACTED`]
//! back (a client that PATCHes what it GOT) leaves the secret as it is.

use serde_json::{Map, Value};

/// Settings that change at run time (see `config::Runtime` and `Admin::patch_config`).
/// `origin.query_timeout_ms` bounds each fill query from the next fill on; the pool's wait for
/// a free connection keeps the start-up value (deadpool fixes it at build time).
pub const LIVE_KEYS: &[&str] = &[
    "log.level",
    "replication.max_lag_ms",
    "origin.fill_batch",
    "origin.query_timeout_ms",
    "origin.fill_delay_ms",
    "origin.pool_size",
    "catalog.prefixes",
    "catalog.disabled",
];

/// Why some settings cannot change live, for the `RestartRequired` detail.
pub fn restart_hint(key: &str) -> &'static str {
    match key {
        "catalog.tables" => "use POST/DELETE /v1/tables to change the cached tables at run time",
        k if k.starts_with("resp.") => "the dataplane cores read it once at start-up",
        k if k.starts_with("store.") => "the store's memory region is sized at start-up",
        k if k.starts_with("replication.") => "the WAL consumer reads it once at start-up",
        "origin.url" | "origin.connect_timeout_ms" => {
            "origin connections are configured at start-up"
        }
        "log.json" => "the log format is chosen at start-up",
        _ => "it is read once at start-up",
    }
}

/// What secrets read as in every output.
pub use crate::config::{redact_conn_string, REDACTED};

/// Merges `patch` over `base` (JSON merge patch, except that `null` is refused and a
/// [`REDACTED`] string keeps the base value). Errors name the offending path.
pub fn merge(base: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let (Value::Object(b), Value::Object(p)) = (base, patch) else {
        let what = if path.is_empty() {
            "a config patch"
        } else {
            path
        };
        return Err(format!("{what} must be a JSON object"));
    };
    for (k, v) in p {
        let sub = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match b.get_mut(k) {
            Some(slot) if slot.is_object() && v.is_object() => merge(slot, v, &sub)?,
            _ if v.is_null() => return Err(format!("{sub}: null is not a value")),
            Some(slot) if is_redacted_echo(slot, v) => {}
            _ => {
                b.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

/// Whether `patch` is what [`redact`] made of `base` (a client sending back what it read).
fn is_redacted_echo(base: &Value, patch: &Value) -> bool {
    match (base.as_str(), patch.as_str()) {
        (_, Some(REDACTED)) => true,
        (Some(b), Some(p)) => b != p && redact_conn_string(b) == p,
        _ => false,
    }
}

/// `section.key` of every setting whose value differs between two serialized configs.
pub fn changed_keys(old: &Value, new: &Value) -> Vec<String> {
    let empty = Map::new();
    let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
    let (old, new) = (obj(old), obj(new));
    let mut out = Vec::new();
    let mut sections: Vec<&String> = old.keys().chain(new.keys()).collect();
    sections.sort();
    sections.dedup();
    for section in sections {
        let o = old
            .get(section)
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let n = new
            .get(section)
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            if o.get(key) != n.get(key) {
                out.push(format!("{section}.{key}"));
            }
        }
    }
    out
}

/// Replaces secrets in a serialized config: non-empty `password`/`token` strings anywhere, and
/// the password inside a connection string (`password=...` or `postgres://user:pw@`).
pub fn redact(v: &mut Value) {
    let Value::Object(map) = v else {
        return;
    };
    for (k, v) in map.iter_mut() {
        match v {
            Value::Object(_) => redact(v),
            Value::String(s) if (k == "password" || k == "token") && !s.is_empty() => {
                *s = REDACTED.into();
            }
            Value::String(s) if k == "url" => *s = redact_conn_string(s),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_is_nested_and_refuses_null() {
        let mut base = json!({"a": {"x": 1, "y": 2}, "b": {"z": "s"}});
        merge(&mut base, &json!({"a": {"x": 5}}), "").unwrap();
        assert_eq!(base, json!({"a": {"x": 5, "y": 2}, "b": {"z": "s"}}));
        let err = merge(&mut base, &json!({"a": {"x": null}}), "").unwrap_err();
        assert!(err.contains("a.x"), "{err}");
        assert!(merge(&mut base, &json!([1]), "").is_err());
        merge(&mut base, &json!({"b": {"z": REDACTED}}), "").unwrap();
        assert_eq!(base["b"]["z"], "s");
        let mut base = json!({"o": {"url": "host=h password=pw"}});
        merge(&mut base, &json!({"o": {"url": "host=h password=***"}}), "").unwrap();
        assert_eq!(
            base["o"]["url"], "host=h password=pw",
            "a redacted echo keeps the secret"
        );
        merge(&mut base, &json!({"o": {"url": "host=h2"}}), "").unwrap();
        assert_eq!(base["o"]["url"], "host=h2");
        // Unknown keys are added here and refused later by the config's deny_unknown_fields.
        merge(&mut base, &json!({"a": {"new": 1}}), "").unwrap();
        assert_eq!(base["a"]["new"], 1);
    }

    #[test]
    fn changed_keys_are_section_dot_key() {
        let old = json!({"a": {"x": 1, "m": {"k": 1}}, "b": {"z": 1}});
        let new = json!({"a": {"x": 2, "m": {"k": 2}}, "b": {"z": 1}, "c": {"n": 1}});
        assert_eq!(changed_keys(&old, &new), vec!["a.m", "a.x", "c.n"]);
        assert!(changed_keys(&old, &old).is_empty());
    }

    #[test]
    fn secrets_are_redacted() {
        let mut v = json!({
            "origin": {"url": "host=h password='a b\\'c' user=u"},
            "resp": {"password": "pw", "listen": "x"},
            "api": {"token": "t", "other": "o"},
            "empty": {"password": ""}
        });
        redact(&mut v);
        assert_eq!(v["origin"]["url"], "host=h password=*** user=u");
        assert_eq!(v["resp"]["password"], REDACTED);
        assert_eq!(v["resp"]["listen"], "x");
        assert_eq!(v["api"]["token"], REDACTED);
        assert_eq!(v["api"]["other"], "o");
        assert_eq!(v["empty"]["password"], "");
        assert_eq!(
            redact_conn_string("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_conn_string("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_conn_string("host=127.0.0.1 port=5432"),
            "host=127.0.0.1 port=5432"
        );
    }
}
