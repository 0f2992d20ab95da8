//! No import cycle among `controlplane/src`'s top-level modules (issue 13): dependencies point
//! one way, so each module can be read, tested and changed knowing only what it uses.
//!
//! The graph is read from the source, not from the compiler: every `crate::<module>` path in a
//! module's files (in `use` lines, grouped `use crate::{a, b::c}` included, and in inline paths)
//! is an edge from that module to `<module>`. Comments are left out; `#[cfg(test)]` code counts
//! (a test helper that imports back would tie the modules just the same). The modules are the
//! ones `src/lib.rs` declares; a file such as `src/metrics_tests.rs` belongs to the module whose
//! name prefixes it, and the binary's files (`src/main.rs`, `src/cli/`) are not the library's.
//!
//! On failure the message names each cycle as a path of modules, with the file and line of
//! every import on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An edge's evidence: the file (relative to `src/`) and line of one `crate::` path.
type Site = (String, usize);

/// The library's top-level modules, from `src/lib.rs`'s `mod` declarations.
fn modules(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    lib.lines()
        .map(strip_comment)
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

fn strip_comment(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable src directory")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a file under `src/` belongs to, if it is the library's.
fn module_of(rel: &Path, modules: &BTreeSet<String>) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let stem = first.strip_suffix(".rs").unwrap_or(first);
    if modules.contains(stem) {
        return Some(stem.to_string());
    }
    // `src/metrics_tests.rs` (a `#[path]` child of `metrics`).
    modules
        .iter()
        .find(|m| stem.starts_with(&format!("{m}_")))
        .cloned()
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The modules named right after each `crate::` in `text` (comments already removed), with
/// the byte offset of each.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("crate::").map(|i| i + from) {
        from = i + "crate::".len();
        // `pgline_crate::`, `$crate::` (a macro's own crate) are not ours.
        if i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'$') {
            continue;
        }
        let rest = &text[from..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first name of each item at depth one.
            let mut depth = 1;
            let mut item_start = true;
            let mut j = 0;
            let g = group.as_bytes();
            while j < g.len() && depth > 0 {
                match g[j] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    b',' if depth == 1 => item_start = true,
                    b if item_start && is_ident(b) && depth == 1 => {
                        let end = g[j..]
                            .iter()
                            .position(|&b| !is_ident(b))
                            .unwrap_or(g.len() - j);
                        out.push((i, group[j..j + end].to_string()));
                        item_start = false;
                        j += end;
                        continue;
                    }
                    _ => {}
                }
                j += 1;
            }
        } else {
            let end = rest
                .bytes()
                .position(|b| !is_ident(b))
                .unwrap_or(rest.len());
            out.push((i, rest[..end].to_string()));
        }
    }
    out
}

/// Edges `from -> to` between distinct modules, each with where it was seen.
fn graph(src: &Path) -> BTreeMap<String, BTreeMap<String, Vec<Site>>> {
    let modules = modules(src);
    assert!(!modules.is_empty(), "no modules declared in src/lib.rs");
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeMap<String, Vec<Site>>> = BTreeMap::new();
    for m in &modules {
        g.entry(m.clone()).or_default();
    }
    for file in files {
        let rel = file.strip_prefix(src).expect("under src").to_path_buf();
        let Some(from) = module_of(&rel, &modules) else {
            continue;
        };
        let source = std::fs::read_to_string(&file).expect("readable source");
        let text: String = source
            .lines()
            .map(|l| format!("{}\n", strip_comment(l)))
            .collect();
        for (offset, to) in crate_paths(&text) {
            if to == from || !modules.contains(&to) {
                continue;
            }
            let line = text[..offset].matches('\n').count() + 1;
            g.entry(from.clone())
                .or_default()
                .entry(to)
                .or_default()
                .push((rel.display().to_string(), line));
        }
    }
    g
}

/// Strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(g: &BTreeMap<String, BTreeMap<String, Vec<Site>>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        g: &'a BTreeMap<String, BTreeMap<String, Vec<Site>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// One cycle through `start` inside `scc`, as a path of modules ending where it began.
fn a_cycle(
    g: &BTreeMap<String, BTreeMap<String, Vec<Site>>>,
    scc: &[String],
    start: &str,
) -> Vec<String> {
    // Breadth-first from `start` back to `start`, staying in the component: a shortest cycle.
    let inside: BTreeSet<&str> = scc.iter().map(String::as_str).collect();
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in g[v].keys() {
            let w = w.as_str();
            if w == start {
                let mut path = vec![start.to_string()];
                let mut at = v;
                while at != start {
                    path.push(at.to_string());
                    at = parent[at];
                }
                path.push(start.to_string());
                path.reverse();
                return path;
            }
            if inside.contains(w) && !parent.contains_key(w) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a strongly connected component has a cycle through each of its members")
}

fn describe(g: &BTreeMap<String, BTreeMap<String, Vec<Site>>>, sccs: &[Vec<String>]) -> String {
    let mut msg = String::new();
    for scc in sccs {
        let path = a_cycle(g, scc, &scc[0]);
        msg.push_str(&format!(
            "import cycle among {{{}}}: {}\n",
            scc.join(", "),
            path.join(" -> ")
        ));
        for pair in path.windows(2) {
            let sites = &g[&pair[0]][&pair[1]];
            let shown: Vec<String> = sites
                .iter()
                .take(3)
                .map(|(f, l)| format!("src/{f}:{l}"))
                .collect();
            let more = sites.len().saturating_sub(3);
            msg.push_str(&format!(
                "  {} -> {}: {}{}\n",
                pair[0],
                pair[1],
                shown.join(", "),
                if more > 0 {
                    format!(" (and {more} more)")
                } else {
                    String::new()
                }
            ));
        }
    }
    msg
}

#[test]
fn no_import_cycle_among_controlplane_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    let sccs = cycles(&g);
    assert!(sccs.is_empty(), "\n{}", describe(&g, &sccs));
}

/// The check itself finds a cycle, and names it with its imports (so a pass above means no
/// cycle, not a blind reader).
#[test]
fn the_check_reports_a_cycle_it_is_shown() {
    let dir = std::env::temp_dir().join(format!("pgline-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("b")).expect("temp dir");
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).expect("write");
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\nmod d;\n");
    write(
        "a.rs",
        "// use crate::c; in a comment is no import\nuse crate::{b::x, c as _};\n",
    );
    write("b/mod.rs", "pub mod x;\n");
    write("b/x.rs", "fn f() { crate::a::g(); }\n");
    write("c.rs", "use pgline_crate::a;\n");
    write("d.rs", "");
    let g = graph(&dir);
    let sccs = cycles(&g);
    let text = describe(&g, &sccs);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(sccs, vec![vec!["a".to_string(), "b".to_string()]], "{text}");
    assert!(text.contains("a -> b -> a"), "{text}");
    assert!(text.contains("a -> b: src/a.rs:2"), "{text}");
    assert!(text.contains("b -> a: src/b/x.rs:1"), "{text}");
    assert!(g["a"].contains_key("c"), "grouped imports count");
    assert!(g["c"].is_empty(), "pgline_crate:: is not crate::");
}
