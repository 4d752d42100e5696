//! A slot held for an abandoned answer (`hold_abandoned`) is no work anybody waits for: a GPU
//! swap to another model does not wait `drain_timeout` for it, since stopping the server is what
//! ends the abandoned generation. Servers are `mlxgate-sim` processes (`kind: custom`); the one
//! behind `a` keeps generating after its client left, as mlx-openai-server does.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

/// Longer than the test could ever wait: were the abandoned slot waited for, the swap would
/// wait this long (or for the abandoned answer's end, hours away).
const DRAIN: &str = "30m";

fn sim_backend(name: &str, port: u16, style: &str, extra: &str) -> String {
    format!(
        "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', '{style}']\n    \
         port: {port}\n    max_concurrency: 1\n    stop_timeout: 5s\n    drain_timeout: {DRAIN}\n{extra}"
    )
}

#[tokio::test]
async fn a_swap_does_not_wait_for_a_slot_held_by_an_abandoned_stream() {
    let (pa, pb) = (free_port(), free_port());
    let yaml = format!(
        "swap_after: 1s\nbackends:\n{}{}models:\n  a: {{backend: a, max_wait: 60m}}\n  b: {{backend: b, max_wait: 60m}}\n",
        sim_backend("a", pa, "mlx-openai-server", "    normalise: {hold_abandoned: true}\n"),
        sim_backend("b", pb, "openai", ""),
    );
    let gw = gateway(&yaml).await;
    // An answer of hours (100000 tokens at 10/s), left after its first token.
    let long = json!({"model": "a", "stream": true, "max_tokens": 100000,
        "messages": [{"role": "user", "content": "write a lot"}],
        "sim": {"tokens": 100000, "tokens_per_second": 10.0}});
    let mut stream = post(&gw, "/v1/chat/completions", &long).await;
    assert_eq!(stream.status(), 200);
    read_until(&mut stream, "\"content\"").await;
    drop(stream);
    let held = "mlxgate_abandoned_streams_held{backend=\"a\"}";
    eventually("the abandoned stream holds a's slot", || async { metric(&gw, held).await == Some(1.0) }).await;
    let a = backend_state(&gw, "a").await;
    assert_eq!((a["in_flight"].as_u64(), a["abandoned"].as_u64()), (Some(1), Some(1)), "{a}");

    // b needs the GPU: a is swapped out at once (its only slot is abandoned), not after DRAIN.
    let ask_b =
        json!({"model": "b", "stream": false, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let answered = tokio::time::timeout(Duration::from_secs(600), post(&gw, "/v1/chat/completions", &ask_b)).await;
    let response = answered.unwrap_or_else(|_| panic!("b waited for a's abandoned slot (drain_timeout {DRAIN})"));
    assert_eq!(response.status(), 200, "{}", text_of(response).await);
    // The stop ended the abandoned answer, and with it the hold.
    eventually("the hold ended with a's server", || async { metric(&gw, held).await == Some(0.0) }).await;
    assert_eq!(backend_state(&gw, "a").await["state"], "stopped");
}
