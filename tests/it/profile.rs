//! Each backend's profile as operators see it: `/admin/backends` lists the normalisations in
//! force (the kind's defaults, then the file's `normalise:` switches), and `/metrics` labels
//! every backend with its kind (`mlxgate_backend_info`), which the dashboard joins on.

use crate::common;

use crate::common::{client, gateway, metric, sim};
use serde_json::Value;

async fn admin_backends(gw: &common::Gateway) -> Vec<Value> {
    let body: Value = client().get(gw.url("/admin/backends")).send().await.expect("send").json().await.expect("json");
    body["backends"].as_array().expect("backends").clone()
}

fn normalise_keys(entry: &Value) -> Vec<String> {
    entry["normalise"]
        .as_array()
        .expect("normalise is a list")
        .iter()
        .map(|l| l.as_str().expect("a line").split(':').next().expect("key").to_owned())
        .collect()
}

#[tokio::test]
async fn admin_backends_lists_each_profiles_normalisations_and_metrics_name_the_kind() {
    let server = sim().await;
    let url = server.url();
    let yaml = format!(
        "backends:\n  rapid: {{url: '{url}', kind: rapid-mlx}}\n  \
         rapid-raw: {{url: '{url}', kind: rapid-mlx, normalise: {{loopback_host: false, pool_idle_timeout: 2s}}}}\n  \
         omni: {{url: '{url}', kind: mlx-omni-server}}\n  \
         plain: {{url: '{url}'}}\n\
         models:\n  a: {{backend: rapid}}\n  b: {{backend: rapid-raw}}\n  c: {{backend: omni, upstream_model: /models/qwen}}\n  d: {{backend: plain}}\n"
    );
    let gw = gateway(&yaml).await;
    let backends = admin_backends(&gw).await;
    let by_name = |name: &str| backends.iter().find(|b| b["name"] == name).cloned().expect(name);

    let rapid = by_name("rapid");
    assert_eq!(rapid["kind"], "rapid-mlx");
    assert_eq!(normalise_keys(&rapid), ["pool_idle_timeout", "loopback_host"], "{rapid}");
    assert!(rapid["normalise"][0].as_str().is_some_and(|l| l.contains("25s")), "{rapid}");

    let raw = by_name("rapid-raw");
    assert_eq!(normalise_keys(&raw), ["pool_idle_timeout"], "switched off in the file: {raw}");
    assert!(raw["normalise"][0].as_str().is_some_and(|l| l.contains("2s")), "{raw}");

    let omni = by_name("omni");
    assert_eq!(normalise_keys(&omni), ["pool_idle_timeout", "finish_length", "single_finish"], "{omni}");
    assert_eq!(by_name("plain")["kind"], "custom");

    for (backend, kind) in
        [("rapid", "rapid-mlx"), ("rapid-raw", "rapid-mlx"), ("omni", "mlx-omni-server"), ("plain", "custom")]
    {
        let series = format!("mlxgate_backend_info{{backend=\"{backend}\",kind=\"{kind}\"}}");
        assert_eq!(metric(&gw, &series).await, Some(1.0), "{series}");
    }
}
