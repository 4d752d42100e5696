//! The /ui page in a real browser (headless Chromium through chromedriver,
//! `common::browser`): a gateway with a managed real `mlx_lm.server` and a simulator backend,
//! agent-like traffic, a kill -9, a restart button and the playground — each read from the
//! rendered page (element text through WebDriver), not from the JSON. Screenshots of each view
//! go to `target/ui-screenshots/` (and `docs/ui/` with `MLXGATE_UPDATE_SCREENSHOTS=1`).

use base64::Engine as _;
use fantoccini::Locator;
use serde_json::{Value, json};

use crate::common::browser::{Browser, browser};
use crate::common::*;

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

// ---- The page on a live gateway ----

/// The real server's backend and its model; the simulator's.
const NATIVE: &str = "native";
const QWEN: &str = "qwen";
const SIM_BACKEND: &str = "sim";
const HAIKU: &str = "haiku";
/// Two agents' keys (`clients:`): the traffic is theirs, and the playground types one.
const AIDER_KEY: &str = "sk-aider-5b0e2c9d71f84a36";
const CLAUDE_KEY: &str = "sk-claude-e17c4a90b3d25f68";

fn sha256_hex(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `css` of backend `name`'s cell `testid` on the Now view.
fn backend_cell(name: &str, testid: &str) -> String {
    format!("[data-testid=backend-row][data-backend=\"{name}\"] [data-testid={testid}]")
}

/// Records, in the page, every text the state cell of backend `name` shows (a MutationObserver:
/// a state shown for less than a poll is not missed); [`states_seen`] reads them.
async fn record_states(browser: &Browser, name: &str) {
    let script = "const name = arguments[0];
        window.__states = window.__states || {};
        const seen = window.__states[name] = [];
        const read = () => {
          const n = document.querySelector(`[data-testid=backend-row][data-backend=\"${name}\"] [data-testid=backend-state]`);
          return n ? n.textContent : null;
        };
        const note = () => { const t = read(); if (t !== null && seen[seen.length - 1] !== t) seen.push(t); };
        note();
        if (window.__observer) window.__observer.disconnect();
        window.__observer = new MutationObserver(note);
        window.__observer.observe(document.body, {subtree: true, childList: true, characterData: true});
        return seen.length;";
    browser.script(script, vec![json!(name)]).await;
}

async fn states_seen(browser: &Browser, name: &str) -> Vec<String> {
    let seen = browser.script("return (window.__states || {})[arguments[0]] || []", vec![json!(name)]).await;
    seen.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// Waits until backend `name`'s state cell has left `ready` and shown it again; the states it
/// showed on the way.
async fn wait_for_a_round_trip(browser: &Browser, name: &str, why: &str) -> Vec<String> {
    browser
        .wait_for(&format!("{name} to leave ready and come back ({why})"), || async {
            let seen = states_seen(browser, name).await;
            let left = seen.iter().position(|s| s != "ready")?;
            let back = seen[left..].iter().any(|s| s == "ready");
            let shown = browser.text(&backend_cell(name, "backend-state")).await?;
            (back && shown == "ready").then_some(seen)
        })
        .await
}

/// Shows a view by clicking its tab, and checks only it is shown.
async fn show(browser: &Browser, view: &str) {
    browser.click(&format!("[data-testid=tab-{view}]")).await;
    for other in ["now", "activity", "logs", "playground"] {
        let hidden = browser.attr(&format!("[data-testid=view-{other}]"), "hidden").await;
        let displayed = browser
            .client()
            .find(Locator::Css(&format!("[data-testid=view-{other}]")))
            .await
            .expect("view")
            .is_displayed()
            .await
            .expect("displayed");
        assert_eq!(displayed, other == view, "view {other} after clicking tab-{view} (hidden={hidden:?})");
    }
}

/// Sets the activity filter's text as a user types it (every keystroke an `input` event).
async fn filter_activity(browser: &Browser, text: &str) {
    let input = browser.client().find(Locator::Css("[data-testid=activity-filter]")).await.expect("filter");
    input.clear().await.expect("clear");
    // A key then Backspace: an input event with an empty value (clear() alone sends none).
    input.send_keys(&format!(" \u{E003}{text}")).await.expect("type");
}

/// The texts of the visible activity rows' `field` cells, top to bottom (hidden rows read as empty).
async fn visible_column(browser: &Browser, field: &str) -> Vec<String> {
    browser
        .texts(&format!("tr[data-testid=activity-row] td[data-field={field}]"))
        .await
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect()
}

/// One request of the traffic: who sent it, to which model and face, and its id.
struct Sent {
    id: String,
    model: &'static str,
    backend: &'static str,
    face: &'static str,
    client: &'static str,
}

/// Sends `body` to `path` with `key`; checks a complete 200 answer; its `x-request-id`.
async fn send(gw: &Gateway, path: &str, key: &str, body: Value) -> String {
    let r = client().post(gw.url(path)).bearer_auth(key).json(&body).send().await.expect("send");
    let status = r.status();
    let id = r.headers().get("x-request-id").expect("x-request-id").to_str().expect("ascii").to_string();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{path}: {text}");
    if body["stream"] == true && path == "/v1/chat/completions" {
        assert!(text.contains("data: [DONE]"), "{text}");
    }
    id
}

/// Agent-like traffic to both models: streamed chats at once (an agent's parallel calls), then a
/// Responses and a Messages request (Codex's and Claude Code's faces), in that order.
async fn traffic(gw: &Gateway) -> Vec<Sent> {
    let chat = |model: &str, n: usize| {
        json!({"model": model, "stream": true, "max_tokens": 12, "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "You are a coding agent."},
                         {"role": "user", "content": format!("step {n}: list the files")}]})
    };
    let mut sent = vec![];
    for (model, backend) in [(QWEN, NATIVE), (HAIKU, SIM_BACKEND)] {
        let ids = futures_util::future::join_all(
            (0..3).map(|n| send(gw, "/v1/chat/completions", AIDER_KEY, chat(model, n))).collect::<Vec<_>>(),
        )
        .await;
        sent.extend(ids.into_iter().map(|id| Sent { id, model, backend, face: "chat", client: "aider" }));
    }
    for (model, backend) in [(QWEN, NATIVE), (HAIKU, SIM_BACKEND)] {
        let id =
            send(gw, "/v1/responses", AIDER_KEY, json!({"model": model, "input": "say hi", "max_output_tokens": 12}))
                .await;
        sent.push(Sent { id, model, backend, face: "responses", client: "aider" });
    }
    for (model, backend) in [(QWEN, NATIVE), (HAIKU, SIM_BACKEND)] {
        let body = json!({"model": model, "max_tokens": 12, "stream": true,
            "messages": [{"role": "user", "content": "read README.md"}]});
        let id = send(gw, "/v1/messages", CLAUDE_KEY, body).await;
        sent.push(Sent { id, model, backend, face: "messages", client: "claude" });
    }
    sent
}

async fn pid_of(gw: &Gateway, name: &str) -> u64 {
    let state = backend_state(gw, name).await;
    state["pid"].as_u64().unwrap_or_else(|| panic!("{name} has a pid: {state}"))
}

#[tokio::test]
async fn the_page_shows_traffic_a_crash_and_its_restart_a_restart_button_and_the_playground() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let Some(browser) = browser().await else { return };
    let (_sim, sim_url) = spawn_sim(&[]);
    let port = free_port();
    let backends = [
        backend(NATIVE, "mlx-lm", &model, port, ""),
        format!("  {SIM_BACKEND}:\n    url: '{sim_url}'\n    max_concurrency: 4\n"),
    ];
    let clients = format!(
        "clients:\n  aider: {{key_sha256: {}}}\n  claude: {{key_sha256: {}}}\n",
        sha256_hex(AIDER_KEY),
        sha256_hex(CLAUDE_KEY)
    );
    let yaml = format!("{}{clients}", config(&backends, &[(QWEN, NATIVE), (HAIKU, SIM_BACKEND)], ""));
    let gw = gateway(&yaml).await;

    // Loopback and no admin key: the page itself, live.
    browser.goto(&gw.url("/ui")).await;
    assert_eq!(browser.attr("body", "data-auth").await.as_deref(), Some("ok"));
    browser.wait_text("[data-testid=live]", "the live feed", |t| t == "live").await;
    show(&browser, "now").await;
    browser.wait_text(&backend_cell(NATIVE, "backend-state"), "the real server, not started", |t| t == "stopped").await;
    browser.wait_text(&backend_cell(SIM_BACKEND, "backend-state"), "the simulator", |t| t == "remote").await;
    for name in [QWEN, HAIKU] {
        let row = format!("[data-testid=model-row][data-model=\"{name}\"] [data-testid=model-in-flight]");
        browser.wait_text(&row, &format!("model {name}'s row"), |t| t == "0").await;
    }

    // Traffic: the real server starts on its first request.
    let sent = traffic(&gw).await;
    browser.wait_text(&backend_cell(NATIVE, "backend-state"), "the real server ready", |t| t == "ready").await;
    browser.wait_text(&backend_cell(NATIVE, "backend-gpu"), "the real server holds the GPU", |t| t == "GPU").await;
    assert_eq!(browser.text(&backend_cell(SIM_BACKEND, "backend-gpu")).await.as_deref(), Some(""));
    assert_eq!(browser.text(&backend_cell(NATIVE, "backend-restarts")).await.as_deref(), Some("0"));
    for client in ["aider", "claude"] {
        let row = format!("[data-testid=client-row][data-client=\"{client}\"] [data-testid=client-in-flight]");
        browser.wait_text(&row, &format!("client {client}'s row"), |t| t == "0").await;
    }

    // Activity: a row per request, with its model, backend, client, face and status.
    show(&browser, "activity").await;
    for s in &sent {
        let row = format!("tr[data-testid=activity-row][data-request-id=\"{}\"]", s.id);
        browser.wait_text(&format!("{row} td[data-field=status]"), &format!("{}'s row", s.id), |t| t == "200").await;
        for (field, want) in [("id", s.id.as_str()), ("model", s.model), ("backend", s.backend), ("client", s.client)] {
            assert_eq!(browser.text(&format!("{row} td[data-field={field}]")).await.as_deref(), Some(want), "{field}");
        }
        assert_eq!(browser.text(&format!("{row} td[data-field=face]")).await.as_deref(), Some(s.face), "face");
        assert_eq!(browser.text(&format!("{row} td[data-field=outcome]")).await.as_deref(), Some("ok"), "{}", s.id);
        let ttft = browser.text(&format!("{row} td[data-field=ttft_ms]")).await.unwrap_or_default();
        assert!(!ttft.is_empty(), "{}: a TTFT cell", s.id);
    }
    // Newest first: the Messages requests (sent last) above the Responses ones, above the chats.
    let order = visible_column(&browser, "id").await;
    let position = |id: &str| order.iter().position(|o| o == id).unwrap_or_else(|| panic!("{id} in {order:?}"));
    let (chats, rest) = sent.split_at(6);
    assert!(position(&rest[3].id) < position(&rest[1].id), "newest first: {order:?}");
    assert!(rest.iter().all(|r| chats.iter().all(|c| position(&r.id) < position(&c.id))), "newest first: {order:?}");
    // The filter: only the real server's rows.
    let native = sent.iter().filter(|s| s.backend == NATIVE).count();
    filter_activity(&browser, NATIVE).await;
    browser
        .wait_for("the filter to keep the real server's rows", || async {
            let shown = visible_column(&browser, "backend").await;
            (shown.len() == native && shown.iter().all(|b| b == NATIVE)).then_some(())
        })
        .await;
    filter_activity(&browser, "").await;
    browser
        .wait_for("every row again", || async {
            (visible_column(&browser, "id").await.len() == sent.len()).then_some(())
        })
        .await;
    browser.screenshot_for_docs("activity").await;
    // A row's details: its fields, and no body (capture is off).
    browser.click(&format!("tr[data-testid=activity-row][data-request-id=\"{}\"]", sent[0].id)).await;
    let detail = browser
        .wait_text("[data-testid=request-detail]", "the request's details", |t| t.contains("Not captured"))
        .await;
    assert!(detail.contains(&sent[0].id), "{detail}");
    browser.screenshot("request-detail").await;

    // kill -9 the real server: its state cell goes ready → restarting/starting → ready.
    show(&browser, "now").await;
    let pid = pid_of(&gw, NATIVE).await;
    record_states(&browser, NATIVE).await;
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let seen = wait_for_a_round_trip(&browser, NATIVE, "after kill -9").await;
    assert!(seen.iter().any(|s| s == "restarting" || s == "starting"), "states shown: {seen:?}");
    browser.wait_text(&backend_cell(NATIVE, "backend-restarts"), "the restart counted", |t| t == "1").await;
    let restarted = pid_of(&gw, NATIVE).await;
    assert_ne!(restarted, pid, "a new process");

    // Logs: the real server's output, with its exit and the new start marked.
    show(&browser, "logs").await;
    let select = browser.client().find(Locator::Css("select[data-testid=log-backend]")).await.expect("select");
    select.select_by_value(NATIVE).await.expect("the real server's log");
    let marks = browser
        .wait_for("the restart marked in the log", || async {
            let lines = browser.client().find_all(Locator::Css("[data-testid=log-line][data-mark]")).await.ok()?;
            let mut marks = vec![];
            for line in lines {
                marks.push((line.attr("data-mark").await.ok()??, line.text().await.ok()?));
            }
            let exit = marks.iter().position(|(m, _)| m == "exit")?;
            marks[exit..].iter().any(|(m, _)| m == "start").then_some(marks)
        })
        .await;
    assert!(marks.iter().take_while(|(m, _)| m != "exit").any(|(m, _)| m == "start"), "the first start: {marks:?}");
    let plain = browser.texts("[data-testid=log-line]:not([data-mark])").await;
    assert!(plain.iter().any(|t| !t.trim().is_empty()), "the server's own output is shown");
    // Scrolled to the newest line (the user has not scrolled up).
    browser
        .wait_for("the log scrolled to its newest line", || async {
            let last = browser
                .script(
                    "const lines = document.querySelectorAll('[data-testid=log-line]');
                     const last = lines[lines.length - 1];
                     if (!last) return false;
                     const box = last.parentElement.getBoundingClientRect();
                     const r = last.getBoundingClientRect();
                     return r.bottom <= box.bottom + 2 && r.top >= box.top - 2;",
                    vec![],
                )
                .await;
            (last == true).then_some(())
        })
        .await;
    browser.screenshot_for_docs("logs").await;

    // The restart button: the state leaves ready and comes back, with a new process.
    show(&browser, "now").await;
    record_states(&browser, NATIVE).await;
    browser.click(&format!("button[data-action=restart][data-backend=\"{NATIVE}\"]")).await;
    let answer = browser.wait_text("[data-testid=action-result]", "the restart's answer", |t| t.contains("→")).await;
    assert!(answer.starts_with(&format!("restart {NATIVE}")), "{answer}");
    let seen = wait_for_a_round_trip(&browser, NATIVE, "after the restart button").await;
    assert_ne!(pid_of(&gw, NATIVE).await, restarted, "a new process after the button; states shown: {seen:?}");

    // The playground streams an answer from the real server, with a client's key typed in.
    show(&browser, "playground").await;
    let select = browser.client().find(Locator::Css("select[data-testid=pg-model]")).await.expect("select");
    select.select_by_value(QWEN).await.expect("the model");
    // Without a key (auth is required): the refusal's message in the status.
    browser.type_into("[data-testid=pg-input]", "Write one short sentence about the sea.").await;
    browser.click("[data-testid=pg-send]").await;
    let refused =
        browser.wait_text("[data-testid=pg-status]", "the refusal", |t| t == "done" || t.starts_with("error")).await;
    assert!(refused.starts_with("error: ") && refused.contains("API key"), "{refused}");
    browser.type_into("[data-testid=pg-key]", AIDER_KEY).await;
    browser.click("[data-testid=pg-send]").await;
    let status = browser
        .wait_text("[data-testid=pg-status]", "the answer's end", |t| t == "done" || t.starts_with("error"))
        .await;
    assert_eq!(status, "done");
    let output = browser.text("[data-testid=pg-output]").await.unwrap_or_default();
    assert!(!output.trim().is_empty(), "the answer's text is shown");
    let ttft = browser.text("[data-testid=pg-ttft]").await.unwrap_or_default();
    assert!(ttft.strip_suffix(" ms").is_some_and(|n| n.parse::<u64>().is_ok()), "TTFT: {ttft:?}");
    let tps = browser.text("[data-testid=pg-tps]").await.unwrap_or_default();
    assert!(tps.strip_suffix(" tok/s").is_some_and(|n| n.parse::<f64>().is_ok()), "speed: {tps:?}");
    let id = browser.text("[data-testid=pg-request-id]").await.unwrap_or_default();
    assert!(id.starts_with("req_"), "the request id: {id:?}");
    // The client key stays in this tab's sessionStorage: never localStorage, never a cookie.
    let stored = browser
        .script("return JSON.stringify(localStorage) + document.cookie + '|' + JSON.stringify(sessionStorage)", vec![])
        .await;
    let stored = stored.as_str().unwrap_or_default();
    let (persistent, session) = stored.split_once('|').unwrap_or_default();
    assert!(!persistent.contains(AIDER_KEY) && session.contains(AIDER_KEY), "where the key is kept: {stored}");
    // The tiny model's random weights answer noise; the picture shows the simulator's words.
    select.select_by_value(HAIKU).await.expect("the other model");
    browser.click("[data-testid=pg-send]").await;
    browser
        .wait_for("the second answer", || async {
            let shown = browser.text("[data-testid=pg-request-id]").await?;
            let status = browser.text("[data-testid=pg-status]").await?;
            (shown.starts_with("req_") && shown != id && status == "done").then_some(())
        })
        .await;
    browser.screenshot_for_docs("playground").await;
    // It is an activity row like any other request, the key's client's.
    show(&browser, "activity").await;
    let row = format!("tr[data-testid=activity-row][data-request-id=\"{id}\"]");
    browser.wait_text(&format!("{row} td[data-field=model]"), "the playground's row", |t| t == QWEN).await;
    assert_eq!(browser.text(&format!("{row} td[data-field=client]")).await.as_deref(), Some("aider"));

    show(&browser, "now").await;
    browser.wait_text(&backend_cell(NATIVE, "backend-state"), "ready", |t| t == "ready").await;
    browser.screenshot_for_docs("now").await;

    // The gateway goes away: the page says so (and its EventSource keeps trying).
    let mut gw = gw;
    gw.stop();
    browser.wait_text("[data-testid=live]", "the live mark to drop", |t| t == "reconnecting").await;
    browser.close().await;
}

/// The admin key's sign-in, in the browser: the form, a wrong key's message, the right key's
/// session (an `HttpOnly` cookie the page's script cannot read) carrying the live feed, and
/// signing out.
#[tokio::test]
async fn a_browser_signs_in_with_the_admin_key_and_the_live_feed_rides_its_session() {
    const ADMIN_KEY: &str = "sk-admin-93d0b6e1f27a4c58";
    let Some(browser) = browser().await else { return };
    let sim = sim().await;
    let gw = gateway(&format!(
        "admin_key_sha256: {}\nbackends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: local}}\n",
        sha256_hex(ADMIN_KEY),
        sim.url()
    ))
    .await;
    browser.goto(&gw.url("/ui")).await;
    assert_eq!(browser.attr("body", "data-auth").await.as_deref(), Some("login"));
    let displayed = |css: &'static str| {
        let browser = &browser;
        async move {
            let element = browser.client().find(Locator::Css(css)).await.expect(css);
            element.is_displayed().await.expect("displayed")
        }
    };
    assert!(displayed("[data-testid=login-key]").await, "the sign-in form");
    assert!(!displayed("[data-testid=view-now]").await, "nothing of the gateway before signing in");

    browser.type_into("[data-testid=login-key]", "sk-admin-not-this-one").await;
    browser.click("[data-testid=login-submit]").await;
    browser.wait_text("[data-testid=login-error]", "the wrong key's message", |t| !t.is_empty()).await;
    assert_eq!(browser.attr("body", "data-auth").await.as_deref(), Some("login"));

    browser.type_into("[data-testid=login-key]", ADMIN_KEY).await;
    browser.click("[data-testid=login-submit]").await;
    browser
        .wait_for("the page after signing in", || async {
            (browser.attr("body", "data-auth").await.as_deref() == Some("ok")).then_some(())
        })
        .await;
    browser.wait_text("[data-testid=live]", "the live feed on the session", |t| t == "live").await;
    browser.wait_text(&backend_cell("local", "backend-state"), "the backend's row", |t| t == "remote").await;
    let cookies = browser.script("return document.cookie", vec![]).await;
    assert!(!cookies.as_str().unwrap_or_default().contains("mlxgate_session"), "HttpOnly: {cookies}");
    let source = browser.client().source().await.expect("source");
    assert!(!source.contains(ADMIN_KEY), "the key is nowhere in the page");

    // Signing out ends the session: the page is the sign-in form again, and stays so on reload.
    browser.click("#logout").await;
    browser
        .wait_for("the sign-in form after signing out", || async {
            (browser.attr("body", "data-auth").await.as_deref() == Some("login")).then_some(())
        })
        .await;
    browser.goto(&gw.url("/ui")).await;
    assert_eq!(browser.attr("body", "data-auth").await.as_deref(), Some("login"));
    browser.close().await;
}

/// The Now view's other buttons, in the browser, on a gateway run from a file: drain and undrain
/// (the answer shown, the button turned), and the reload box (check first: problems, or what
/// applies now and what needs a restart; Apply only after a check without problems).
#[tokio::test]
async fn the_drain_button_and_the_reload_box() {
    let Some(browser) = browser().await else { return };
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gateway.yaml");
    let write = |models: &str| {
        let partial = dir.path().join("gateway.yaml.partial");
        let text = format!("listen: 127.0.0.1:0\nbackends:\n  local: {{url: '{}'}}\nmodels:\n{models}", sim.url());
        std::fs::write(&partial, text).expect("write");
        std::fs::rename(&partial, &file).expect("rename");
    };
    write("  qwen: {backend: local}\n");
    let runtime = dir.path().display().to_string();
    let (gw, _log) = gateway_binary_at(&file, &[("XDG_RUNTIME_DIR", &runtime)]);
    browser.goto(&format!("{}/ui", gw.url)).await;
    browser.wait_text("[data-testid=live]", "the live feed", |t| t == "live").await;
    show(&browser, "now").await;

    let drain = "button[data-action=drain][data-backend=\"local\"]";
    browser.click(drain).await;
    let answer = browser.wait_text("[data-testid=action-result]", "the drain's answer", |t| t.contains("→")).await;
    assert!(answer.starts_with("drain local") && answer.contains("drained"), "{answer}");
    browser.click("button[data-action=undrain][data-backend=\"local\"]").await;
    browser
        .wait_text("[data-testid=action-result]", "the undrain's answer", |t| t.starts_with("undrain local →"))
        .await;
    browser.wait_for("the Drain button back", || async { browser.text(drain).await.filter(|t| t == "Drain") }).await;
    let state = crate::common::client()
        .get(format!("{}/admin/backends", gw.url))
        .send()
        .await
        .expect("send")
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(state["backends"][0]["drained"], false, "{state}");

    let apply_enabled = || async {
        let apply = browser.client().find(Locator::Css("[data-testid=reload-apply]")).await.expect("apply");
        apply.is_enabled().await.expect("enabled")
    };
    assert!(!apply_enabled().await, "Apply waits for a check");
    browser.click("[data-testid=reload-check]").await;
    browser.wait_text("[data-testid=reload-result]", "the check", |t| t.contains("No problems")).await;
    assert!(apply_enabled().await, "a check without problems enables Apply");

    write("  qwen: {backend: nowhere}\n");
    browser.click("[data-testid=reload-check]").await;
    let result =
        browser.wait_text("[data-testid=reload-result]", "the problem", |t| t.contains("models.qwen.backend")).await;
    assert!(!apply_enabled().await, "no Apply with a problem: {result}");

    write("  qwen: {backend: local}\n  other: {backend: local}\n");
    browser.click("[data-testid=reload-check]").await;
    let result = browser.wait_text("[data-testid=reload-result]", "the change", |t| t.contains("No problems")).await;
    assert!(result.contains("models"), "a new model needs a restart: {result}");
    browser.click("[data-testid=reload-apply]").await;
    browser.wait_text("[data-testid=reload-result]", "the answer to Apply", |t| t.contains("Applied")).await;
    browser.screenshot("reload").await;
    browser.close().await;
}

/// What a client chooses (its own `x-request-id`, kept when it is printable ASCII) is shown as
/// text: markup in it never becomes elements of the page, in the row or in the details. And a
/// burst's decode speed reads "burst".
#[tokio::test]
async fn a_clients_markup_is_shown_as_text_and_a_burst_as_burst() {
    let Some(browser) = browser().await else { return };
    let sim = sim().await;
    let gw =
        gateway(&format!("backends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: local}}\n", sim.url())).await;
    browser.goto(&gw.url("/ui")).await;
    browser.wait_text("[data-testid=live]", "the live feed", |t| t == "live").await;
    show(&browser, "activity").await;
    let hostile = "<img/src=x/onerror=window.__xss=1><b>bold</b>";
    let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
    let r = client().post(gw.url("/v1/chat/completions")).header("x-request-id", hostile).json(&body).send().await;
    let r = r.expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers().get("x-request-id").and_then(|v| v.to_str().ok()), Some(hostile), "the client's id is kept");
    let cell = "tr[data-testid=activity-row] td[data-field=id]";
    browser.wait_text(cell, "the request's row", |t| t == hostile).await;
    browser.click("tr[data-testid=activity-row]").await;
    browser.wait_text("[data-testid=request-detail]", "its details", |t| t.contains(hostile)).await;
    let injected = browser
        .script(
            "return document.querySelectorAll('#activity img, #activity b, [data-testid=request-detail] img, \
             [data-testid=request-detail] b').length + (window.__xss ? 100 : 0)",
            vec![],
        )
        .await;
    assert_eq!(injected, 0, "markup from a client became elements of the page");

    // A burst (every token in one write at the end): its speed is shown as "burst", not a number.
    let burst = json!({"model": "qwen", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "sim": {"burst": true, "tokens": 8, "tokens_per_second": 40}});
    let r = post(&gw, "/v1/chat/completions", &burst).await;
    let id = r.headers().get("x-request-id").expect("id").to_str().expect("ascii").to_string();
    assert!(text_of(r).await.contains("[DONE]"));
    let row = format!("tr[data-testid=activity-row][data-request-id=\"{id}\"]");
    browser.wait_text(&format!("{row} td[data-field=decode_tps]"), "the burst's speed", |t| t == "burst").await;
    browser.close().await;
}

/// The Now view follows the gateway live: requests in flight and queued per model (two slow
/// streams on a backend of one slot), the last swap and why (two GPU backends, one model each),
/// which backend holds the GPU, and the Stop button.
#[tokio::test]
async fn the_now_view_follows_in_flight_queued_swaps_and_the_stop_button() {
    let Some(browser) = browser().await else { return };
    const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");
    let managed = |name: &str| {
        format!(
            "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
             port: {}\n    max_concurrency: 1\n    stop_timeout: 5s\n",
            free_port()
        )
    };
    let yaml = format!(
        "swap_after: 1s\nbackends:\n{}{}models:\n  ma: {{backend: a, max_wait: 120s}}\n  mb: {{backend: b, max_wait: 120s}}\n",
        managed("a"),
        managed("b")
    );
    let gw = gateway(&yaml).await;
    browser.goto(&gw.url("/ui")).await;
    browser.wait_text("[data-testid=live]", "the live feed", |t| t == "live").await;
    show(&browser, "now").await;
    browser.wait_text("[data-testid=last-swap]", "no swap yet", |t| !t.is_empty()).await;

    // Two slow streams for `ma` on a backend of one slot: one in flight, one queued.
    let slow = json!({"model": "ma", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "sim": {"tokens": 30, "tokens_per_second": 10}});
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let (url, slow) = (gw.url("/v1/chat/completions"), slow.clone());
            tokio::spawn(async move { text_of(client().post(url).json(&slow).send().await.expect("send")).await })
        })
        .collect();
    let model = |field: &str| format!("[data-testid=model-row][data-model=\"ma\"] [data-testid={field}]");
    browser
        .wait_for("one in flight and one queued for ma", || async {
            let in_flight = browser.text(&model("model-in-flight")).await?;
            let queued = browser.text(&model("model-queued")).await?;
            (in_flight == "1" && queued == "1").then_some(())
        })
        .await;
    for stream in streams {
        assert!(stream.await.expect("stream").contains("[DONE]"));
    }
    browser
        .wait_for("nothing in flight or queued", || async {
            let in_flight = browser.text(&model("model-in-flight")).await?;
            let queued = browser.text(&model("model-queued")).await?;
            (in_flight == "0" && queued == "0").then_some(())
        })
        .await;
    browser.wait_text(&backend_cell("a", "backend-gpu"), "a holds the GPU", |t| t == "GPU").await;

    // `mb` swaps a out for b: the last swap names both and why.
    let quick = json!({"model": "mb", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&gw, "/v1/chat/completions", &quick).await.status(), 200);
    let swap = browser
        .wait_text("[data-testid=last-swap]", "the swap", |t| t.contains('a') && t.contains('b') && t.contains('→'))
        .await;
    assert!(["no_work", "due"].iter().any(|r| swap.contains(r)), "the reason: {swap}");
    browser.wait_text(&backend_cell("b", "backend-gpu"), "b holds the GPU", |t| t == "GPU").await;
    browser.wait_text(&backend_cell("a", "backend-state"), "a stopped", |t| t == "stopped").await;
    assert_eq!(browser.text(&backend_cell("a", "backend-gpu")).await.as_deref(), Some(""));

    // Stop: b stops, and its Stop button is disabled while it is stopped.
    let stop = "button[data-action=stop][data-backend=\"b\"]";
    browser.click(stop).await;
    browser.wait_text("[data-testid=action-result]", "the stop's answer", |t| t.starts_with("stop b →")).await;
    browser.wait_text(&backend_cell("b", "backend-state"), "b stopped", |t| t == "stopped").await;
    let button = browser.client().find(Locator::Css(stop)).await.expect("stop button");
    browser.wait_for("the Stop button disabled", || async { (!button.is_enabled().await.ok()?).then_some(()) }).await;
    browser.wait_text("[data-testid=last-swap]", "the stop noted", |t| t.contains("admin")).await;
    browser.close().await;
}
