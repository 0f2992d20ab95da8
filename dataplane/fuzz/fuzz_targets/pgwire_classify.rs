//! Fuzzes the statement classifier (`pgwire::classify`), which sees every distinct statement
//! text a client sends. Beyond "never panics" (sqlparser included) the target checks:
//! - classification is deterministic (the same text twice gives the same answer);
//! - a point lookup names a catalog table and gives one key value per key column;
//! - a cacheable query reads only catalog tables, sorted and without duplicates, and its
//!   literal `i` is placeholder `$(client_params + i + 1)` of the normalized text.
//!
//! Inputs that are not UTF-8 are skipped (the engine refuses them before classifying).
//! Run with `cargo +nightly fuzz run pgwire_classify` from `dataplane/`, or `fuzz/run.sh`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgline_dataplane::pgwire::classify::{classify, Catalog, Classification};

/// Three cached tables: `users (id)`, `orders (id)`, `public.items (shop, sku)`.
struct Tables {
    id: Vec<String>,
    composite: Vec<String>,
}

impl Catalog for Tables {
    fn primary_key(&self, schema: Option<&str>, table: &str) -> Option<&[String]> {
        match (schema.unwrap_or("public"), table) {
            ("public", "users" | "orders") => Some(&self.id),
            ("public", "items") => Some(&self.composite),
            _ => None,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let catalog = Tables {
        id: vec!["id".into()],
        composite: vec!["shop".into(), "sku".into()],
    };
    let c = classify(sql, &catalog);
    assert_eq!(classify(sql, &catalog), c, "not deterministic");
    match c {
        Classification::PointLookup(p) => {
            let key = catalog
                .primary_key(p.table.schema.as_deref(), &p.table.name)
                .expect("a point lookup on an unknown table");
            assert_eq!(p.key.len(), key.len());
        }
        Classification::Cacheable(q) => {
            assert!(!q.tables.is_empty());
            assert!(q.tables.windows(2).all(|w| w[0] < w[1]));
            for t in &q.tables {
                assert!(catalog.primary_key(t.schema.as_deref(), &t.name).is_some());
            }
            if !q.literals.is_empty() {
                let last = format!("${}", q.client_params + q.literals.len());
                assert!(q.normalized.contains(&last), "{} lacks {last}", q.normalized);
            }
        }
        Classification::PassThrough(_) => {}
    }
});
