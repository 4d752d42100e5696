//! The documentation against the code: every whole configuration shown in README.md and
//! `docs/*.md` passes `mlxgate check`, every relative link (and its `#anchor`) in them and in
//! ARCHITECTURE.md names something that exists, and docs/metrics.md names every metric the
//! gateway declares.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLXGATE: &str = env!("CARGO_BIN_EXE_mlxgate");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md, ARCHITECTURE.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ has pages");
    pages.extend(docs);
    pages
}

/// A fenced code block: its info string (`yaml`, `yaml fragment`, …), its text with the fence's
/// indentation removed, and the line it starts on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

/// The fenced blocks of a Markdown page (``` fences, indented or not), and the lines outside them.
fn split(markdown: &str) -> (Vec<Block>, Vec<(usize, String)>) {
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut open: Option<(usize, Block)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match open.take() {
            None if trimmed.starts_with("```") => {
                let block = Block { info: trimmed[3..].trim().to_string(), text: String::new(), line: n + 1 };
                open = Some((indent, block));
            }
            None => prose.push((n + 1, line.to_string())),
            Some((_, block)) if trimmed.starts_with("```") => blocks.push(block),
            Some((fence_indent, mut block)) => {
                let cut = line.len() - line.trim_start().len();
                block.text.push_str(&line[cut.min(fence_indent)..]);
                block.text.push('\n');
                open = Some((fence_indent, block));
            }
        }
    }
    assert!(open.is_none(), "an unclosed code fence");
    (blocks, prose)
}

/// A whole gateway configuration, not a part of one: it names backends or models at the top.
fn is_whole_config(block: &Block) -> bool {
    let words: Vec<&str> = block.info.split_whitespace().collect();
    words.first() == Some(&"yaml")
        && !words.contains(&"fragment")
        && block.text.lines().any(|l| l.starts_with("backends:") || l.starts_with("models:"))
}

#[test]
fn every_whole_config_in_the_docs_passes_mlxgate_check() {
    let mut checked = 0;
    for page in pages() {
        let markdown = std::fs::read_to_string(&page).expect("read page");
        for block in split(&markdown).0.iter().filter(|b| is_whole_config(b)) {
            // Written beside gateway.yaml, so that its relative paths (`.venv-mlx-lm`,
            // `.cache/tiny-qwen3`) mean what they mean in the shipped file.
            let mut file =
                tempfile::Builder::new().prefix(".docs-check-").suffix(".yaml").tempfile_in(ROOT).expect("temp file");
            std::io::Write::write_all(&mut file, block.text.as_bytes()).expect("write");
            let out = Command::new(MLXGATE).arg("check").arg("--config").arg(file.path()).output().expect("run check");
            assert!(
                out.status.success(),
                "{}:{}: `mlxgate check` refuses this configuration (mark a part of one ```yaml fragment):\n{}{}",
                page.display(),
                block.line,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    println!("{checked} configurations checked");
    assert!(checked > 0, "no whole configuration found in the docs: the test would prove nothing");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings, the numbered ones GitHub gives repeated headings included.
fn anchors(markdown: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in split(markdown).1 {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let text = heading.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let base = anchor(text);
        let mut name = base.clone();
        let mut n = 0;
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    seen
}

/// Every `[text](target)` in a page's prose, with its line.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in split(markdown).1 {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            found.push((n, rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_in_the_docs_names_a_file_and_anchor_that_exist() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let markdown = std::fs::read_to_string(&page).expect("read page");
        for (line, target) in links(&markdown) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').map_or((target.as_str(), None), |(p, f)| (p, Some(f)));
            let file = if path.is_empty() { page.clone() } else { page.parent().expect("dir").join(path) };
            if !file.exists() {
                broken.push(format!("{}:{line}: {target}: no such file", page.display()));
                continue;
            }
            if let Some(fragment) = fragment.filter(|_| file.extension().is_some_and(|e| e == "md")) {
                let text = std::fs::read_to_string(&file).expect("read target");
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{}:{line}: {target}: no heading with that anchor", page.display()));
                }
            }
        }
    }
    println!("{checked} relative links checked");
    assert!(checked > 0, "no relative link found: the test would prove nothing");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn docs_metrics_md_names_every_metric_the_gateway_declares() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/metrics.md")).expect("docs/metrics.md");
    let metrics = mlxgate::metrics::Metrics::new();
    let declared = metrics.family_names();
    assert!(declared.len() > 20, "{declared:?}");
    let missing: Vec<&String> = declared.iter().filter(|name| !page.contains(&format!("`{name}"))).collect();
    assert!(missing.is_empty(), "declared in src/metrics.rs, not in docs/metrics.md: {missing:?}");
}
