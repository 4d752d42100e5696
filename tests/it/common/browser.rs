//! A headless Chromium for the tests, driven through its chromedriver (W3C WebDriver, with the
//! `fantoccini` client): Debian's `chromium` and `chromium-driver` (`scripts/setup-system`).
//!
//! chromedriver runs in a process group of its own, with Chromium (which it starts) inside it;
//! [`Browser::close`] ends the session (Chromium quits), then kills the group and waits until no
//! process of that group, nor any process using this browser's own profile directory, is left.
//! Dropped without `close` (a failed test), the group is killed all the same.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use super::{PATIENCE, free_port};

/// How often a wait reads the page again.
const POLL: Duration = Duration::from_millis(200);

/// A running headless Chromium with its WebDriver session.
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    /// chromedriver was reaped: its pid, the group's id, may be another process's now.
    reaped: bool,
    /// Chromium's profile (`--user-data-dir`): every browser process names it on its command line.
    profile: tempfile::TempDir,
}

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name))).find(|p| p.is_file())
}

/// A headless Chromium, or `None` (with the reason printed) when chromium or chromedriver is
/// not installed here. Under `CI=true` a missing browser fails the test instead: CI installs it
/// (`scripts/setup-system`).
pub async fn browser() -> Option<Browser> {
    let driver = on_path(&["chromedriver"]);
    let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"]);
    let (Some(driver), Some(_)) = (&driver, &chromium) else {
        let why = format!(
            "no {} on PATH: run scripts/setup-system as root (Debian's chromium and chromium-driver)",
            if driver.is_none() { "chromedriver" } else { "chromium" }
        );
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "this test needs a browser: {why}");
        eprintln!("SKIPPED: {why}");
        return None;
    };
    Some(Browser::start(driver).await)
}

impl Browser {
    async fn start(driver: &std::path::Path) -> Browser {
        use std::os::unix::process::CommandExt;
        let profile = tempfile::tempdir().expect("profile dir");
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut browser = Browser { client: None, driver: child, reaped: false, profile };
        let url = format!("http://127.0.0.1:{port}");
        let status = super::client();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let ready = status.get(format!("{url}/status")).send().await.ok();
            let ready = match ready {
                Some(r) => r.json::<Value>().await.is_ok_and(|v| v["value"]["ready"] == true),
                None => false,
            };
            if ready {
                break;
            }
            let exited = browser.driver.try_wait().expect("chromedriver status");
            browser.reaped = exited.is_some();
            assert!(exited.is_none(), "chromedriver exited at start: {exited:?}");
            assert!(tokio::time::Instant::now() < deadline, "chromedriver never became ready on {url}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let options = json!({
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                "--disable-dev-shm-usage", "--disable-breakpad", "--no-first-run",
                format!("--user-data-dir={}", browser.profile.path().display()),
            ],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&url)
            .await
            .expect("a WebDriver session");
        browser.client = Some(client);
        browser
    }

    /// The WebDriver client.
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("an open session")
    }

    pub async fn goto(&self, url: &str) {
        self.client().goto(url).await.unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// The rendered (visible) text of the first element matching `css`, `None` when there is none.
    pub async fn text(&self, css: &str) -> Option<String> {
        let element = self.client().find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    /// The rendered texts of every element matching `css`.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let Ok(elements) = self.client().find_all(Locator::Css(css)).await else { return vec![] };
        let mut out = Vec::with_capacity(elements.len());
        for element in elements {
            // An element replaced between the find and the read is skipped, not an error.
            if let Ok(text) = element.text().await {
                out.push(text);
            }
        }
        out
    }

    /// An attribute of the first element matching `css`.
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        let element = self.client().find(Locator::Css(css)).await.ok()?;
        element.attr(name).await.ok().flatten()
    }

    /// Waits (reading the page every 200 ms, at most [`PATIENCE`]) until the text of the first
    /// element matching `css` passes `ok`; returns it. A wait, not a timing assertion: the
    /// failure message says what the page showed last.
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut last = None;
        loop {
            let text = self.text(css).await;
            if let Some(text) = &text
                && ok(text)
            {
                return text.clone();
            }
            last = text.or(last);
            if tokio::time::Instant::now() >= deadline {
                panic!("timed out waiting for {what} ({css}); the page showed last: {last:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits as [`Browser::wait_text`] until `check` (any reading of the page) returns `Some`.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(found) = check().await {
                return found;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Clicks the first element matching `css` (waiting for it to exist).
    pub async fn click(&self, css: &str) {
        let element = self
            .wait_for(&format!("{css} to click"), || async { self.client().find(Locator::Css(css)).await.ok() })
            .await;
        element.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the first element matching `css` (after clearing it).
    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.client().find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        element.clear().await.unwrap_or_else(|e| panic!("clear {css}: {e}"));
        element.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Runs `script` in the page (its `arguments` are `args`) and returns its value.
    pub async fn script(&self, script: &str, args: Vec<Value>) -> Value {
        self.client().execute(script, args).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// A PNG of the window, written to `target/ui-screenshots/NAME.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        self.save_screenshot(name, false).await
    }

    /// As [`Browser::screenshot`], and, when `MLXGATE_UPDATE_SCREENSHOTS=1`, to
    /// `docs/ui/NAME.png` too (the pictures docs/ui.md and the README show).
    pub async fn screenshot_for_docs(&self, name: &str) -> PathBuf {
        self.save_screenshot(name, std::env::var_os("MLXGATE_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1")).await
    }

    async fn save_screenshot(&self, name: &str, docs: bool) -> PathBuf {
        let png = self.client().screenshot().await.unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let root = std::path::Path::new(super::ROOT);
        let mut dirs = vec![root.join("target/ui-screenshots")];
        if docs {
            dirs.push(root.join("docs/ui"));
        }
        for dir in &dirs {
            std::fs::create_dir_all(dir).expect("screenshot dir");
            std::fs::write(dir.join(format!("{name}.png")), &png).expect("write screenshot");
        }
        dirs[0].join(format!("{name}.png"))
    }

    /// The pids of live processes of this browser: chromedriver's process group (Chromium and
    /// its children are in it; until chromedriver is reaped) and any process naming this
    /// browser's profile directory.
    pub fn processes(&self) -> Vec<u32> {
        let group = self.driver.id();
        let profile = self.profile.path().display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| {
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
                let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
                let state = fields.next().unwrap_or("Z");
                let pgrp: u32 = fields.nth(1).and_then(|g| g.parse().ok()).unwrap_or(0);
                if matches!(state, "Z" | "X") {
                    return false;
                }
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                (pgrp == group && !self.reaped) || String::from_utf8_lossy(&cmdline).contains(&profile)
            })
            .collect()
    }

    /// Ends the session (Chromium quits), kills chromedriver's process group, and checks that no
    /// process of this browser is left.
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            // Bounded: a browser that hangs on quit is killed below all the same.
            let _ = tokio::time::timeout(Duration::from_secs(10), client.close()).await;
        }
        self.kill_all();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let left = self.processes();
            if left.is_empty() {
                break;
            }
            let described: Vec<String> = left.iter().map(|p| super::describe_process(*p)).collect();
            assert!(tokio::time::Instant::now() < deadline, "browser processes left behind:\n{}", described.join("\n"));
            self.kill_all();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.reap();
    }

    /// SIGKILL to chromedriver's group (Chromium's processes are in it) and to any process that
    /// left the group but uses this browser's profile. chromedriver is not reaped here: until it
    /// is, its pid — the group's id — cannot be another process's, so no stranger is signalled.
    fn kill_all(&mut self) {
        if !self.reaped {
            // Refused by kill_group once chromedriver is dead: its group's rest is killed by pid.
            super::kill_group(self.driver.id());
            let _ = self.driver.kill();
        }
        for pid in self.processes() {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }

    /// Reaps chromedriver (after [`Browser::kill_all`]).
    fn reap(&mut self) {
        if !self.reaped {
            let _ = self.driver.wait();
            self.reaped = true;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // After close() this finds nothing left; after a failed test it is the clean-up.
        self.client.take();
        self.kill_all();
        self.reap();
    }
}
