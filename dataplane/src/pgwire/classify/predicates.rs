//! Shape matching on a checked query: the point-lookup pattern, top-level equality
//! predicates, identifier folding and literal lifting for the normalized text.

use super::{fold, table_ref, Catalog, Equality, KeySource, PointLookup, Projection, TableRef};
use sqlparser::ast::{
    visit_expressions_mut, visit_relations_mut, BinaryOperator, Expr, GroupByExpr, Ident,
    ObjectNamePart, Query, Select, SelectItem, SetExpr, Statement, TableFactor, Value,
};
use std::ops::ControlFlow;

/// The outermost SELECT of a query, if its body is one.
pub(super) fn top_select(query: &Query) -> Option<&Select> {
    match query.body.as_ref() {
        SetExpr::Select(s) => Some(s),
        _ => None,
    }
}

/// The conjuncts of a WHERE clause (`a AND b AND c`, parentheses around ANDs included).
fn conjuncts<'a>(expr: &'a Expr, out: &mut Vec<&'a Expr>) {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        Expr::Nested(inner) => conjuncts(inner, out),
        other => out.push(other),
    }
}

/// A literal or a `$n` parameter.
fn key_source(expr: &Expr) -> Option<KeySource> {
    let Expr::Value(v) = expr else { return None };
    match &v.value {
        Value::Placeholder(p) => p.strip_prefix('$')?.parse().ok().map(KeySource::Param),
        Value::Number(..) | Value::SingleQuotedString(_) => {
            Some(KeySource::Literal(v.value.to_string()))
        }
        _ => None,
    }
}

/// A column reference: (qualifier, column).
fn column(expr: &Expr) -> Option<(Option<String>, String)> {
    match expr {
        Expr::Identifier(id) => Some((None, fold(id))),
        Expr::CompoundIdentifier(ids) => match ids.as_slice() {
            [q, c] => Some((Some(fold(q)), fold(c))),
            _ => None,
        },
        _ => None,
    }
}

/// `column = value` or `value = column`.
fn equality(expr: &Expr) -> Option<(Option<String>, String, KeySource)> {
    let Expr::BinaryOp {
        left,
        op: BinaryOperator::Eq,
        right,
    } = expr
    else {
        return None;
    };
    if let (Some((q, c)), Some(v)) = (column(left), key_source(right)) {
        return Some((q, c, v));
    }
    let ((q, c), v) = (column(right)?, key_source(left)?);
    Some((q, c, v))
}

/// The tables of a FROM list by the name they are referred to (alias, else table name).
fn names_in_scope(select: &Select) -> Vec<(String, TableRef)> {
    let mut out = Vec::new();
    let factors = select
        .from
        .iter()
        .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)));
    for factor in factors {
        if let TableFactor::Table { name, alias, .. } = factor {
            if let Some(t) = table_ref(name) {
                let visible = alias
                    .as_ref()
                    .map_or_else(|| t.name.clone(), |a| fold(&a.name));
                out.push((visible, t));
            }
        }
    }
    out
}

/// Top-level `[t.]col = value` predicates of `select`'s WHERE.
pub(super) fn equalities(select: &Select, tables: &[TableRef]) -> Vec<Equality> {
    let Some(selection) = &select.selection else {
        return Vec::new();
    };
    let scope = names_in_scope(select);
    let mut parts = Vec::new();
    conjuncts(selection, &mut parts);
    parts
        .into_iter()
        .filter_map(equality)
        .map(|(q, column, value)| {
            let table = match q {
                Some(q) => scope.iter().find(|(n, _)| *n == q).map(|(_, t)| t.clone()),
                None if tables.len() == 1 && scope.len() == 1 => tables.first().cloned(),
                None => None,
            };
            Equality {
                table,
                column,
                value,
            }
        })
        .collect()
}

fn plain_select(query: &Query) -> Option<&Select> {
    if query.with.is_some()
        || query.order_by.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
        || !query.locks.is_empty()
    {
        return None;
    }
    let s = top_select(query)?;
    let no_grouping =
        matches!(&s.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let simple = s.distinct.is_none()
        && s.top.is_none()
        && s.into.is_none()
        && s.having.is_none()
        && s.qualify.is_none()
        && s.prewhere.is_none()
        && s.lateral_views.is_empty()
        && s.named_window.is_empty()
        && s.from.len() == 1
        && s.from.first().is_some_and(|t| t.joins.is_empty());
    (simple && no_grouping).then_some(s)
}

/// Matches `SELECT <cols or *> FROM [schema.]t WHERE <pk = value> [AND ...]`, every key
/// column equated exactly once and nothing else.
pub(super) fn point_lookup(query: &Query, catalog: &dyn Catalog) -> Option<PointLookup> {
    let s = plain_select(query)?;
    let TableFactor::Table {
        name, alias, args, ..
    } = &s.from.first()?.relation
    else {
        return None;
    };
    if args.is_some() {
        return None;
    }
    let table = table_ref(name)?;
    let pk = catalog.primary_key(table.schema.as_deref(), &table.name)?;
    if pk.is_empty() {
        return None;
    }
    let visible = alias
        .as_ref()
        .map_or_else(|| table.name.clone(), |a| fold(&a.name));
    let ours = |q: &Option<String>| q.as_ref().is_none_or(|q| *q == visible);
    let columns = match s.projection.as_slice() {
        [SelectItem::Wildcard(_)] => Projection::All,
        items => Projection::Columns(
            items
                .iter()
                .map(|item| match item {
                    SelectItem::UnnamedExpr(e) => column(e).filter(|(q, _)| ours(q)).map(|c| c.1),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    let mut parts = Vec::new();
    conjuncts(s.selection.as_ref()?, &mut parts);
    if parts.len() != pk.len() {
        return None;
    }
    let mut key: Vec<Option<KeySource>> = vec![None; pk.len()];
    for part in parts {
        let (q, col, value) = equality(part)?;
        if !ours(&q) {
            return None;
        }
        let slot = key.get_mut(pk.iter().position(|k| *k == col)?)?;
        if slot.replace(value).is_some() {
            return None;
        }
    }
    Some(PointLookup {
        table,
        columns,
        key: key.into_iter().collect::<Option<Vec<_>>>()?,
    })
}

fn lower(id: &mut Ident) {
    if id.quote_style.is_none() {
        id.value = id.value.to_lowercase();
    }
}

/// Folds unquoted identifiers (columns, tables, function names) to lower case, as PostgreSQL
/// resolves them, so that `SELECT ID FROM Users` and `select id from users` share a key.
pub(super) fn lowercase_identifiers(stmt: &mut Statement) {
    let _ = visit_relations_mut(stmt, |name| {
        for part in &mut name.0 {
            if let ObjectNamePart::Identifier(id) = part {
                lower(id);
            }
        }
        ControlFlow::<()>::Continue(())
    });
    let _ = visit_expressions_mut(stmt, |expr| {
        match expr {
            Expr::Identifier(id) => lower(id),
            Expr::CompoundIdentifier(ids) => ids.iter_mut().for_each(lower),
            Expr::Function(f) => {
                for part in &mut f.name.0 {
                    if let ObjectNamePart::Identifier(id) = part {
                        lower(id);
                    }
                }
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
}

/// Lifts every non-NULL, non-boolean literal into a parameter numbered after the client's
/// (`$max_param+1`, ...); returns the canonical text and the lifted literals in order.
pub(super) fn normalize(mut stmt: Statement, max_param: usize) -> (String, Vec<String>) {
    let mut literals = Vec::new();
    let _ = visit_expressions_mut(&mut stmt, |expr| {
        if let Expr::Value(v) = expr {
            let lift = !matches!(
                v.value,
                Value::Null | Value::Boolean(_) | Value::Placeholder(_)
            );
            if lift {
                literals.push(v.value.to_string());
                v.value = Value::Placeholder(format!("${}", max_param + literals.len()));
            }
        }
        ControlFlow::<()>::Continue(())
    });
    (stmt.to_string(), literals)
}
