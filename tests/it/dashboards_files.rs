//! The shipped dashboard and alert rules, read as files: every metric they use is one the
//! gateway declares, every panel says what to do when it looks wrong, the dashboard imports as
//! Grafana expects it (datasource input, variables, annotations), and the JSON is what its
//! generator writes. (tests/it/dashboards.rs proves every query returns data from a real
//! Prometheus.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mlxgate::metrics::Metrics;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(root().join("dashboards/mlxgate.json")).expect("dashboards/mlxgate.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel that is not a row, nested ones (in collapsed rows) included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a [Value], out: &mut Vec<&'a Value>) {
        for panel in list {
            if panel["type"] == "row" {
                walk(panel["panels"].as_array().map_or(&[], Vec::as_slice), out);
            } else {
                out.push(panel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    out
}

/// Every PromQL expression of the dashboard: panel targets and annotation queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let mut exprs: Vec<String> = panels(dashboard)
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    exprs.extend(
        dashboard["annotations"]["list"]
            .as_array()
            .expect("annotations")
            .iter()
            .filter_map(|a| a["expr"].as_str().map(str::to_owned)),
    );
    exprs
}

fn alert_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("dashboards/alerts.yml")).expect("dashboards/alerts.yml");
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("alerts.yml is YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alerting rule").to_owned();
            out.push((name, rule["expr"].as_str().expect("expr").to_owned()));
        }
    }
    out
}

/// The metric names an expression reads (`mlxgate_…`), histogram series by their family.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("mlxgate_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &expr[start..end];
        let family = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        names.insert(family.to_owned());
        i = end;
    }
    names
}

#[test]
fn every_metric_the_dashboard_and_the_alerts_use_is_one_the_gateway_declares() {
    let declared: BTreeSet<String> = Metrics::new().family_names().iter().cloned().collect();
    let mut used = BTreeSet::new();
    for expr in dashboard_exprs(&dashboard()).iter().chain(alert_exprs().iter().map(|(_, e)| e)) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "an expression that reads no mlxgate metric: {expr}");
        used.extend(names);
    }
    let unknown: Vec<&String> = used.difference(&declared).collect();
    assert!(unknown.is_empty(), "used but not declared in src/metrics.rs: {unknown:?}");
    // And the other way round: a metric nobody can see on the board is one to add to it.
    let unseen: Vec<&String> = declared
        .difference(&used)
        // Superseded by mlxgate_backend_state; covered by time to first token and decode speed.
        .filter(|name| {
            !["mlxgate_backend_up", "mlxgate_inter_token_latency_seconds", "mlxgate_request_duration_seconds"]
                .contains(&name.as_str())
        })
        .collect();
    assert!(unseen.is_empty(), "declared but on no panel or alert: {unseen:?}");
}

#[test]
fn every_panel_has_a_description_and_queries_through_the_datasource_input() {
    let dashboard = dashboard();
    let all = panels(&dashboard);
    assert!(all.len() >= 12, "{} panels", all.len());
    for panel in all {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        let description = panel["description"].as_str().unwrap_or("");
        assert!(description.len() >= 120, "panel {title:?}: a description that says what to do, got {description:?}");
        assert_eq!(panel["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {title:?}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {title:?}");
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "panel {title:?}");
        }
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().expect("x"), grid["w"].as_u64().expect("w"));
        assert!(x + w <= 24, "panel {title:?} runs off the 24-column grid");
    }
}

#[test]
fn the_dashboard_imports_as_grafana_expects() {
    let dashboard = dashboard();
    let inputs = dashboard["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "the datasource is an input chosen at import"
    );
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 39), "a current schemaVersion");
    assert_eq!(dashboard["uid"], "mlxgate");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for name in ["DS_PROMETHEUS", "model", "backend", "client"] {
        assert!(variables.contains(&name), "variable {name}: {variables:?}");
    }
    // The model, backend and client filters reach every query that has such a label.
    for expr in dashboard_exprs(&dashboard) {
        if expr.contains("mlxgate_requests_total") {
            assert!(expr.contains("$model") && expr.contains("$client"), "{expr}");
        }
    }
    // Swaps and restarts mark the latency panels.
    let annotations: Vec<String> = dashboard["annotations"]["list"]
        .as_array()
        .expect("annotations")
        .iter()
        .filter_map(|a| a["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(annotations.iter().any(|e| e.contains("mlxgate_backend_swaps_total")), "{annotations:?}");
    assert!(annotations.iter().any(|e| e.contains("mlxgate_backend_restarts_total")), "{annotations:?}");
}

#[test]
fn the_json_is_what_its_generator_writes() {
    let out = tempfile::tempdir().expect("tempdir");
    let path = out.path().join("mlxgate.json");
    let status = std::process::Command::new("python3")
        .arg(root().join("dashboards/make-dashboard.py"))
        .arg("--out")
        .arg(&path)
        .status()
        .expect("python3 runs");
    assert!(status.success());
    let made = std::fs::read_to_string(&path).expect("written");
    let shipped = std::fs::read_to_string(root().join("dashboards/mlxgate.json")).expect("shipped");
    assert!(made == shipped, "dashboards/mlxgate.json differs from make-dashboard.py's: rerun the generator");
}

#[test]
fn every_alert_is_a_signal_against_a_threshold_and_says_what_to_do() {
    let alerts = alert_exprs();
    let names: Vec<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "BackendDown",
        "RestartLoop",
        "BackendFailed",
        "SlowFirstToken",
        "QueueFull",
        "UsageMismatch",
        "SwapThrash",
        "BackendErrors",
        "LoadingShare",
    ] {
        assert!(names.iter().any(|n| n.ends_with(wanted)), "no {wanted} alert: {names:?}");
    }
    for (name, expr) in &alerts {
        assert!(signal_of(expr).is_some(), "{name}: `{expr}` does not end in a comparison with a number");
    }
    let text = std::fs::read_to_string(root().join("dashboards/alerts.yml")).expect("alerts.yml");
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    for rule in rules["groups"][0]["rules"].as_sequence().expect("rules") {
        let description = rule["annotations"]["description"].as_str().unwrap_or("");
        assert!(description.len() >= 60, "{:?}: a description that says what to do", rule["alert"]);
        assert!(rule["labels"]["severity"].is_string(), "{:?}: a severity", rule["alert"]);
    }
    assert!(Path::new(&root().join("dashboards/alerts_test.yml")).is_file(), "promtool unit tests of the alerts");
}

/// An alert's expression without its final comparison with a number: what its panel plots.
fn signal_of(expr: &str) -> Option<String> {
    let trimmed = expr.trim_end();
    let number_start = trimmed.rfind(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))? + 1;
    let before = trimmed[..number_start].trim_end();
    ["<=", ">=", "==", "!=", ">", "<"]
        .iter()
        .find_map(|op| before.strip_suffix(op))
        .map(|signal| signal.trim_end().to_owned())
        .filter(|s| !s.is_empty() && number_start < trimmed.len())
}
