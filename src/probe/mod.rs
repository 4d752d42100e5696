//! `mlxgate probe URL [--model M] [--json]`: measures, with hand-written HTTP/1.1 on raw
//! sockets, what `docs/wire-facts.md` records of an OpenAI-compatible server — HTTP version and
//! framing, keep-alive and its idle timeout, the Host and Origin checks, the SSE shape (role
//! chunk, keepalives, usage placement, `[DONE]`, reasoning field, finish reason at `max_tokens`,
//! cached tokens), error statuses and shapes, what two concurrent streams get and whether a
//! disconnect cancels — and prints the gateway.yaml backend stanza those facts call for.
//!
//! `wire` speaks HTTP, `checks` makes each measurement, `report` prints. Safety of the server
//! probed comes first:
//! - the probe never names a model other than the one given or served: mlx_lm.server gets no
//!   `model` field (its launch model), mlx-vlm the model it lists as loaded, and a server that
//!   lists several models gets none unless `--model` says which; the unknown-model case is sent
//!   only to servers recognised as ones that do not unload on it, and followed by a request for
//!   the right model;
//! - no request can generate without end: `max_tokens: -1` is sent only to a kind known to
//!   refuse it, or to an unrecognised server seen to stop an abandoned answer that would have run
//!   on (never to the kinds known to take it as unlimited), and left at its head; the over-long
//!   prompt only to a server seen to cancel or a kind known to check the length first, up to
//!   `OVER_CONTEXT_BOUND` tokens unless `--context` asks, and also left at its head;
//! - bounded: one deadline (`--deadline`, 90 s) for everything, short head and stall limits, a
//!   case that runs out of time is skipped with the reason; the disconnect check's abandoned
//!   stream is sized to end by itself within seconds, and is not started when the deadline could
//!   cut its check short.

pub mod checks;
pub mod report;
pub mod wire;

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use checks::{Budget, ErrorCase, StreamRecord, chat, prompt};
use report::{Report, StanzaInput};
use wire::{Head, Target, exchange};

/// `max_tokens` of the streams whose finish reason must be `length`.
const CUT_AT: i64 = 5;
/// `max_tokens` of the single and concurrent streams compared for the speedup.
const PAIR_TOKENS: i64 = 32;
/// The largest context whose over-long prompt is sent without `--context` asking for it: above
/// it, the servers that do not check (most) would prefill it in full.
const OVER_CONTEXT_BOUND: u64 = 16_384;
/// The `Host` sent by the Host check: a name no server trusts.
const FOREIGN_HOST: &str = "mlxgate-probe.invalid";
/// The `Origin` sent by the Origin check: a browser UI on the same machine.
const BROWSER_ORIGIN: &str = "http://localhost:3000";

/// Kinds known to refuse `max_tokens: -1` before generating (docs/wire-facts.md §4: mlx_lm 400,
/// vllm-mlx 422, Rapid-MLX 400, mlx-vlm 400).
const REFUSE_NEGATIVE: &[&str] = &["mlx-lm", "vllm-mlx", "rapid-mlx", "mlx-vlm"];
/// Kinds known to take `max_tokens: -1` as unlimited (docs/wire-facts.md §4: 200, generated until EOS).
const UNLIMITED_NEGATIVE: &[&str] = &["mlx-openai-server", "mlx-omni-server"];
/// Kinds known to check the prompt's length before generating (docs/wire-facts.md §4: 400).
const CHECK_CONTEXT: &[&str] = &["rapid-mlx", "mlx-vlm"];

/// The kinds `--kind` takes (the gateway's `kind:` names).
const KINDS: &[&str] = &[
    "mlx-lm",
    "mlx-openai-server",
    "vllm-mlx",
    "rapid-mlx",
    "mlx-vlm",
    "mlx-omni-server",
    "omlx",
    "higgs",
    "mlx-serve",
    "custom",
];

/// The command's options.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeOptions {
    /// The server's base URL (`http://127.0.0.1:8080`, a trailing `/v1` is fine).
    pub url: String,
    /// The model to ask for, exactly as the server was launched with it. Default: for
    /// mlx_lm.server none (it uses its launch model), for mlx-vlm the one it lists as loaded,
    /// otherwise the only one `/v1/models` lists (several: the probe refuses to guess).
    #[arg(long)]
    pub model: Option<String>,
    /// The server's kind when its answers do not show it (behind a proxy): `mlx-lm`,
    /// `mlx-openai-server`, `vllm-mlx`, `rapid-mlx`, `mlx-vlm`, `mlx-omni-server`, … .
    #[arg(long)]
    pub kind: Option<String>,
    /// The model's context length in tokens, for the over-long prompt case; default: from
    /// `/v1/models` or the model directory's config.json (sent only up to 16384 tokens then),
    /// else the case is skipped.
    #[arg(long)]
    pub context: Option<u64>,
    /// Longest to wait for the server to close an idle keep-alive connection (Rapid-MLX's
    /// closes after 30 s); waited alongside the other checks, within the deadline.
    #[arg(long, default_value = "35s", value_parser = humantime::parse_duration)]
    pub idle_wait: Duration,
    /// The whole probe's time limit; a check still running then is skipped with the reason.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl ProbeOptions {
    /// Defaults for `url` (as the command line has them).
    pub fn new(url: &str) -> ProbeOptions {
        ProbeOptions {
            url: url.to_string(),
            model: None,
            kind: None,
            context: None,
            idle_wait: Duration::from_secs(35),
            deadline: Duration::from_secs(90),
            json: false,
        }
    }
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

/// Aborts the keep-alive measurement when the probe returns early.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The server being probed: where, until when, and what every request carries.
struct Probe {
    target: Target,
    budget: Budget,
    /// The `model` field; `None` leaves it out (mlx_lm.server then uses its launch model).
    model: Option<String>,
    /// The server accepts `stream_options` (it refused it: sent no more).
    stream_options: bool,
}

impl Probe {
    fn chat(&self, prompt: &str, max_tokens: i64, stream: bool, include_usage: Option<bool>) -> Value {
        chat(self.model.as_deref(), prompt, max_tokens, stream, include_usage.filter(|_| self.stream_options))
    }

    /// A streamed request that must be answered 200 and end as a stream ends.
    async fn stream_ok(&self, body: &Value) -> Result<StreamRecord, String> {
        let record = checks::stream(&self.target, &self.budget, body, false)
            .await
            .map_err(|e| format!("a streamed chat request: {e}"))?;
        self.checked(record)
    }

    /// `record` when it is a 200 stream that ended as a stream ends.
    fn checked(&self, record: StreamRecord) -> Result<StreamRecord, String> {
        if record.head.status != 200 {
            return Err(format!(
                "a streamed chat request was answered {}: {}",
                record.head.status,
                record.refusal.as_deref().unwrap_or("")
            ));
        }
        if let Some(error) = record.error_event() {
            return Err(format!("a streamed chat request got an error event: {error}"));
        }
        match record.cut() {
            Some(cut) => Err(format!("a streamed chat request: {cut}")),
            None => Ok(record),
        }
    }
}

/// Probes the server at `options.url`.
pub async fn probe(options: &ProbeOptions) -> Result<Report, String> {
    // On the heap: the whole probe's state is too big for a test thread's stack.
    Box::pin(probe_all(options)).await
}

async fn probe_all(options: &ProbeOptions) -> Result<Report, String> {
    if let Some(kind) = options.kind.as_deref().filter(|k| !KINDS.contains(k)) {
        return Err(format!("--kind {kind}: one of {}", KINDS.join(", ")));
    }
    let budget = Budget::new(options.deadline);
    let mut target = Target::parse(&options.url)?;
    let mut report = Report::default();
    // Side by side: a server whose /v1/models hangs costs one head limit, not three.
    let (mut listing, host_check, mut origin_check) = tokio::join!(
        models(&target, &budget),
        checks::header_check(&target, &budget, "Host", FOREIGN_HOST),
        checks::header_check(&target, &budget, "Origin", BROWSER_ORIGIN)
    );
    if listing.as_ref().is_ok_and(|l| [400, 403].contains(&l.head.status)) && !target.loopback() {
        report.notes.push(format!(
            "{} refused GET /v1/models with Host {}: the probe went on with Host {}",
            target.base_url(),
            target.host,
            target.loopback_authority()
        ));
        target.host_header = Some(target.loopback_authority());
        listing = models(&target, &budget).await;
        origin_check = checks::header_check(&target, &budget, "Origin", BROWSER_ORIGIN).await;
    }
    let mut kind = options.kind.clone().or_else(|| listing.as_ref().ok().and_then(|l| kind_from_head(&l.head)));
    let model = choose_model(options, kind.as_deref(), &listing, &mut report.notes)?;
    let entries = listing.as_ref().map(|l| l.entries.clone()).unwrap_or_default();
    let named_context = options.context.is_some();
    // mlx_lm.server lists its launch model last, as an absolute path: read, never sent.
    let launch = (kind.as_deref() == Some("mlx-lm")).then(|| entries.last().and_then(|e| e["id"].as_str())).flatten();
    let context = options.context.or_else(|| model.as_deref().or(launch).and_then(|m| context_of(m, &entries)));
    let tokenizer = model.as_deref().or(launch).filter(|m| local_tokenizer(m)).map(str::to_string);

    let idle = AbortOnDrop(tokio::spawn({
        let (target, limit) = (target.clone(), options.idle_wait);
        async move { checks::keep_alive(&target, &budget, limit).await }
    }));
    let mut p = Probe { target, budget, model, stream_options: true };
    let lead = format!("probe {}", std::process::id());
    let first = first_stream(&mut p, &prompt(&lead, 24), &mut report.notes).await?;
    kind = kind.or_else(|| kind_from_stream(&first).map(str::to_string));
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
    let repeated = p.stream_ok(&p.chat(&prompt(&lead, 24), CUT_AT, true, Some(true))).await?;
    report.cached_tokens = repeated.cached_tokens();
    let without = p.stream_ok(&p.chat(&prompt(&lead, 24), CUT_AT, true, None)).await?;
    report.usage_without_include_usage = without.has_usage();

    let mut errors = indexmap::IndexMap::new();
    errors.insert("unknown_model".to_string(), unknown_model(&p, kind.as_deref()).await);
    errors.insert(
        "invalid_json".to_string(),
        checks::error_case(&p.target, &p.budget, invalid_json(p.model.as_deref()).as_bytes()).await,
    );

    let alone = concurrency_and_rate(&p, &lead, &mut report).await;
    let ran_long = cancel_check(&p, &lead, &alone, &mut report).await;
    let seen = Seen {
        kind: kind.as_deref(),
        cancels: report.cancels_on_disconnect,
        ran_long,
        batched: report.concurrent_streams.as_deref() == Some("batched"),
    };
    errors.insert("prompt_over_context".to_string(), over_context(&p, context, named_context, &seen).await);
    errors.insert("negative_max_tokens".to_string(), negative_max_tokens(&p, &seen).await);
    report.errors = errors;

    idle_timeout(idle, &p, &mut report).await;
    report.host_check = Some(host_check);
    report.origin_check = Some(origin_check);
    let stanza = StanzaInput {
        base_url: p.target.base_url(),
        model: p.model.as_deref(),
        kind: kind.as_deref(),
        kind_given: options.kind.is_some(),
        context,
        finish_chunks: first.finish_chunks(),
        stream_options: p.stream_options,
        tokenizer: tokenizer.as_deref(),
    };
    report.profile = report.stanza(&stanza);
    Ok(report)
}

/// The first stream (`max_tokens` 5, with `include_usage`); a refusal that goes away without
/// `stream_options` means the server refuses that field: it is not sent again.
async fn first_stream(p: &mut Probe, text: &str, notes: &mut Vec<String>) -> Result<StreamRecord, String> {
    let record = checks::stream(&p.target, &p.budget, &p.chat(text, CUT_AT, true, Some(true)), false)
        .await
        .map_err(|e| format!("a streamed chat request: {e}"))?;
    if [400, 422].contains(&record.head.status) {
        p.stream_options = false;
        if let Ok(again) = p.stream_ok(&p.chat(text, CUT_AT, true, Some(true))).await {
            notes.push(format!(
                "a stream with stream_options was refused ({}), the same without it accepted",
                record.head.status
            ));
            return Ok(again);
        }
        p.stream_options = true;
    }
    p.checked(record)
}

/// What the stream alone showed about the prompt the cancel check abandons.
struct Alone {
    /// Its decode rate, tokens/s.
    rate: Option<f64>,
    /// The tokens of its answer when that ended by itself (at least two short of `PAIR_TOKENS`:
    /// mlx-omni-server counts one less at `max_tokens`).
    ended_by_itself: Option<u64>,
}

/// The prompt whose answer is measured alone and then abandoned by the cancel check.
fn long_prompt(lead: &str) -> String {
    prompt(&format!("{lead} a long answer nobody reads"), 24)
}

/// One stream alone (the cancel check's prompt), then two at once.
async fn concurrency_and_rate(p: &Probe, lead: &str, report: &mut Report) -> Alone {
    let single = match p.stream_ok(&p.chat(&long_prompt(lead), PAIR_TOKENS, true, Some(true))).await {
        Ok(s) => s,
        Err(e) => {
            report.notes.push(format!("one stream alone: {e}"));
            return Alone { rate: None, ended_by_itself: None };
        }
    };
    let a = p.chat(&prompt(&format!("{lead} pair one"), 24), PAIR_TOKENS, true, Some(true));
    let b = p.chat(&prompt(&format!("{lead} pair two"), 24), PAIR_TOKENS, true, Some(true));
    match checks::concurrency(&p.target, &p.budget, [&a, &b], &single).await {
        Ok(c) => {
            report.concurrent_streams = Some(c.verdict.to_string());
            report.speedup_2 = c.speedup;
        }
        Err(e) => report.notes.push(format!("two concurrent streams: {e}")),
    }
    let ended_by_itself = single.tokens().filter(|t| t + 1 < PAIR_TOKENS as u64);
    Alone { rate: single.decode_rate(), ended_by_itself }
}

/// Time the cancel check needs beyond two and a half times the abandoned stream's expected
/// duration (the follow-up's own answer, then the same prompt alone at half the size): started
/// with less left before the deadline, a server that does not cancel would be left generating
/// after the probe ends.
const CANCEL_CHECK_MARGIN: Duration = Duration::from_secs(5);

/// Whether a disconnect stops the generation, with an abandoned stream sized to last seconds;
/// true when the abandoned prompt's answer, read alone, ran on (see `answer_runs_on`).
/// A "cancels" is kept only then: a follow-up is counted as cancelling when it is served within
/// a quarter of the abandoned stream's expected duration, so an abandoned answer that ends by
/// itself before that looks the same.
async fn cancel_check(p: &Probe, lead: &str, alone: &Alone, report: &mut Report) -> bool {
    if p.budget.spent() {
        report.notes.push(format!("disconnect: {}", p.budget.spent_reason()));
        return false;
    }
    let Some(rate) = alone.rate else {
        report.notes.push("disconnect: not measured: no decode rate to size the abandoned stream by".into());
        return false;
    };
    let (tokens, expected) = checks::orphan(rate);
    let needs = expected.mul_f64(2.5) + CANCEL_CHECK_MARGIN;
    if p.budget.left() < needs {
        report.notes.push(format!(
            "disconnect: not measured: {:.1} s left before the deadline, the check needs about {:.0} s",
            p.budget.left().as_secs_f64(),
            needs.as_secs_f64()
        ));
        return false;
    }
    let long = p.chat(&long_prompt(lead), tokens, true, None);
    let next = p.chat(&prompt(&format!("{lead} the request after the one that left"), 24), 4, true, None);
    let c = match checks::cancels_on_disconnect(&p.target, &p.budget, &long, &next, expected).await {
        Ok(c) => c,
        Err(e) => {
            report.notes.push(format!("disconnect: {e}"));
            return false;
        }
    };
    report.notes.push(format!("disconnect ({tokens} tokens asked, left after the first): {}", c.seen));
    if c.cancels != Some(true) {
        report.cancels_on_disconnect = c.cancels;
        return false;
    }
    let runs_on = answer_runs_on(p, lead, alone, tokens / 2).await;
    match &runs_on {
        Ok(n) => report.notes.push(format!(
            "disconnect: the same prompt alone ran the {n} tokens asked (half the abandoned stream's): an abandoned \
             answer would have outlasted the follow-up's wait"
        )),
        Err(why) => report.notes.push(format!(
            "disconnect: inconclusive: {why}, so the abandoned one may have ended before the follow-up was served"
        )),
    }
    report.cancels_on_disconnect = runs_on.is_ok().then_some(true);
    runs_on.is_ok()
}

/// Whether the abandoned prompt's answer runs on for `half` (half the abandoned stream's
/// `max_tokens`, twice what must be left of it when the follow-up decides): streamed alone with
/// that `max_tokens` at temperature 0 (the same answer) and read to its end. `Ok` with the
/// tokens when it ran the whole length (mlx-omni-server counts one less at `max_tokens`), else
/// why not. Not sent when the pair's 32-token stream of the same prompt already ended by itself.
async fn answer_runs_on(p: &Probe, lead: &str, alone: &Alone, half: i64) -> Result<u64, String> {
    if let Some(natural) = alone.ended_by_itself {
        return Err(format!("this prompt's answer ended by itself after {natural} tokens"));
    }
    let record = p.stream_ok(&p.chat(&long_prompt(lead), half, true, Some(true))).await.map_err(|e| {
        format!("the same prompt alone (to see whether its answer runs on for {half} tokens) failed: {e}")
    })?;
    let tokens = record.tokens().unwrap_or(0);
    if tokens + 1 < u64::try_from(half).unwrap_or(u64::MAX) {
        return Err(format!("this prompt's answer ended by itself after {tokens} tokens ({half} asked)"));
    }
    Ok(tokens)
}

/// Keep-alive's result, waited for within the deadline. The first measurement ran while the
/// probe's streams kept the server busy, and a server whose generation holds its event loop
/// (mlx-omni-server, measured 5.7 s for uvicorn's 5 s) fires its idle timer late, never early:
/// a close seen then is timed again on the quiet server, and the earlier of the two is its
/// timer.
async fn idle_timeout(idle: AbortOnDrop<Result<checks::KeepAlive, String>>, p: &Probe, report: &mut Report) {
    let mut idle = idle;
    let busy = match (&mut idle.0).await {
        Ok(Ok(k)) => k,
        Ok(Err(e)) => return report.notes.push(format!("keep-alive: {e}")),
        Err(e) => return report.notes.push(format!("keep-alive: {e}")),
    };
    report.keep_alive = busy.keep_alive;
    if busy.keep_alive && busy.idle_timeout.is_none() {
        report.notes.push(format!(
            "idle timeout > {:.0} s: an idle connection was still open when the probe stopped waiting",
            busy.waited.as_secs_f64()
        ));
    }
    let mut closed = busy.idle_timeout;
    if let Some(first) = busy.idle_timeout {
        match checks::keep_alive(&p.target, &p.budget, first + QUIET_MARGIN).await {
            Ok(quiet) => closed = earlier_close(first, quiet.idle_timeout),
            Err(e) => report.notes.push(format!("keep-alive, timed again on the quiet server: {e}")),
        }
    }
    report.idle_timeout_s = closed.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
}

/// How much longer than the busy measurement the quiet one waits for the close.
const QUIET_MARGIN: Duration = Duration::from_secs(1);

/// The server's idle timer, from a close timed while it was busy and one timed while it was
/// quiet (`None`: no close within the wait, which the busy close bounds from above).
fn earlier_close(busy: Duration, quiet: Option<Duration>) -> Option<Duration> {
    Some(quiet.map_or(busy, |q| q.min(busy)))
}

/// `/v1/models`' answer.
struct Listing {
    head: Head,
    /// Its `data` entries (none when it had none, or no JSON).
    entries: Vec<Value>,
    /// Why the entries could not be read, when they could not.
    unreadable: Option<String>,
}

/// `GET /v1/models`; an error says what went wrong (refused connection, time-out).
async fn models(target: &Target, budget: &Budget) -> Result<Listing, String> {
    let asked = budget.within(checks::HEAD_LIMIT, "no answer", exchange(target, "GET", "/v1/models", b"")).await;
    let (head, body, _) = asked
        .map_err(|e| format!("GET {}/v1/models: {e}", target.base_url()))?
        .map_err(|e| format!("GET {}/v1/models: {e}", target.base_url()))?;
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    let entries = parsed.as_ref().and_then(|v| v["data"].as_array().cloned());
    let unreadable = match (&entries, head.status) {
        (Some(_), 200) => None,
        (_, status) => Some(format!(
            "GET {}/v1/models answered {status} {}: {:?}",
            target.base_url(),
            head.header("content-type").unwrap_or("(no content type)"),
            String::from_utf8_lossy(&body).chars().take(160).collect::<String>()
        )),
    };
    Ok(Listing { head, entries: entries.unwrap_or_default(), unreadable })
}

/// The `model` every request names: `--model`, none for mlx_lm.server, mlx-vlm's loaded one,
/// or the only one listed. Refuses to guess among several.
fn choose_model(
    options: &ProbeOptions,
    kind: Option<&str>,
    listing: &Result<Listing, String>,
    notes: &mut Vec<String>,
) -> Result<Option<String>, String> {
    if let Some(m) = &options.model {
        return Ok(Some(m.clone()));
    }
    if kind == Some("mlx-lm") {
        notes.push(
            "mlx_lm.server: requests leave out `model`, so it uses its launch --model (any other name, even the \
             absolute path it lists, makes it load the model again under another key)"
                .into(),
        );
        return Ok(None);
    }
    let listing = listing.as_ref().map_err(Clone::clone)?;
    if let Some(why) = &listing.unreadable {
        return Err(format!("{why}: name the model with --model"));
    }
    let ids: Vec<&str> = listing.entries.iter().filter_map(|e| e["id"].as_str()).collect();
    if kind == Some("mlx-vlm") {
        let loaded: Vec<&str> =
            listing.entries.iter().filter(|e| e["loaded"] == true).filter_map(|e| e["id"].as_str()).collect();
        return match loaded.as_slice() {
            [one] => Ok(Some(one.to_string())),
            _ => Err(format!(
                "mlx-vlm lists {} loaded models: name its launch --model with --model (any other name makes it \
                 unload its model)",
                loaded.len()
            )),
        };
    }
    match ids.as_slice() {
        [one] => Ok(Some(one.to_string())),
        [] => {
            Err("/v1/models lists no model: name one with --model (mlx-omni-server: the model's absolute path)".into())
        }
        several => Err(format!(
            "/v1/models lists {} models ({}): name the one the server runs with --model; the probe does not guess \
             (a server may load whatever it is asked for)",
            several.len(),
            several.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        )),
    }
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

/// Whether `model` is a local model directory (an absolute path: a relative one would be read
/// against the probe's working directory, not the gateway's) with a `tokenizer.json`.
fn local_tokenizer(model: &str) -> bool {
    let dir = std::path::Path::new(model);
    dir.is_absolute() && dir.join("tokenizer.json").is_file()
}

/// The server, when its headers say which it is: `mlx-lm` (Python's BaseHTTP) or `mlx-vlm`.
fn kind_from_head(head: &Head) -> Option<String> {
    let server = head.header("server").unwrap_or_default();
    if server.contains("BaseHTTP") {
        Some("mlx-lm".into())
    } else if server.contains("mlx_vlm") {
        Some("mlx-vlm".into())
    } else {
        None
    }
}

/// The server, when a stream's body shows which (docs/wire-facts.md): mlx-vlm's `timings`,
/// vllm-mlx's `generation_metadata`, Rapid-MLX's `metrics.time_to_first_token_ms`,
/// mlx-openai-server's `chatcmpl_` ids with usage on the finish chunk, mlx-omni-server's role on
/// every delta with a doubled finish chunk.
fn kind_from_stream(record: &StreamRecord) -> Option<&'static str> {
    if let Some(kind) = kind_from_head(&record.head) {
        return ["mlx-lm", "mlx-vlm"].into_iter().find(|k| *k == kind);
    }
    if record.any_has("/timings") {
        Some("mlx-vlm")
    } else if record.any_has("/generation_metadata") {
        Some("vllm-mlx")
    } else if record.any_has("/metrics/time_to_first_token_ms") {
        Some("rapid-mlx")
    } else if record.id().is_some_and(|id| id.starts_with("chatcmpl_")) && record.usage_placement() == "finish" {
        Some("mlx-openai-server")
    } else if record.role_chunk() == "every" && record.finish_chunks() > 1 {
        Some("mlx-omni-server")
    } else {
        None
    }
}

/// The unknown-model case: sent only to a server recognised as one that does not unload its
/// model on it, then followed by a request for the right model, which must succeed.
async fn unknown_model(p: &Probe, kind: Option<&str>) -> ErrorCase {
    match kind {
        Some(k @ ("mlx-lm" | "mlx-vlm")) => {
            return ErrorCase::skipped(format!(
                "{k} unloads its model when asked for an unknown one (wire-facts: mlx_lm.server 404, mlx-vlm 400)"
            ));
        }
        None => {
            return ErrorCase::skipped(
                "the server was not recognised: not sent, as some servers unload their model on it (--kind to say which)",
            );
        }
        Some(_) => {}
    }
    let body = chat(Some("mlxgate-probe-no-such-model"), "hello", 2, false, None);
    let mut case = checks::error_case(&p.target, &p.budget, body.to_string().as_bytes()).await;
    let again = checks::error_case(&p.target, &p.budget, p.chat("hello", 2, false, None).to_string().as_bytes()).await;
    if again.status != Some(200) {
        case.skipped = Some(format!(
            "after it, a request for the probed model was answered {}: the server may have lost its model",
            again.status.map_or_else(|| again.skipped.unwrap_or_default(), |s| s.to_string())
        ));
    }
    case
}

/// A chat body cut in the middle.
fn invalid_json(model: Option<&str>) -> String {
    let model = model.map_or(String::new(), |m| format!("\"model\": {}, ", Value::from(m)));
    format!("{{{model}\"messages\": [{{\"role\": \"user\", \"content\": ")
}

/// What the probe knows of the server when it chooses whether to send the cases that a server
/// may take as work without end: a `max_tokens: -1` or an over-long prompt, left at its head.
struct Seen<'a> {
    /// The recognised kind, or the one `--kind` names.
    kind: Option<&'a str>,
    /// `cancels_on_disconnect`.
    cancels: Option<bool>,
    /// The abandoned prompt's answer, read alone, ran on (so a "cancels" is a measurement).
    ran_long: bool,
    /// Two concurrent streams were `batched`: a follow-up is served at once even by a batching
    /// server that generates on, so its "cancels" does not show the abandoned answer stopped.
    batched: bool,
}

impl Seen<'_> {
    fn kind_in(&self, kinds: &[&str]) -> bool {
        self.kind.is_some_and(|k| kinds.contains(&k))
    }

    /// Why `max_tokens: -1` is not sent, or `None` to send it: to a kind known to refuse it, or
    /// to an unrecognised server seen to stop an answer that would have run on, and not batching.
    fn no_negative(&self) -> Option<String> {
        if let Some(k) = self.kind.filter(|k| UNLIMITED_NEGATIVE.contains(k)) {
            return Some(format!("not sent: {k} takes -1 as unlimited (wire-facts: 200, generates until EOS)"));
        }
        if self.kind_in(REFUSE_NEGATIVE) || (self.cancels == Some(true) && self.ran_long && !self.batched) {
            return None;
        }
        Some(
            "not sent: -1 may mean unlimited, and the server is neither a kind known to refuse it (mlx-lm, vllm-mlx, \
             rapid-mlx, mlx-vlm: --kind names it) nor one seen to stop an abandoned answer that would have run on \
             while serving one request at a time"
                .into(),
        )
    }

    /// Why the over-long prompt is not sent, or `None` to send it: to a server seen to cancel on
    /// disconnect, or a kind known to check the length before generating.
    fn no_over_context(&self) -> Option<String> {
        (self.cancels != Some(true) && !self.kind_in(CHECK_CONTEXT)).then(|| {
            "not sent: the server was not seen to cancel on disconnect, nor is it a kind known to check the length \
             before generating (rapid-mlx, mlx-vlm): it could prefill the whole prompt for nobody"
                .into()
        })
    }
}

/// A prompt of more tokens than the context (each " a" is at least one token), streamed with one
/// token asked for and left at its head (the refusals come before any SSE). Sent only as
/// `Seen::no_over_context` allows, and above `OVER_CONTEXT_BOUND` only when `--context` asked for
/// it: most servers do not check and would prefill it in full.
async fn over_context(p: &Probe, context: Option<u64>, named: bool, seen: &Seen<'_>) -> ErrorCase {
    let Some(context) = context else {
        return ErrorCase::skipped("context length unknown: pass --context");
    };
    if context > OVER_CONTEXT_BOUND && !named {
        return ErrorCase::skipped(format!(
            "context {context} > {OVER_CONTEXT_BOUND}: a prompt over it could be prefilled in full; pass --context to send it"
        ));
    }
    if let Some(why) = seen.no_over_context() {
        return ErrorCase::skipped(why);
    }
    let words = usize::try_from(context).unwrap_or(usize::MAX).saturating_add(128);
    checks::status_only(&p.target, &p.budget, &p.chat(&" a".repeat(words), 1, true, None)).await
}

/// `max_tokens: -1`, sent only as `Seen::no_negative` allows (some servers take it as
/// "unlimited"), and left at its head.
async fn negative_max_tokens(p: &Probe, seen: &Seen<'_>) -> ErrorCase {
    if let Some(why) = seen.no_negative() {
        return ErrorCase::skipped(why);
    }
    checks::status_only(&p.target, &p.budget, &p.chat("hello", -1, true, None)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(kind: Option<&str>, cancels: Option<bool>, ran_long: bool, batched: bool) -> Seen<'_> {
        Seen { kind, cancels, ran_long, batched }
    }

    #[test]
    fn a_late_busy_close_gives_way_to_the_quiet_one_and_bounds_a_missing_one() {
        let (busy, quiet) = (Duration::from_millis(5700), Duration::from_millis(5010));
        assert_eq!(earlier_close(busy, Some(quiet)), Some(quiet));
        assert_eq!(earlier_close(quiet, Some(busy)), Some(quiet), "a timer fires late, never early");
        assert_eq!(earlier_close(busy, None), Some(busy));
    }

    #[test]
    fn minus_one_goes_only_to_refusing_kinds_or_a_server_seen_to_stop_a_long_answer() {
        for kind in REFUSE_NEGATIVE {
            assert_eq!(seen(Some(kind), None, false, true).no_negative(), None, "{kind}");
        }
        for kind in UNLIMITED_NEGATIVE {
            let why = seen(Some(kind), Some(true), true, false).no_negative();
            assert!(why.is_some_and(|w| w.contains("unlimited")), "{kind}");
        }
        for kind in [None, Some("custom"), Some("omlx")] {
            assert_eq!(seen(kind, Some(true), true, false).no_negative(), None, "{kind:?}");
            assert!(seen(kind, Some(true), false, false).no_negative().is_some(), "{kind:?}: ended early");
            assert!(seen(kind, Some(true), true, true).no_negative().is_some(), "{kind:?}: batching");
            assert!(seen(kind, None, false, false).no_negative().is_some(), "{kind:?}: not measured");
            assert!(seen(kind, Some(false), false, false).no_negative().is_some(), "{kind:?}: generates on");
        }
    }

    #[test]
    fn the_over_long_prompt_goes_only_to_a_server_seen_to_cancel_or_a_checking_kind() {
        for kind in CHECK_CONTEXT {
            assert_eq!(seen(Some(kind), None, false, false).no_over_context(), None, "{kind}");
        }
        assert_eq!(seen(Some("mlx-lm"), Some(true), true, false).no_over_context(), None);
        for cancels in [None, Some(false)] {
            for kind in [None, Some("mlx-openai-server"), Some("mlx-lm")] {
                assert!(seen(kind, cancels, false, false).no_over_context().is_some(), "{kind:?} {cancels:?}");
            }
        }
    }
}
