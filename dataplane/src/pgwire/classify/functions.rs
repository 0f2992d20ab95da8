//! The read-only/deterministic check: a sqlparser visitor that walks the whole query
//! (subqueries and CTEs included), refuses locking, SELECT INTO, data-modifying CTEs and
//! volatile or unknown functions, and collects relation names, CTE names and the highest
//! client parameter number.

use super::PassReason;
use sqlparser::ast::{
    ArrayElemTypeDef, BinaryOperator, DataType, Expr, ObjectName, ObjectNamePart, Query, Select,
    SetExpr, TableFactor, Value, Visitor,
};
use std::ops::ControlFlow;

/// Functions known to be volatile, or whose value depends on the session or the moment.
const VOLATILE: &[&str] = &[
    "now",
    "current_timestamp",
    "current_time",
    "current_date",
    "localtime",
    "localtimestamp",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "random",
    "random_normal",
    "setseed",
    "nextval",
    "currval",
    "lastval",
    "setval",
    "txid_current",
    "txid_current_if_assigned",
    "pg_current_xact_id",
    "pg_current_xact_id_if_assigned",
    "gen_random_uuid",
    "uuid_generate_v1",
    "uuid_generate_v4",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    "pg_backend_pid",
    "current_user",
    "session_user",
    "user",
    "current_role",
    "current_schema",
    "current_schemas",
    "current_setting",
    "set_config",
    "inet_client_addr",
    "inet_client_port",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_try_advisory_lock",
    "pg_notify",
    "dblink",
    "lo_import",
    "pg_read_file",
    "txid_current_snapshot",
    "pg_current_snapshot",
    "pg_current_wal_lsn",
    "pg_postmaster_start_time",
];

/// Immutable functions, aggregates and window functions whose result depends only on their
/// arguments (and, for a few stable ones, on session settings: see the module limitations).
const DETERMINISTIC: &[&str] = &[
    // aggregates
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "string_agg",
    "array_agg",
    "json_agg",
    "jsonb_agg",
    "json_object_agg",
    "jsonb_object_agg",
    "bool_and",
    "bool_or",
    "every",
    "bit_and",
    "bit_or",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "percentile_cont",
    "percentile_disc",
    "mode",
    "corr",
    "covar_pop",
    "covar_samp",
    // window functions
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    // conditional and comparison
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "num_nonnulls",
    "num_nulls",
    // math
    "abs",
    "ceil",
    "ceiling",
    "floor",
    "round",
    "trunc",
    "mod",
    "power",
    "pow",
    "sqrt",
    "cbrt",
    "exp",
    "ln",
    "log",
    "log10",
    "sign",
    "div",
    "gcd",
    "lcm",
    "width_bucket",
    "pi",
    "degrees",
    "radians",
    // strings
    "lower",
    "upper",
    "initcap",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "bit_length",
    "concat",
    "concat_ws",
    "substring",
    "substr",
    "left",
    "right",
    "lpad",
    "rpad",
    "trim",
    "btrim",
    "ltrim",
    "rtrim",
    "replace",
    "split_part",
    "strpos",
    "position",
    "reverse",
    "repeat",
    "md5",
    "sha256",
    "starts_with",
    "regexp_replace",
    "regexp_match",
    "regexp_matches",
    "regexp_split_to_array",
    "translate",
    "ascii",
    "chr",
    "format",
    "quote_ident",
    "quote_literal",
    "to_hex",
    "encode",
    "decode",
    "string_to_array",
    "array_to_string",
    // arrays, json
    "array_length",
    "cardinality",
    "array_position",
    "array_remove",
    "array_append",
    "array_cat",
    "unnest",
    "json_build_object",
    "jsonb_build_object",
    "json_build_array",
    "jsonb_build_array",
    "to_json",
    "to_jsonb",
    "row_to_json",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "json_extract_path_text",
    "jsonb_array_length",
    "jsonb_typeof",
    "jsonb_strip_nulls",
    "jsonb_set",
    // dates (stable through TimeZone / DateStyle only)
    "date_trunc",
    "date_part",
    "extract",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_interval",
    "age_between",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    "date_bin",
    "justify_days",
    "justify_hours",
    "justify_interval",
    "isfinite",
];

/// Literals that PostgreSQL turns into the current moment when cast to a date/time type.
const VOLATILE_LITERALS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// The visitor state: what it saw on the way.
#[derive(Default)]
pub(super) struct Checker {
    pub(super) relations: Vec<ObjectName>,
    pub(super) ctes: Vec<String>,
    pub(super) max_param: usize,
}

fn last_name(name: &ObjectName) -> String {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(id)) => id.value.to_lowercase(),
        _ => name.to_string().to_lowercase(),
    }
}

fn check_set_expr(body: &SetExpr) -> ControlFlow<PassReason> {
    match body {
        SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
            ControlFlow::Break(PassReason::DataModifyingCte)
        }
        SetExpr::SetOperation { left, right, .. } => {
            check_set_expr(left)?;
            check_set_expr(right)
        }
        _ => ControlFlow::Continue(()),
    }
}

impl Visitor for Checker {
    type Break = PassReason;

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<PassReason> {
        if !query.locks.is_empty() {
            return ControlFlow::Break(PassReason::Locking);
        }
        if query.for_clause.is_some() || !query.pipe_operators.is_empty() {
            return ControlFlow::Break(PassReason::Utility);
        }
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                self.ctes.push(super::fold(&cte.alias.name));
                check_set_expr(&cte.query.body)?;
            }
        }
        check_set_expr(&query.body)
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<PassReason> {
        if select.into.is_some() {
            return ControlFlow::Break(PassReason::SelectInto);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<PassReason> {
        match factor {
            TableFactor::Table {
                sample: Some(_), ..
            }
            | TableFactor::Derived {
                sample: Some(_), ..
            } => ControlFlow::Break(PassReason::Volatile("tablesample".to_owned())),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<PassReason> {
        self.relations.push(relation.clone());
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<PassReason> {
        match expr {
            Expr::Function(f) => {
                let name = last_name(&f.name);
                if VOLATILE.contains(&name.as_str()) {
                    return ControlFlow::Break(PassReason::Volatile(name));
                }
                if !DETERMINISTIC.contains(&name.as_str()) {
                    return ControlFlow::Break(PassReason::UnknownFunction(name));
                }
            }
            Expr::Value(v) => match &v.value {
                Value::Placeholder(p) => {
                    let n = p
                        .strip_prefix('$')
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    self.max_param = self.max_param.max(n);
                }
                Value::SingleQuotedString(s)
                    if VOLATILE_LITERALS.contains(&s.trim().to_lowercase().as_str()) =>
                {
                    return ControlFlow::Break(PassReason::Volatile(format!("'{s}'")));
                }
                _ => {}
            },
            Expr::TypedString(ts) => {
                if let Value::SingleQuotedString(s) = &ts.value.value {
                    if VOLATILE_LITERALS.contains(&s.trim().to_lowercase().as_str()) {
                        return ControlFlow::Break(PassReason::Volatile(format!("'{s}'")));
                    }
                }
                if !builtin_type(&ts.data_type) {
                    return ControlFlow::Break(PassReason::UnknownFunction(format!(
                        "input of type {}",
                        ts.data_type
                    )));
                }
            }
            // A cast to a type of the database's own (a domain's CHECK, a user cast function)
            // runs user code, as does an operator that is not one of PostgreSQL's.
            Expr::Cast { data_type, .. } if !builtin_type(data_type) => {
                return ControlFlow::Break(PassReason::UnknownFunction(format!(
                    "cast to {data_type}"
                )));
            }
            Expr::BinaryOp {
                op: op @ (BinaryOperator::Custom(_) | BinaryOperator::PGCustomBinaryOperator(_)),
                ..
            } => {
                return ControlFlow::Break(PassReason::UnknownFunction(format!("operator {op}")));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Whether `t` names one of PostgreSQL's own types: a type sqlparser knows by keyword, or one of
/// a few `pg_catalog` types it does not, unqualified or qualified with `pg_catalog` (the search
/// path a cached answer is served under puts `pg_catalog` first). Anything else may be a
/// domain or a type of the database's own, whose input, checks or casts run user code.
fn builtin_type(t: &DataType) -> bool {
    const CATALOG: &[&str] = &[
        "oid",
        "regclass",
        "regtype",
        "regproc",
        "name",
        "inet",
        "cidr",
        "macaddr",
        "macaddr8",
        "money",
        "xid",
        "tsvector",
        "tsquery",
        "int2vector",
        "oidvector",
        "pg_lsn",
    ];
    match t {
        DataType::Custom(name, _) => {
            let parts: Vec<String> = name
                .0
                .iter()
                .map(|p| match p {
                    ObjectNamePart::Identifier(id) => id.value.to_lowercase(),
                    other => other.to_string().to_lowercase(),
                })
                .collect();
            match parts.as_slice() {
                [n] => CATALOG.contains(&n.as_str()),
                [schema, n] => schema == "pg_catalog" && CATALOG.contains(&n.as_str()),
                _ => false,
            }
        }
        DataType::Array(def) => match def {
            ArrayElemTypeDef::None => true,
            ArrayElemTypeDef::SquareBracket(inner, _)
            | ArrayElemTypeDef::AngleBracket(inner)
            | ArrayElemTypeDef::Parenthesis(inner)
            | ArrayElemTypeDef::ParenthesisNotNull(inner)
            | ArrayElemTypeDef::Qualified(inner, _) => builtin_type(inner),
        },
        _ => true,
    }
}
