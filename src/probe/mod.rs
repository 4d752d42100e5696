//! `mlxgate probe URL [--model M] [--json]`: measures, with hand-written HTTP/1.1 on raw
//! sockets, what `wire-facts.md` records of an OpenAI-compatible server — HTTP version and
//! framing, keep-alive and its idle timeout, the SSE shape (role chunk, keepalives, usage
//! placement, `[DONE]`, reasoning field, finish reason at `max_tokens`, cached tokens), error
//! statuses and shapes, what two concurrent streams get and whether a disconnect cancels — and
//! prints the gateway.yaml backend stanza those facts call for.
//!
//! `wire` speaks HTTP, `checks` makes each measurement, `report` prints. The probe never names
//! a model other than the one given or served, except in the unknown-model error case, which is
//! skipped for servers known to unload their model on it (mlx_lm.server, mlx-vlm) and followed
//! by a request for the right model otherwise. Bounded: every request has a limit, the idle
//! timeout is waited for at most `--idle-wait` (35 s), alongside the other checks.

pub mod checks;
pub mod report;
pub mod wire;

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use checks::{ErrorCase, chat, prompt};
use report::{Report, StanzaInput};
use wire::{Target, exchange};

/// `max_tokens` of the streams whose finish reason must be `length`.
const CUT_AT: i64 = 5;
/// `max_tokens` of the single and concurrent streams compared for the speedup.
const PAIR_TOKENS: i64 = 32;

/// The command's options.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeOptions {
    /// The server's base URL (`http://127.0.0.1:8080`, a trailing `/v1` is fine).
    pub url: String,
    /// The model to ask for; default: the first one `/v1/models` lists.
    #[arg(long)]
    pub model: Option<String>,
    /// The model's context length in tokens, for the over-long prompt case; default: from
    /// `/v1/models` or the model directory's config.json, else the case is skipped.
    #[arg(long)]
    pub context: Option<u64>,
    /// Longest to wait for the server to close an idle keep-alive connection (Rapid-MLX's
    /// closes after 30 s); waited alongside the other checks.
    #[arg(long, default_value = "35s", value_parser = humantime::parse_duration)]
    pub idle_wait: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the probe and prints its report; 1 when the server could not be probed.
pub fn main(options: ProbeOptions) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(probe(&options)) {
        Ok(report) if options.json => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mlxgate probe: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(report) => {
            print!("{}", report.text());
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("mlxgate probe: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Probes the server at `options.url`.
pub async fn probe(options: &ProbeOptions) -> Result<Report, String> {
    let target = Target::parse(&options.url)?;
    let listed = models(&target).await;
    let model = match (&options.model, listed.first()) {
        (Some(m), _) => m.clone(),
        (None, Some(entry)) => entry["id"].as_str().unwrap_or_default().to_string(),
        (None, None) => return Err("/v1/models lists no model: name one with --model".into()),
    };
    let context = options.context.or_else(|| context_of(&model, &listed));
    let mut report = Report::default();
    // The idle timeout takes up to IDLE_LIMIT of waiting: measured alongside the rest.
    let idle = tokio::spawn({
        let (target, limit) = (target.clone(), options.idle_wait);
        async move { checks::keep_alive(&target, limit).await }
    });

    let lead = format!("probe {}", std::process::id());
    let first = stream_ok(&target, &chat(&model, &prompt(&lead, 24), CUT_AT, true, Some(true))).await?;
    report.http_version = first.head.version.clone();
    report.framing = first.head.framing.name().to_string();
    report.role_chunk = first.role_chunk().to_string();
    report.keepalive = first.keepalive().to_string();
    report.usage_placement = first.usage_placement().to_string();
    report.done_marker = first.done_marker();
    report.reasoning_field = first.reasoning_field().map(str::to_string);
    report.finish_reason_at_max_tokens = first.finish_reason();
    if first.completion_tokens().is_some_and(|t| t < CUT_AT as u64) {
        report.notes.push(format!(
            "the stream asked for max_tokens {CUT_AT} ended after {} tokens: its finish_reason may be a real stop",
            first.completion_tokens().unwrap_or(0)
        ));
    }
    let repeated = stream_ok(&target, &chat(&model, &prompt(&lead, 24), CUT_AT, true, Some(true))).await?;
    report.cached_tokens = repeated.cached_tokens();
    let without = stream_ok(&target, &chat(&model, &prompt(&lead, 24), CUT_AT, true, None)).await?;
    report.usage_without_include_usage = without.has_usage();
    let kind = recognise(&first.head);

    let mut errors = indexmap::IndexMap::new();
    errors.insert("unknown_model".to_string(), unknown_model(&target, &model, kind).await);
    errors.insert("invalid_json".to_string(), checks::error_case(&target, invalid_json(&model).as_bytes()).await);
    errors.insert("prompt_over_context".to_string(), over_context(&target, &model, context).await);

    let single =
        stream_ok(&target, &chat(&model, &prompt(&format!("{lead} alone"), 24), PAIR_TOKENS, true, Some(true))).await?;
    match checks::concurrency(&target, &model, &single, PAIR_TOKENS).await {
        Ok(c) => {
            report.concurrent_streams = Some(c.verdict.to_string());
            report.speedup_2 = c.speedup;
        }
        Err(e) => report.notes.push(format!("two concurrent streams: {e}")),
    }
    let alone = single.first_output().unwrap_or(single.ended);
    match checks::cancels_on_disconnect(&target, &model, alone).await {
        Ok(cancels) => report.cancels_on_disconnect = Some(cancels),
        Err(e) => report.notes.push(format!("disconnect: {e}")),
    }
    // Last: a server that takes -1 as "unlimited" generates until EOS.
    let negative = checks::status_only(&target, &chat(&model, "hello", -1, true, Some(true))).await;
    if negative.status == Some(200) {
        report.notes.push("max_tokens -1 was answered 200 (left at once; the server may generate on)".into());
    }
    errors.insert("negative_max_tokens".to_string(), negative);
    report.errors = errors;

    match idle.await {
        Ok(Ok(k)) => {
            report.keep_alive = k.keep_alive;
            report.idle_timeout_s = k.idle_timeout.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            if k.keep_alive && k.idle_timeout.is_none() {
                report.notes.push(format!("an idle connection was still open after {:?}", options.idle_wait));
            }
        }
        Ok(Err(e)) => report.notes.push(format!("keep-alive: {e}")),
        Err(e) => report.notes.push(format!("keep-alive: {e}")),
    }
    let stanza = StanzaInput { url: &options.url, model: &model, kind, context, finish_chunks: first.finish_chunks() };
    report.profile = report.stanza(&stanza);
    Ok(report)
}

/// A streamed request that must be answered 200.
async fn stream_ok(target: &Target, body: &Value) -> Result<checks::StreamRecord, String> {
    let record = checks::stream(target, body, false).await.map_err(|e| format!("a streamed chat request: {e}"))?;
    if record.head.status != 200 {
        return Err(format!(
            "a streamed chat request was answered {}: {}",
            record.head.status,
            record.refusal.as_deref().unwrap_or("")
        ));
    }
    Ok(record)
}

/// `/v1/models`' entries (none when it fails or is empty, as mlx_lm.server's can be).
async fn models(target: &Target) -> Vec<Value> {
    let Ok(Ok((_, body, _))) =
        tokio::time::timeout(checks::REQUEST_LIMIT, exchange(target, "GET", "/v1/models", b"")).await
    else {
        return vec![];
    };
    serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["data"].as_array().cloned()).unwrap_or_default()
}

/// The context length: a `/v1/models` field, else `max_position_embeddings` of the model's
/// config.json when the model is a local directory.
fn context_of(model: &str, listed: &[Value]) -> Option<u64> {
    let entry = listed.iter().find(|e| e["id"] == model);
    let listed = entry.and_then(|e| {
        ["max_model_len", "context_length", "max_context_length", "context_window"].iter().find_map(|k| e[*k].as_u64())
    });
    listed.or_else(|| {
        let text = std::fs::read_to_string(std::path::Path::new(model).join("config.json")).ok()?;
        serde_json::from_str::<Value>(&text).ok()?["max_position_embeddings"].as_u64()
    })
}

/// The server, when its headers say which it is: `mlx-lm` (Python's BaseHTTP) or `mlx-vlm`.
fn recognise(head: &wire::Head) -> Option<&'static str> {
    let server = head.header("server").unwrap_or_default();
    if server.contains("BaseHTTP") {
        Some("mlx-lm")
    } else if server.contains("mlx_vlm") {
        Some("mlx-vlm")
    } else {
        None
    }
}

/// The unknown-model case: skipped for servers that unload their model on it; otherwise sent,
/// then followed by a request for the right model (so it is loaded again where it was dropped).
async fn unknown_model(target: &Target, model: &str, kind: Option<&str>) -> ErrorCase {
    if let Some(kind) = kind.filter(|k| ["mlx-lm", "mlx-vlm"].contains(k)) {
        return ErrorCase::skipped(format!("{kind} unloads its model when asked for an unknown one"));
    }
    let body = chat("mlxgate-probe-no-such-model", "hello", 1, false, None);
    let case = checks::error_case(target, body.to_string().as_bytes()).await;
    let _ = checks::error_case(target, chat(model, "hello", 1, false, None).to_string().as_bytes()).await;
    case
}

/// A chat body cut in the middle.
fn invalid_json(model: &str) -> String {
    format!("{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": ")
}

/// A prompt of more tokens than the context (each " a" is at least one token), not streamed,
/// one token asked for.
async fn over_context(target: &Target, model: &str, context: Option<u64>) -> ErrorCase {
    let Some(context) = context else {
        return ErrorCase::skipped("context length unknown: pass --context");
    };
    let words = usize::try_from(context).unwrap_or(usize::MAX).saturating_add(128);
    let body = chat(model, &" a".repeat(words), 1, false, None);
    checks::error_case(target, body.to_string().as_bytes()).await
}
