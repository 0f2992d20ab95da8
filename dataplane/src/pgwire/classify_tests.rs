//! Classification table: statements with their expected class, plus the details of
//! normalized text, literals and equality predicates.

use super::*;
use std::collections::HashMap;

struct TestCatalog(HashMap<(Option<String>, String), Vec<String>>);

impl Catalog for TestCatalog {
    fn primary_key(&self, schema: Option<&str>, table: &str) -> Option<&[String]> {
        let schema = schema.filter(|s| *s != "public").map(str::to_owned);
        self.0.get(&(schema, table.to_owned())).map(Vec::as_slice)
    }
}

fn catalog() -> TestCatalog {
    let mut m = HashMap::new();
    let mut add = |schema: Option<&str>, t: &str, pk: &[&str]| {
        m.insert(
            (schema.map(str::to_owned), t.to_owned()),
            pk.iter().map(|s| (*s).to_owned()).collect(),
        );
    };
    add(None, "users", &["id"]);
    add(None, "orders", &["id"]);
    add(None, "order_items", &["order_id", "line_no"]);
    add(None, "accounts", &["tenant_id", "id"]);
    add(None, "products", &["sku"]);
    add(Some("shop"), "items", &["id"]);
    add(None, "events", &[]);
    add(None, "Mixed", &["id"]);
    TestCatalog(m)
}

fn summary(c: &Classification) -> String {
    let table = |t: &TableRef| match &t.schema {
        Some(s) => format!("{s}.{}", t.name),
        None => t.name.clone(),
    };
    match c {
        Classification::PointLookup(p) => {
            let cols = match &p.columns {
                Projection::All => "*".to_owned(),
                Projection::Columns(c) => c.join(","),
            };
            let keys: Vec<String> = p
                .key
                .iter()
                .map(|k| match k {
                    KeySource::Param(n) => format!("${n}"),
                    KeySource::Literal(l) => l.clone(),
                })
                .collect();
            format!("point {} {cols} {}", table(&p.table), keys.join(","))
        }
        Classification::Cacheable(q) => {
            let t: Vec<String> = q.tables.iter().map(table).collect();
            format!("cache {}", t.join(","))
        }
        Classification::PassThrough(r) => format!("pass {r:?}"),
    }
}

const TABLE: &[(&str, &str)] = &[
    // point lookups
    ("SELECT * FROM users WHERE id = $1", "point users * $1"),
    ("select * from users where id = 42", "point users * 42"),
    ("SELECT id, name FROM users WHERE id = '42'", "point users id,name '42'"),
    ("SELECT name FROM public.users WHERE id = $1", "point public.users name $1"),
    ("SELECT * FROM users WHERE $1 = id", "point users * $1"),
    ("SELECT * FROM users WHERE (id = $1)", "point users * $1"),
    ("SELECT u.name FROM users u WHERE u.id = $1", "point users name $1"),
    ("SELECT users.name FROM users WHERE users.id = 7", "point users name 7"),
    ("SELECT * FROM USERS WHERE ID = $1", "point users * $1"),
    ("SELECT * FROM order_items WHERE order_id = $1 AND line_no = $2", "point order_items * $1,$2"),
    ("SELECT * FROM order_items WHERE line_no = 3 AND order_id = $1", "point order_items * $1,3"),
    ("SELECT * FROM accounts WHERE tenant_id = $1 AND id = $2", "point accounts * $1,$2"),
    ("SELECT * FROM shop.items WHERE id = $1", "point shop.items * $1"),
    ("SELECT sku FROM products WHERE sku = 'A-1'", "point products sku 'A-1'"),
    ("SELECT * FROM \"Mixed\" WHERE id = $1", "point Mixed * $1"),
    // near misses of the point pattern that are still cacheable reads
    ("SELECT * FROM order_items WHERE order_id = $1", "cache order_items"),
    ("SELECT * FROM users WHERE id = $1 AND name = 'x'", "cache users"),
    ("SELECT * FROM users WHERE id = $1 OR id = $2", "cache users"),
    ("SELECT * FROM users WHERE id = $1 AND id = $2", "cache users"),
    ("SELECT * FROM users WHERE name = $1", "cache users"),
    ("SELECT * FROM users WHERE id > $1", "cache users"),
    ("SELECT * FROM users WHERE id = $1 LIMIT 1", "cache users"),
    ("SELECT * FROM users WHERE id = $1 ORDER BY name", "cache users"),
    ("SELECT DISTINCT name FROM users WHERE id = $1", "cache users"),
    ("SELECT id AS key FROM users WHERE id = $1", "cache users"),
    ("SELECT lower(name) FROM users WHERE id = $1", "cache users"),
    ("SELECT * FROM users WHERE id = -1", "cache users"),
    ("SELECT * FROM users WHERE id IN ($1, $2)", "cache users"),
    ("SELECT * FROM users", "cache users"),
    ("SELECT * FROM events WHERE id = $1", "cache events"),
    // cacheable reads
    ("SELECT count(*) FROM orders WHERE tenant_id = $1", "cache orders"),
    ("SELECT o.id, u.name FROM orders o JOIN users u ON u.id = o.user_id WHERE o.tenant_id = $1", "cache orders,users"),
    ("SELECT u.name, sum(o.total) FROM users u LEFT JOIN orders o ON o.user_id = u.id GROUP BY u.name HAVING sum(o.total) > 100", "cache orders,users"),
    ("SELECT * FROM orders ORDER BY created_at DESC LIMIT 20 OFFSET 40", "cache orders"),
    ("SELECT status, count(*), avg(total) FROM orders GROUP BY status", "cache orders"),
    ("SELECT id, row_number() OVER (PARTITION BY tenant_id ORDER BY total DESC) FROM orders", "cache orders"),
    ("SELECT * FROM orders WHERE user_id IN (SELECT id FROM users WHERE tenant_id = $1)", "cache orders,users"),
    ("SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM order_items i WHERE i.order_id = o.id)", "cache order_items,orders"),
    ("WITH t AS (SELECT * FROM orders WHERE tenant_id = $1) SELECT count(*) FROM t", "cache orders"),
    ("SELECT id FROM users UNION SELECT user_id FROM orders", "cache orders,users"),
    ("SELECT coalesce(name, 'anon') FROM users WHERE tenant_id = 3", "cache users"),
    ("SELECT date_trunc('day', created_at), count(*) FROM orders GROUP BY 1", "cache orders"),
    ("SELECT * FROM orders WHERE created_at > '2024-01-01'", "cache orders"),
    ("SELECT CASE WHEN total > 10 THEN 'big' ELSE 'small' END FROM orders", "cache orders"),
    ("SELECT * FROM orders WHERE total BETWEEN $1 AND $2", "cache orders"),
    ("SELECT * FROM users WHERE name LIKE 'a%'", "cache users"),
    ("SELECT * FROM users WHERE deleted_at IS NULL", "cache users"),
    ("SELECT total::numeric(10,2) FROM orders", "cache orders"),
    ("SELECT * FROM (SELECT * FROM orders WHERE tenant_id = $1) sub", "cache orders"),
    ("SELECT u.*, (SELECT count(*) FROM orders o WHERE o.user_id = u.id) FROM users u", "cache orders,users"),
    ("SELECT string_agg(name, ',') FROM users", "cache users"),
    ("SELECT * FROM shop.items WHERE price < 10", "cache shop.items"),
    ("SELECT greatest(total, 0) FROM orders", "cache orders"),
    ("SELECT max(total) FROM orders WHERE tenant_id = $1 AND status = 'paid'", "cache orders"),
    ("SELECT * FROM orders FETCH FIRST 5 ROWS ONLY", "cache orders"),
    // not cached: volatile or unknown functions, locking, INTO, writing CTEs, unknown tables
    ("SELECT now()", "pass Volatile(\"now\")"),
    ("SELECT *, now() FROM users", "pass Volatile(\"now\")"),
    ("SELECT * FROM orders WHERE created_at > now() - interval '1 day'", "pass Volatile(\"now\")"),
    ("SELECT * FROM orders WHERE created_at > CURRENT_TIMESTAMP", "pass Volatile(\"current_timestamp\")"),
    ("SELECT * FROM orders WHERE created_at::date = CURRENT_DATE", "pass Volatile(\"current_date\")"),
    ("SELECT random() FROM users", "pass Volatile(\"random\")"),
    ("SELECT nextval('s')", "pass Volatile(\"nextval\")"),
    ("SELECT clock_timestamp(), id FROM users", "pass Volatile(\"clock_timestamp\")"),
    ("SELECT txid_current()", "pass Volatile(\"txid_current\")"),
    ("SELECT * FROM users WHERE id = (SELECT max(id) FROM users) + random()", "pass Volatile(\"random\")"),
    ("SELECT * FROM orders WHERE created_at > 'now'::timestamptz", "pass Volatile(\"'now'\")"),
    ("SELECT * FROM orders WHERE day = DATE 'today'", "pass Volatile(\"'today'\")"),
    ("SELECT current_user, id FROM users", "pass Volatile(\"current_user\")"),
    ("SELECT my_func(id) FROM users", "pass UnknownFunction(\"my_func\")"),
    ("SELECT pg_catalog.pg_get_userbyid(1) FROM users", "pass UnknownFunction(\"pg_get_userbyid\")"),
    // A type or operator of the database's own runs user code (a domain's CHECK, a cast or
    // operator function): not cacheable. PostgreSQL's own types are.
    ("SELECT count(*) FROM users WHERE id::forge_dom IS NOT NULL", "pass UnknownFunction(\"cast to forge_dom\")"),
    ("SELECT * FROM users WHERE id = CAST($1 AS public.money2)", "pass UnknownFunction(\"cast to public.money2\")"),
    ("SELECT * FROM users WHERE name = my_type 'x'", "pass UnknownFunction(\"input of type my_type\")"),
    ("SELECT * FROM users WHERE id = ANY('{1}'::dom[])", "pass UnknownFunction(\"cast to dom[]\")"),
    ("SELECT * FROM users WHERE id === 1", "pass Unparsed"),
    ("SELECT * FROM users WHERE id OPERATOR(public.=) 1", "pass UnknownFunction(\"operator OPERATOR(public.=)\")"),
    // pg_trgm's word-similarity operators follow settings the state read does not hold
    // (its `text % text` reads as modulo; its threshold is in the state read).
    ("SELECT * FROM users WHERE name <% 'x'", "pass UnknownFunction(\"operator <%\")"),
    ("SELECT * FROM users WHERE name %> 'x'", "pass UnknownFunction(\"operator %>\")"),
    ("SELECT * FROM users WHERE name <<% 'x'", "pass UnknownFunction(\"operator <<%\")"),
    ("SELECT * FROM users WHERE name %>> 'x'", "pass UnknownFunction(\"operator %>>\")"),
    ("SELECT * FROM users WHERE id = $1 FOR UPDATE", "pass Locking"),
    ("SELECT * FROM orders FOR SHARE", "pass Locking"),
    ("SELECT * FROM orders o WHERE o.id IN (SELECT id FROM orders FOR UPDATE)", "pass Locking"),
    ("SELECT * INTO backup FROM users", "pass SelectInto"),
    ("WITH d AS (DELETE FROM orders WHERE id = 1 RETURNING *) SELECT * FROM d", "pass DataModifyingCte"),
    ("WITH i AS (INSERT INTO users (id) VALUES (1) RETURNING id) SELECT * FROM i", "pass DataModifyingCte"),
    ("SELECT * FROM temp_scratch", "pass UnknownTable(\"temp_scratch\")"),
    ("SELECT * FROM users JOIN unknown_t ON true", "pass UnknownTable(\"unknown_t\")"),
    ("SELECT * FROM pg_catalog.pg_class", "pass UnknownTable(\"pg_catalog.pg_class\")"),
    ("SELECT * FROM other.users WHERE id = 1", "pass UnknownTable(\"other.users\")"),
    ("SELECT 1", "pass NoTable"),
    ("WITH users AS (SELECT * FROM orders) SELECT * FROM users", "pass ShadowedTable(\"users\")"),
    ("SELECT * FROM orders TABLESAMPLE SYSTEM (10)", "pass Volatile(\"tablesample\")"),
    ("SELECT * FROM orders WHERE id = $1 FOR UPDATE SKIP LOCKED", "pass Locking"),
    // sqlparser does not know FOR KEY SHARE: still passed through, as unparsed
    ("SELECT * FROM users WHERE id = $1 FOR KEY SHARE", "pass Unparsed"),
    ("SELECT * FROM generate_series(1, 10)", "pass UnknownTable(\"generate_series\")"),
    // writes, DDL, transactions, session state, utilities
    ("INSERT INTO users (id, name) VALUES (1, 'a')", "pass Write"),
    ("UPDATE users SET name = 'b' WHERE id = 1", "pass Write"),
    ("DELETE FROM users WHERE id = 1", "pass Write"),
    ("INSERT INTO users SELECT * FROM users RETURNING id", "pass Write"),
    ("COPY users FROM STDIN", "pass Write"),
    ("CREATE TABLE t (id int primary key)", "pass Ddl"),
    ("ALTER TABLE users ADD COLUMN x int", "pass Ddl"),
    ("DROP TABLE users", "pass Ddl"),
    ("TRUNCATE users", "pass Ddl"),
    ("CREATE INDEX ON users (name)", "pass Ddl"),
    ("GRANT SELECT ON users TO bob", "pass Ddl"),
    ("BEGIN", "pass Transaction"),
    ("START TRANSACTION ISOLATION LEVEL REPEATABLE READ", "pass Transaction"),
    ("COMMIT", "pass Transaction"),
    ("ROLLBACK", "pass Transaction"),
    ("SAVEPOINT a", "pass Transaction"),
    ("SET search_path = app", "pass SessionState"),
    ("SET TIME ZONE 'UTC'", "pass SessionState"),
    ("RESET ALL", "pass SessionState"),
    ("DISCARD ALL", "pass SessionState"),
    ("SHOW search_path", "pass Utility"),
    ("EXPLAIN SELECT * FROM users", "pass Utility"),
    ("LISTEN ch", "pass Utility"),
    ("VACUUM users", "pass Utility"),
    ("", "pass Empty"),
    ("  ;  ", "pass Empty"),
    ("SELECT * FROM users WHERE id = 1; SELECT 2", "pass MultipleStatements"),
    ("SELEC * FROM users", "pass Unparsed"),
];

#[test]
fn classification_table() {
    assert!(TABLE.len() >= 80, "{} statements", TABLE.len());
    let cat = catalog();
    let mut wrong = Vec::new();
    for (sql, want) in TABLE {
        let got = summary(&classify(sql, &cat));
        if got != *want {
            wrong.push(format!("{sql}\n    want {want}\n    got  {got}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

fn cacheable(sql: &str) -> CacheableQuery {
    match classify(sql, &catalog()) {
        Classification::Cacheable(q) => q,
        other => panic!("{sql}: {other:?}"),
    }
}

#[test]
fn normalized_text_ignores_case_whitespace_and_literal_values() {
    let a = cacheable("select  NAME from Users\n where tenant_id = 7 and status = 'x'");
    let b = cacheable("SELECT name FROM users WHERE tenant_id = 9 AND status = 'y'");
    assert_eq!(a.normalized, b.normalized);
    assert_eq!(
        a.normalized,
        "SELECT name FROM users WHERE tenant_id = $1 AND status = $2"
    );
    assert_eq!(a.literals, ["7", "'x'"]);
    assert_eq!(b.literals, ["9", "'y'"]);
    // literals are numbered after the client's own parameters
    let c = cacheable("SELECT * FROM orders WHERE tenant_id = $2 AND total > 10 LIMIT $1");
    assert_eq!(c.client_params, 2);
    assert_eq!(c.literals, ["10"]);
    assert!(c.normalized.contains("total > $3"), "{}", c.normalized);
    // a quoted identifier keeps its case; a string and a number stay distinct values
    let d = cacheable("SELECT \"Name\" FROM users WHERE id > '5'");
    assert!(d.normalized.contains("\"Name\""), "{}", d.normalized);
    assert_eq!(d.literals, ["'5'"]);
}

#[test]
fn equality_predicates_for_finer_invalidation() {
    let q = cacheable(
        "SELECT o.id, u.name FROM orders o JOIN users u ON u.id = o.user_id \
         WHERE o.tenant_id = $1 AND u.active = true AND 'paid' = o.status",
    );
    let t = |n: &str| {
        Some(TableRef {
            schema: None,
            name: n.to_owned(),
        })
    };
    assert_eq!(
        q.equalities,
        [
            Equality {
                table: t("orders"),
                column: "tenant_id".into(),
                value: KeySource::Param(1)
            },
            Equality {
                table: t("orders"),
                column: "status".into(),
                value: KeySource::Literal("'paid'".into())
            },
        ]
    );
    let single = cacheable("SELECT count(*) FROM orders WHERE tenant_id = 4");
    assert_eq!(
        single.equalities,
        [Equality {
            table: t("orders"),
            column: "tenant_id".into(),
            value: KeySource::Literal("4".into())
        }]
    );
    // unqualified columns with several tables in scope cannot be attributed
    let joined = cacheable(
        "SELECT * FROM orders JOIN users ON users.id = orders.user_id WHERE tenant_id = $1",
    );
    assert!(joined.equalities.is_empty());
    // a table read twice: the equality does not bound what the other reference reads
    let twice =
        cacheable("SELECT (SELECT count(*) FROM orders) AS n FROM orders WHERE tenant_id = 4");
    assert!(twice.equalities.is_empty());
}

#[test]
fn constant_selects_and_what_is_not_one() {
    for sql in [
        "SELECT 1",
        "select 1;",
        "SELECT 1, 'a', true, NULL, 2.5 AS x",
        "SELECT (1)",
        "SELECT CAST('7' AS integer), '8'::bigint, 'x'::varchar(3), 't'::boolean",
        "SELECT 1 /* health */ -- check",
    ] {
        assert!(is_constant_select(sql), "{sql}");
    }
    for sql in [
        "",
        "SELECT 1; SELECT 2",
        "SELECT 1 FROM t",
        "SELECT 1 FROM generate_series(1, 2)",
        "SELECT * FROM (VALUES (1)) v",
        "SELECT $1",
        "SELECT 1 + 1",
        "SELECT -1",
        "SELECT now()",
        "SELECT set_config('search_path', 'x', false)",
        "SELECT lower('A')",
        "SELECT (SELECT 1)",
        "SELECT 1::text",
        "SELECT 1::int4",
        "SELECT '1'::my_domain",
        "SELECT 1 INTO TEMP t",
        "SELECT 1 INTO t",
        "WITH x AS (SELECT 1) SELECT 1",
        "SELECT 1 FOR UPDATE",
        "VALUES (1)",
        "SELECT 1 UNION SELECT 2",
        "SET search_path = x",
        "SELECT 1 WHERE f()",
    ] {
        assert!(!is_constant_select(sql), "{sql}");
    }
}
