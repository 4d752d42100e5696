//! Issue 22's review (branch issue22-rev): schedules that break the swap costing, with
//! `mlxgate-sim` as the GPU servers (as `swap_budget.rs`).

use crate::common::*;
use serde_json::json;

use crate::swap_budget::{ask, slow_sim, yaml};

/// Finding 1 of the review, as it first stood: one generation far longer than the backend's
/// usual answers (held until released) is in flight when the `max_wait` swap comes; the drain
/// allowance (twice the mean answer and a second) does not cover it, and the minority request
/// misses its `max_wait`. Still open: the estimate cannot know one answer's length; the drain
/// is bounded by `drain_timeout`, and a cut of the long answer would keep the bound at its cost.
#[tokio::test]
#[ignore = "issue 22 review, finding 1 (open): one answer far longer than its backend's mean, in flight at the max_wait swap, still makes the minority request miss max_wait (the drain estimate is a mean)"]
async fn one_answer_far_longer_than_its_backends_mean_can_still_cost_the_next_ones_max_wait() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  ma: {backend: a, max_wait: 120s}\n  mb: {backend: b, max_wait: 8s}\n";
    // A long residency (99× the round trip's starts): only the max_wait rule swaps b in.
    let top = "swap_after: 1s\nloading_share: 0.01\n";
    let backends = [slow_sim("a", pa, 0, "    drain_timeout: 30s\n"), slow_sim("b", pb, 1, "")];
    let gw = gateway(&yaml(top, &backends, models)).await;
    for model in ["mb", "ma"] {
        let r = post(&gw, "/v1/chat/completions", &ask(model, json!({"tokens": 2}))).await;
        assert_eq!(r.status(), 200, "{model}: each starts once, its start measured");
    }
    // a generates a long answer for an agent (held until released).
    let held = held_stream(&gw, "ma", "h").await;
    let waiting = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&ask("mb", json!({"tokens": 2}))).send().await.expect("send").status() }
    });
    eventually("a is drained for b", || async { backend_state(&gw, "a").await["state"] == "draining" }).await;
    let reason = "mlxgate_backend_swaps_total{backend=\"a\",reason=\"max_wait\"}";
    assert_eq!(metric(&gw, reason).await, Some(1.0), "the max_wait rule swapped a out");
    // The generation in flight goes on a few seconds more (well within a's drain_timeout).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    client().post(format!("http://127.0.0.1:{pa}/sim/release/h")).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    assert_eq!(
        waiting.await.expect("task"),
        200,
        "mb's request waited for a's drain after the max_wait swap, then b's start: over its 8 s max_wait"
    );
}

/// Finding 1 of the review: the `max_wait` rule swapped at the last moment that left the next
/// backend its start time, but the running backend drains first (its requests in flight go
/// on): agents keeping `a` busy with 2-second answers made the minority request miss the
/// `max_wait` the rule was there to keep. The rule now leaves room for the drain (twice `a`'s
/// mean request time and a second, at most its `drain_timeout`).
#[tokio::test]
async fn a_max_wait_swap_serves_the_request_even_when_the_running_backend_drains_first() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  ma: {backend: a, max_wait: 120s}
  mb: {backend: b, max_wait: 8s}
";
    // A long residency (99× the round trip's starts): only the max_wait rule swaps b in.
    let top = "swap_after: 1s\nloading_share: 0.01\n";
    let backends = [slow_sim("a", pa, 0, "    drain_timeout: 30s\n"), slow_sim("b", pb, 1, "")];
    let gw = gateway(&yaml(top, &backends, models)).await;
    let long = json!({"ttft_ms": 2000, "tokens": 2});
    // b starts once (its start measured), then a, whose first answer takes 2 s (its mean).
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("mb", json!({"tokens": 2}))).await.status(), 200);
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("ma", long.clone())).await.status(), 200);
    // Two agents keep a busy with 2-second answers, back to back.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let agents: Vec<_> = (0..2)
        .map(|_| {
            let (url, busy, long) = (gw.url("/v1/chat/completions"), std::sync::Arc::clone(&busy), long.clone());
            tokio::spawn(async move {
                while busy.load(std::sync::atomic::Ordering::SeqCst) {
                    let r = client().post(&url).json(&ask("ma", long.clone())).send().await.expect("send");
                    let _ = r.bytes().await;
                }
            })
        })
        .collect();
    eventually("a busy", || async { backend_state(&gw, "a").await["in_flight"] == 2 }).await;
    let status = client().post(gw.url("/v1/chat/completions")).json(&ask("mb", json!({"tokens": 2}))).send().await;
    busy.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        status.expect("send").status(),
        200,
        "mb's request must be served within its 8 s: a's drain (its 2-second answers) and b's start"
    );
    let reason = "mlxgate_backend_swaps_total{backend=\"a\",reason=\"max_wait\"}";
    assert_eq!(metric(&gw, reason).await, Some(1.0), "the max_wait rule swapped a out");
    for agent in agents {
        agent.await.expect("agent");
    }
}

/// Finding: a fallback request is fitted to the fallback model's context cap. A prompt that
/// `haiku`'s own backend takes (a long-context small model) is refused because `coder`, which
/// stood in for it, has a smaller cap: the client gets a 400 it would not get without the
/// fallback.
#[tokio::test]
async fn a_prompt_its_own_model_takes_is_not_refused_for_the_fallbacks_smaller_context_cap() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 120s}\n  haiku: {backend: b, max_wait: 120s, fallback: coder}\n";
    let backends = [slow_sim("a", pa, 0, "    context_cap: 300\n"), slow_sim("b", pb, 0, "    context_cap: 100000\n")];
    let gw = gateway(&yaml("swap_after: 1s\n", &backends, models)).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("coder", json!({"tokens": 2}))).await.status(), 200);
    let long = "word ".repeat(2000);
    let body = json!({"model": "haiku", "max_tokens": 16, "messages": [{"role": "user", "content": long}], "sim": {"tokens": 2}});
    let r = post(&gw, "/v1/chat/completions", &body).await;
    let status = r.status();
    let fell_back = r.headers().get("x-mlxgate-fallback").is_some();
    let text = r.text().await.expect("body");
    assert_eq!(status, 200, "fell back: {fell_back}; {text}");
    assert!(!fell_back, "haiku's own backend served it");
    assert_eq!(backend_state(&gw, "b").await["state"], "ready");
}

/// A fallback answer on the Messages face, streamed, asked for by an alias (Claude Code's small
/// fast model): the header names the model that answered; the stream's `model` is the name asked.
#[tokio::test]
async fn a_streamed_messages_answer_by_an_alias_says_it_fell_back() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 120s}\n  haiku: {backend: b, max_wait: 120s, fallback: coder}\n";
    let top = "swap_after: 1s\naliases:\n  claude-3-5-haiku-*: haiku\n";
    let gw = gateway(&yaml(top, &[slow_sim("a", pa, 0, ""), slow_sim("b", pb, 0, "")], models)).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("coder", json!({"tokens": 2}))).await.status(), 200);
    let body = json!({"model": "claude-3-5-haiku-20241022", "max_tokens": 16, "stream": true,
        "messages": [{"role": "user", "content": "hi"}], "sim": {"tokens": 3}});
    let r = post(&gw, "/v1/messages", &body).await;
    assert_eq!(r.status(), 200);
    let header = r.headers().get("x-mlxgate-fallback").map(|v| v.to_str().expect("ascii").to_string());
    assert_eq!(header.as_deref(), Some("coder"));
    let text = text_of(r).await;
    assert!(text.contains("\"model\":\"claude-3-5-haiku-20241022\""), "{text}");
    assert!(text.contains("message_stop"), "{text}");
    assert_eq!(backend_state(&gw, "b").await["state"], "stopped");
}

// ---- The pure rules (dispatch::scheduler::decide), for the budget's findings ----

mod budget {
    use std::time::Duration;

    use mlxgate::backend::supervisor::Phase;
    use mlxgate::dispatch::queue::QueueView;
    use mlxgate::dispatch::scheduler::{Action, BackendView, Policy, decide};

    const GB: u64 = 1 << 30;
    const SECS: fn(u64) -> Duration = Duration::from_secs;

    fn view(name: &str, phase: Phase, gb: u64) -> BackendView {
        BackendView {
            name: name.into(),
            gpu: true,
            phase,
            generation: 0,
            ready_for: (phase == Phase::Ready).then_some(SECS(5)),
            queue: QueueView {
                waiting: 0,
                in_flight: 0,
                abandoned: 0,
                oldest_wait: None,
                idle_for: SECS(0),
                since_progress: SECS(0),
                max_wait: SECS(120),
                mean_service: SECS(0),
            },
            idle_timeout: None,
            start_cost: Some(SECS(20)),
            footprint: Some(gb * GB),
            last_residency: None,
            drain_timeout: SECS(60),
        }
    }

    fn policy(budget_gb: u64) -> Policy {
        Policy { swap_after: SECS(10), loading_share: 0.2, gpu_memory_budget: Some(budget_gb * GB) }
    }

    /// Finding: a measured footprint is the most measured so far, and grows with the server's
    /// KV and prompt caches after the budget let another backend start beside it. Once the
    /// running backends' footprints are over the budget, nothing brings them back under it: an
    /// idle one keeps running (a Mac then swaps to disk or Metal fails an allocation).
    #[test]
    fn running_backends_whose_footprints_grew_over_the_budget_are_brought_under_it() {
        // a (busy) grew from 12 to 26 GB after b (8 GB, idle for a minute) started beside it.
        let mut a = view("a", Phase::Ready, 26);
        a.queue.in_flight = 1;
        let mut b = view("b", Phase::Ready, 8);
        b.queue.idle_for = SECS(60);
        let actions = decide(&[a, b], None, &policy(32));
        assert!(
            actions.iter().any(|x| matches!(x, Action::StopIdle(n) | Action::Swap { running: n, .. } if n == "b")),
            "34 GB run in a 32 GB budget: {actions:?}"
        );
    }

    /// Finding: the backend whose request waited longest goes next even when it cannot get room
    /// yet; a small backend that fits beside what runs waits behind it (head-of-line), its
    /// requests served only after the big one's turn — or 503 at their max_wait.
    #[test]
    #[ignore = "issue22-rev finding 5: fails until a backend that fits now may start while the oldest waits for room"]
    fn a_small_backend_that_fits_is_not_held_behind_a_big_one_waiting_for_room() {
        let mut a = view("a", Phase::Ready, 10);
        a.queue.in_flight = 1;
        let mut big = view("big", Phase::Stopped, 30);
        big.queue.waiting = 1;
        big.queue.oldest_wait = Some(SECS(5));
        let mut small = view("small", Phase::Stopped, 5);
        small.queue.waiting = 1;
        small.queue.oldest_wait = Some(SECS(4));
        let actions = decide(&[a, big, small], None, &policy(32));
        assert_eq!(actions, [Action::Start("small".into())], "10 + 5 GB fit a 32 GB budget");
    }
}

/// Finding: the fallback's backend drained for maintenance (`mlxgate drain`) still reads ready,
/// so the fallback sends the model's requests to a backend that takes none, rather than
/// letting the model's own backend start.
#[tokio::test]
async fn a_fallback_whose_backend_is_drained_for_maintenance_does_not_stand_in() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 20s}\n  haiku: {backend: b, max_wait: 8s, fallback: coder}\n";
    let gw = gateway(&yaml("swap_after: 1s\n", &[slow_sim("a", pa, 0, ""), slow_sim("b", pb, 0, "")], models)).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("coder", json!({"tokens": 2}))).await.status(), 200);
    let drained = client().post(gw.url("/admin/backends/a/drain")).send().await.expect("drain");
    assert_eq!(drained.status(), 200);
    let r = post(&gw, "/v1/chat/completions", &ask("haiku", json!({"tokens": 2}))).await;
    let status = r.status();
    let header = r.headers().get("x-mlxgate-fallback").cloned();
    assert_eq!(status, 200, "fell back to the drained coder: {header:?}; {}", r.text().await.expect("body"));
    assert!(header.is_none(), "haiku's own backend served it");
}

/// Finding: a request its fallback serves waits in the fallback's queue on the fallback's
/// `max_wait`, not its own: `haiku`'s 3 s bound becomes `coder`'s 30 s behind coder's long
/// answers, and the 503 names `coder`.
#[tokio::test]
async fn a_fallback_request_waits_within_its_own_models_max_wait() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 30s}\n  haiku: {backend: b, max_wait: 3s, fallback: coder}\n";
    let gw = gateway(&yaml("swap_after: 1s\n", &[slow_sim("a", pa, 0, ""), slow_sim("b", pb, 0, "")], models)).await;
    // coder's two slots held by long answers.
    let mut held = Vec::new();
    for key in ["h1", "h2"] {
        let mut r = post(
            &gw,
            "/v1/chat/completions",
            &json!({"model": "coder", "stream": true,
            "messages": [{"role": "user", "content": "hi"}], "sim": {"hold_after": 1, "hold_key": key}}),
        )
        .await;
        read_until(&mut r, "t0 ").await;
        held.push(r);
    }
    let r = post(&gw, "/v1/chat/completions", &ask("haiku", json!({"tokens": 2}))).await;
    assert_eq!(r.headers().get("x-mlxgate-fallback").map(|v| v.as_bytes().to_vec()), Some(b"coder".to_vec()));
    let status = r.status();
    let text = r.text().await.expect("body");
    for key in ["h1", "h2"] {
        client().post(format!("http://127.0.0.1:{pa}/sim/release/{key}")).send().await.expect("release");
    }
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("waited 3s"), "haiku's max_wait is 3 s: {text}");
}
