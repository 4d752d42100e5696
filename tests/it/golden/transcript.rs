//! Recording one exchange as text (the request, then the status, the headers and the body
//! exactly as the client received them) and checking a case's text against its file in
//! `tests/data/golden/`, with a readable diff when they differ.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

use super::mask::mask;
use crate::common::{Gateway, client};

/// One request a case sends.
pub struct Request {
    pub method: &'static str,
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Vec<u8>>,
}

impl Request {
    /// `POST path` with a JSON body.
    pub fn post(path: &str, body: &Value) -> Self {
        Request::post_raw(path, body.to_string().into_bytes())
    }

    /// `POST path` with `body` as it is (JSON or not), sent as `application/json`.
    pub fn post_raw(path: &str, body: Vec<u8>) -> Self {
        Request {
            method: "POST",
            path: path.to_string(),
            headers: vec![("content-type", "application/json".to_string())],
            body: Some(body),
        }
    }

    /// `GET path`.
    pub fn get(path: &str) -> Self {
        Request { method: "GET", path: path.to_string(), headers: vec![], body: None }
    }

    /// With one more request header.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }

    /// With the headers an Anthropic client sends (`anthropic-version`).
    pub fn anthropic(self) -> Self {
        self.header("anthropic-version", "2023-06-01")
    }
}

/// The recorded exchanges of one case.
#[derive(Default)]
pub struct Transcript {
    text: String,
    count: usize,
}

/// Response headers left out: the date changes every second; everything else a client can see
/// is kept.
const UNRECORDED: [&str; 1] = ["date"];

impl Transcript {
    /// Sends `request` to `gw`, records it and what came back, and returns the body text.
    pub async fn send(&mut self, gw: &Gateway, request: Request) -> String {
        self.count += 1;
        let n = self.count;
        let _ = writeln!(self.text, "### request {n}\n{} {}", request.method, request.path);
        let method = reqwest::Method::from_bytes(request.method.as_bytes()).expect("method");
        let mut builder = client().request(method, gw.url(&request.path));
        for (name, value) in &request.headers {
            let _ = writeln!(self.text, "{name}: {value}");
            builder = builder.header(*name, value);
        }
        if let Some(body) = &request.body {
            let _ = writeln!(self.text, "\n{}", String::from_utf8_lossy(body));
            builder = builder.body(body.clone());
        }
        let mut response = builder.send().await.expect("the gateway answers");
        let _ = writeln!(self.text, "### response {n}\n{:?} {}", response.version(), response.status().as_u16());
        let headers = response.headers().clone();
        let mut body = Vec::new();
        let ended = loop {
            match tokio::time::timeout(crate::common::PATIENCE, response.chunk()).await {
                Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
                Ok(Ok(None)) => break "### end",
                Ok(Err(_)) => break "### end: the body broke off (not a clean end of the message)",
                Err(_) => panic!("no end of the body within {:?}: {}", crate::common::PATIENCE, self.text),
            }
        };
        let mut names: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        for name in names.into_iter().filter(|n| !UNRECORDED.contains(n)) {
            for value in headers.get_all(name) {
                let value = String::from_utf8_lossy(value.as_bytes());
                // A length the body has is said so: the body is compared byte for byte, and
                // its length moves with what the masks hide (a time in a message).
                let value = if name == "content-length" && value == body.len().to_string() {
                    "<the body's length>".into()
                } else {
                    value
                };
                let _ = writeln!(self.text, "{name}: {value}");
            }
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        let _ = write!(self.text, "\n{body}");
        if !body.ends_with('\n') {
            self.text.push_str("\n### (no newline at the end of the body)");
        }
        let _ = writeln!(self.text, "\n{ended} {n}");
        body
    }

    /// The recorded text, masked.
    pub fn masked(&self) -> String {
        mask(&self.text)
    }
}

/// The directory of the recordings.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

/// Checks case `name`'s transcript against `tests/data/golden/{name}.txt`. `GOLDEN_RECORD=1`
/// writes the file instead; a missing file is written and said so, except under `CI=true`,
/// where it fails.
pub fn check(name: &str, transcript: &Transcript) {
    let actual = transcript.masked();
    let path = golden_dir().join(format!("{name}.txt"));
    let record = std::env::var_os("GOLDEN_RECORD").is_some_and(|v| v == "1");
    if record {
        std::fs::create_dir_all(golden_dir()).expect("golden dir");
        std::fs::write(&path, &actual).expect("write the recording");
        eprintln!("GOLDEN_RECORD=1: recorded {}", path.display());
        return;
    }
    let Ok(expected) = std::fs::read_to_string(&path) else {
        let in_ci = std::env::var_os("CI").is_some_and(|v| v == "true");
        assert!(
            !in_ci,
            "no recording {} for case `{name}`: record it with GOLDEN_RECORD=1 (from the code before a change) \
             and commit it",
            path.display()
        );
        std::fs::create_dir_all(golden_dir()).expect("golden dir");
        std::fs::write(&path, &actual).expect("write the recording");
        eprintln!(
            "NOTE: no recording for case `{name}`: wrote {} (commit it); under CI=true this fails",
            path.display()
        );
        return;
    };
    if expected != actual {
        panic!(
            "case `{name}` differs from {} (- recorded, + now; GOLDEN_RECORD=1 re-records, only when the change is \
             meant):\n{}",
            path.display(),
            diff(&expected, &actual)
        );
    }
}

/// A line diff of `old` and `new` (longest common subsequence), printed as hunks with three
/// lines of context; lines end with `⏎` so that trailing whitespace shows.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.split('\n').collect();
    let b: Vec<&str> = new.split('\n').collect();
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    // The edit script: (' ', line) kept, ('-', line) removed, ('+', line) added, with the
    // line's number in the recording (or, for an added line, in the new text).
    let (mut i, mut j, mut ops) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i], i + 1));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i], i + 1));
            i += 1;
        } else {
            ops.push(('+', b[j], j + 1));
            j += 1;
        }
    }
    // Lines within three of a change are shown; a gap starts a new hunk.
    let near_change = |k: usize| ops[k.saturating_sub(3)..(k + 4).min(ops.len())].iter().any(|op| op.0 != ' ');
    let mut out = String::new();
    let mut previous: Option<usize> = None;
    for k in (0..ops.len()).filter(|&k| near_change(k)) {
        if previous.is_none_or(|p| k > p + 1) {
            let _ = writeln!(out, "@@ near line {} of the recording @@", ops[k].2);
        }
        let (sign, line, _) = ops[k];
        let _ = writeln!(out, "{sign} {line}⏎");
        if sign == '+' && k > 0 && ops[k - 1].0 == '-' {
            let _ = writeln!(out, "{}", where_they_differ(ops[k - 1].1, line));
        }
        previous = Some(k);
    }
    out
}

/// Where two lines first differ (long SSE lines differ in a few characters): the column and
/// forty characters of each from there.
fn where_they_differ(old: &str, new: &str) -> String {
    let column = old.chars().zip(new.chars()).take_while(|(a, b)| a == b).count();
    let from = |s: &str| s.chars().skip(column).take(40).collect::<String>();
    format!("  ^ from column {}: recorded «{}», now «{}»", column + 1, from(old), from(new))
}

#[cfg(test)]
mod tests {
    use super::diff;

    #[test]
    fn the_diff_shows_removed_and_added_lines_with_context() {
        let d = diff("a\nb\nc\nd\ne\nf\ng\nh", "a\nb\nc\nd\nE\nf\ng\nh");
        assert_eq!(
            d,
            "@@ near line 2 of the recording @@\n  b⏎\n  c⏎\n  d⏎\n- e⏎\n+ E⏎\n  ^ from column 1: recorded «e», now «E»\n  \
             f⏎\n  g⏎\n  h⏎\n"
        );
    }

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(diff("a\nb", "a\nb"), "");
    }
}
