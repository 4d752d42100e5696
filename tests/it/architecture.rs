//! The import rules, enforced: every file under `src/` is parsed (`syn`), each path that names
//! another module of the crate — `use crate::…`, `use super::…`, `use self::…`, and the same
//! paths written inline in code, types and macro calls — is resolved to the module it reaches
//! (`super::` from the module the path is written in, inline `mod … { }` blocks counted), and
//! checked against [`RULES`], the one table of which module may not import which. A forbidden
//! use fails with its file, line, the path as written and the rule it breaks.
//!
//! ARCHITECTURE.md ("Imports run one way") lists the same rules in words.

use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A forbidden direction: no module under any of `from` may reach a module under any of `to`.
/// Modules are written as paths from the crate's root (`api::openai` is `src/api/openai.rs` and
/// everything under it).
struct Rule {
    from: &'static [&'static str],
    to: &'static [&'static str],
    why: &'static str,
}

/// Every top-level module of the crate, the tools included: a rule `to: EVERY_MODULE` forbids
/// every module but the rule's own.
const EVERY_MODULE: &[&str] = &[
    "accept",
    "access_log",
    "activity",
    "api",
    "auth",
    "backend",
    "balance",
    "config",
    "control",
    "dispatch",
    "error",
    "kinds",
    "limits",
    "log_file",
    "log_throttle",
    "metrics",
    "outcome",
    "reload",
    "stream",
    "tokens",
    "sim",
    "probe",
    "bench",
    "service",
];

/// The tools at the end of [`EVERY_MODULE`]: the simulator, the probe, the bench and the
/// service installer, in the library for the binary's subcommands and the tests.
const TOOLS: &[&str] = &["sim", "probe", "bench", "service"];

/// The gateway's own modules: everything but the [`TOOLS`].
const GATEWAY: &[&str] = EVERY_MODULE.split_at(EVERY_MODULE.len() - TOOLS.len()).0;

/// What `balance` may not import: every module but `kinds` (a test keeps it so).
const ALL_BUT_KINDS: &[&str] = &[
    "accept",
    "access_log",
    "activity",
    "api",
    "auth",
    "backend",
    "config",
    "control",
    "dispatch",
    "error",
    "limits",
    "log_file",
    "log_throttle",
    "metrics",
    "outcome",
    "reload",
    "stream",
    "tokens",
    "sim",
    "probe",
    "bench",
    "service",
];

/// The three faces: translators at the edge, each into the one pipeline and back.
const FACES: [&str; 3] = ["api::openai", "api::responses", "api::messages"];

/// Which module may not import which: the one table.
const RULES: &[Rule] = &[
    Rule {
        from: &["backend"],
        to: &["dispatch"],
        why: "backend knows no queue: the supervisor is handed a gate, it does not reach for the queue",
    },
    Rule {
        from: &["config"],
        to: &["backend"],
        why: "config is plain data: it imports nothing that touches processes (what each kind of server needs lives with the kinds)",
    },
    Rule {
        from: &["stream"],
        to: &["api"],
        why: "the stream layer serves every face; the faces use it, never the reverse",
    },
    Rule { from: &[FACES[0]], to: &[FACES[1], FACES[2]], why: "a face never imports another face" },
    Rule { from: &[FACES[1]], to: &[FACES[0], FACES[2]], why: "a face never imports another face" },
    Rule { from: &[FACES[2]], to: &[FACES[0], FACES[1]], why: "a face never imports another face" },
    Rule {
        from: &["tokens", "limits", "config", "metrics", "kinds"],
        to: &["api", "dispatch"],
        why: "imports run down the path: the layers below the handlers and the queue know neither",
    },
    Rule {
        from: &["stream"],
        to: &["dispatch::call", "dispatch::scheduler", "dispatch::Dispatch", "dispatch::Route"],
        why: "the stream layer holds the queue's permit (the slot lives in the body) and knows nothing else of dispatch",
    },
    Rule {
        from: &["kinds"],
        to: EVERY_MODULE,
        why: "kinds is the catalogue of what each server is and needs: a leaf, it imports nothing of the crate",
    },
    Rule {
        from: &["balance"],
        to: ALL_BUT_KINDS,
        why: "balance is the routing policy, pure: a leaf beside kinds, it is handed candidates and figures and imports nothing else of the crate",
    },
    Rule {
        from: &["backend", "dispatch"],
        to: &["api"],
        why: "imports run down the path: the call below the handlers never reaches up into them",
    },
    Rule {
        from: &["activity"],
        to: EVERY_MODULE,
        why: "activity keeps what happened (rings the record, the scheduler and the admin calls fill): a leaf, it imports nothing of the crate",
    },
    Rule {
        from: &["metrics"],
        to: EVERY_MODULE,
        why: "metrics.rs only declares the metrics: it imports nothing of the crate",
    },
    Rule {
        from: GATEWAY,
        to: TOOLS,
        why: "the tools (simulator, probe, bench, service) sit on top of the gateway; the gateway never imports them",
    },
];

/// One path to another module, where it is written.
#[derive(Debug, Clone, PartialEq)]
struct Reach {
    line: usize,
    /// The path as written (`super::openai::serve`).
    written: String,
    /// The same path from the crate's root (`api::openai::serve`).
    resolved: Vec<String>,
}

/// Walks one file, knowing the module each item is in.
struct Finder {
    module: Vec<String>,
    found: Vec<Reach>,
}

impl Finder {
    /// `segments` (the path as written, its first being `crate`, `super` or `self`) from the
    /// crate's root; `None` for any other path (a crate, a local name) or one that climbs
    /// above the root.
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let mut here = self.module.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                here.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    here.pop()?;
                    rest = &rest[1..];
                }
            }
            _ => return None,
        }
        here.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(here)
    }

    fn note(&mut self, segments: Vec<String>, line: usize) {
        if let Some(resolved) = self.resolve(&segments) {
            self.found.push(Reach { line, written: segments.join("::"), resolved });
        }
    }

    /// Every path a `use` tree brings in, with the prefix before it.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let line = n.ident.span().start().line;
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.note(path, line);
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.note(path, line);
            }
            syn::UseTree::Glob(g) => self.note(prefix.clone(), g.star_token.spans[0].start().line),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }

    /// Paths inside a macro call's tokens (`format!("{}", crate::x::y())`): each `crate`,
    /// `super` or `self` followed by `::`-separated names.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if ["crate", "super", "self"].contains(&id.to_string().as_str()) => {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(next))) =
                        (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.note(segments, line);
                    }
                    i = j.max(i + 1);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            let line = path.segments[0].ident.span().start().line;
            self.note(segments, line);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    /// `pub(crate)`, `pub(super)`, `pub(in crate::x)` say who may see an item: no import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    /// Doc comments and other attributes import nothing.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// The module a file under `src/` is (`src/api/openai.rs` → `api::openai`, `src/api/mod.rs` →
/// `api`, `src/lib.rs` → the root); `None` for the binaries' own files (`main.rs`, `bin/`).
fn module_of(relative: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = relative.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    match parts.as_slice() {
        [only] if only == "lib" => Some(vec![]),
        [only] if only == "main" => None,
        [first, ..] if first == "bin" => None,
        [init @ .., last] if last == "mod" => Some(init.to_vec()),
        all => Some(all.to_vec()),
    }
}

fn starts_with(module: &[String], prefix: &str) -> bool {
    let prefix: Vec<&str> = prefix.split("::").collect();
    module.len() >= prefix.len() && module.iter().zip(&prefix).all(|(a, b)| a == b)
}

/// The rules `module` breaks by reaching `target`.
fn broken<'r>(module: &[String], target: &[String], rules: &'r [Rule]) -> Vec<&'r Rule> {
    rules
        .iter()
        .filter(|r| {
            r.from.iter().any(|f| starts_with(module, f))
                && r.to.iter().any(|t| starts_with(target, t))
                // Within its own module a module may reach anything.
                && !r.from.iter().any(|f| starts_with(target, f))
        })
        .collect()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The paths to other modules written in `source`, a file of module `module`.
fn reaches(source: &str, module: Vec<String>) -> Result<Vec<Reach>, syn::Error> {
    let file = syn::parse_file(source)?;
    let mut finder = Finder { module, found: Vec::new() };
    finder.visit_file(&file);
    Ok(finder.found)
}

/// Every forbidden use under `src/`: `file:line: path → rule`.
fn violations(root: &Path, rules: &[Rule]) -> Vec<String> {
    let src = root.join("src");
    let mut out = Vec::new();
    for path in rust_files(&src) {
        let relative = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(relative) else { continue };
        let source = std::fs::read_to_string(&path).expect("read");
        let found = reaches(&source, module.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let shown = path.strip_prefix(root).unwrap_or(&path).display().to_string();
        let mut seen = std::collections::HashSet::new();
        for reach in found {
            for rule in broken(&module, &reach.resolved, rules) {
                let line = format!(
                    "{shown}:{}: `{}` (module {}) reaches `{}`: forbidden {} → {}: {}",
                    reach.line,
                    reach.written,
                    if module.is_empty() { "crate".to_string() } else { module.join("::") },
                    reach.resolved.join("::"),
                    rule.from.join("|"),
                    rule.to.join("|"),
                    rule.why
                );
                if seen.insert(line.clone()) {
                    out.push(line);
                }
            }
        }
    }
    out
}

#[test]
fn no_module_imports_what_the_rules_forbid() {
    let found = violations(Path::new(env!("CARGO_MANIFEST_DIR")), RULES);
    assert!(
        found.is_empty(),
        "{} forbidden imports (the rules: tests/it/architecture.rs, RULES):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The rules in words are ARCHITECTURE.md's: each rule's reason is there.
#[test]
fn architecture_md_lists_every_rule() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).expect("read");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for rule in RULES {
        assert!(text.contains(rule.why), "ARCHITECTURE.md does not state the rule: {}", rule.why);
    }
}

mod resolution {
    use super::*;

    fn modules(source: &str, module: &[&str]) -> Vec<(usize, String)> {
        reaches(source, module.iter().map(|s| s.to_string()).collect())
            .expect("parses")
            .into_iter()
            .map(|r| (r.line, r.resolved.join("::")))
            .collect()
    }

    #[test]
    fn super_climbs_from_the_module_the_path_is_written_in() {
        let source = "use super::openai::serve;\nmod tests {\n    use super::*;\n    use super::super::messages;\n}\n";
        assert_eq!(
            modules(source, &["api", "responses"]),
            vec![(1, "api::openai::serve".into()), (3, "api::responses".into()), (4, "api::messages".into())]
        );
    }

    #[test]
    fn groups_renames_globs_inline_paths_and_macros_are_found() {
        let source = "use crate::{dispatch::queue::{Permit, self}, error::GatewayError as E};\n\
                      use crate::tokens::*;\n\
                      fn f() -> crate::config::Config { tracing::info!(\"{}\", crate::metrics::NAME); todo!() }\n\
                      use std::sync::Arc;\nuse tokio::sync::mpsc;\n";
        assert_eq!(
            modules(source, &["stream", "meter"]),
            vec![
                (1, "dispatch::queue::Permit".into()),
                (1, "dispatch::queue".into()),
                (1, "error::GatewayError".into()),
                (2, "tokens".into()),
                (3, "config::Config".into()),
                (3, "metrics::NAME".into()),
            ]
        );
    }

    #[test]
    fn comments_visibility_and_other_crates_are_not_imports() {
        let source = "//! See [`crate::dispatch`].\n/// Uses `crate::api`.\npub(crate) fn f() {}\n\
                      pub(in crate::backend) struct S;\nuse mlxgate::api;\n";
        assert_eq!(modules(source, &["backend", "handle"]), vec![]);
    }

    #[test]
    fn files_map_to_modules() {
        let m = |p: &str| module_of(Path::new(p)).map(|m| m.join("::"));
        assert_eq!(m("lib.rs").as_deref(), Some(""));
        assert_eq!(m("api/mod.rs").as_deref(), Some("api"));
        assert_eq!(m("api/messages/events.rs").as_deref(), Some("api::messages::events"));
        assert_eq!(m("config.rs").as_deref(), Some("config"));
        assert_eq!(m("main.rs"), None);
        assert_eq!(m("bin/mlxgate-sim.rs"), None);
    }

    #[test]
    fn a_rule_matches_by_module_prefix() {
        let v = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
        let face_rules = &RULES[3..6];
        assert_eq!(broken(&v("api::responses::body"), &v("api::openai::serve"), face_rules).len(), 1);
        assert!(broken(&v("api::responses"), &v("api::fit"), face_rules).is_empty());
        assert!(broken(&v("api::openai_like"), &v("api::messages"), face_rules).is_empty(), "a prefix is whole names");
    }
}

/// [`ALL_BUT_KINDS`] is [`EVERY_MODULE`] less `kinds` and `balance` (a rule never forbids its
/// own module).
#[test]
fn balance_may_import_only_kinds() {
    let expected: Vec<&str> = EVERY_MODULE.iter().copied().filter(|m| !["kinds", "balance"].contains(m)).collect();
    assert_eq!(ALL_BUT_KINDS, expected.as_slice());
}

/// [`GATEWAY`] is [`EVERY_MODULE`] less the [`TOOLS`], which stand at its end.
#[test]
fn the_tools_end_the_module_list() {
    assert_eq!(&EVERY_MODULE[GATEWAY.len()..], TOOLS);
    assert!(!GATEWAY.iter().any(|m| TOOLS.contains(m)));
    // Every top-level module of the crate is in the list, so that every rule covers it.
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("read");
    let mut declared: Vec<&str> =
        lib.lines().filter_map(|l| l.strip_prefix("pub mod")?.trim().strip_suffix(';')).collect();
    let mut listed = EVERY_MODULE.to_vec();
    declared.sort_unstable();
    listed.sort_unstable();
    assert_eq!(declared, listed, "src/lib.rs's modules and EVERY_MODULE differ");
    let mut balance_may_not: Vec<&str> =
        EVERY_MODULE.iter().copied().filter(|m| *m != "kinds" && *m != "balance").collect();
    let mut all_but_kinds = ALL_BUT_KINDS.to_vec();
    balance_may_not.sort_unstable();
    all_but_kinds.sort_unstable();
    assert_eq!(balance_may_not, all_but_kinds, "ALL_BUT_KINDS is every module but kinds (and balance)");
}
