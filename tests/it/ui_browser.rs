//! The /ui page in a real browser (headless Chromium through chromedriver,
//! `common::browser`): a gateway with a managed real `mlx_lm.server` and a simulator backend,
//! agent-like traffic, a kill -9, a restart button and the playground — each read from the
//! rendered page (element text through WebDriver), not from the JSON. Screenshots of each view
//! go to `target/ui-screenshots/` (and `docs/ui/` with `MLXGATE_UPDATE_SCREENSHOTS=1`).

use base64::Engine as _;

use crate::common::browser::browser;

/// A page as a `data:` URL.
fn data_url(html: &str) -> String {
    format!("data:text/html;base64,{}", base64::engine::general_purpose::STANDARD.encode(html))
}

#[tokio::test]
async fn the_harness_reads_clicks_waits_and_leaves_no_browser_process_behind() {
    let Some(browser) = browser().await else { return };
    let page = data_url(
        "<!doctype html><body><p id=t>before</p>\
         <button id=b onclick=\"document.getElementById('t').textContent='clicked'\">go</button>\
         <input id=i><p id=later></p><p id=h hidden>secret</p>\
         <script>setTimeout(() => document.getElementById('later').textContent = 'later', 300)</script></body>",
    );
    browser.goto(&page).await;
    assert_eq!(browser.text("#t").await.as_deref(), Some("before"));
    browser.click("#b").await;
    assert_eq!(browser.text("#t").await.as_deref(), Some("clicked"));
    assert_eq!(browser.wait_text("#later", "the timer's text", |t| t == "later").await, "later");
    // WebDriver's text is what is rendered: a hidden element reads as empty (the UI test reads
    // a view's cells only while that view is shown).
    assert_eq!(browser.text("#h").await.as_deref(), Some(""));
    assert_eq!(browser.text("#missing").await, None);
    browser.type_into("#i", "typed").await;
    assert_eq!(browser.script("return document.getElementById('i').value", vec![]).await, "typed");
    let png = browser.client().screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let alive = browser.processes();
    assert!(alive.len() >= 2, "chromedriver and chromium run: {alive:?}");
    let pids = alive.clone();
    browser.close().await;
    let left: Vec<u32> = pids.into_iter().filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists()).collect();
    // A pid may be reused by another process at once; a browser's own is never left.
    for pid in left {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(!cmdline.contains("chrom"), "left behind: {}", crate::common::describe_process(pid));
    }
}
