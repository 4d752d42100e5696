//! Counting benchmark: how long mlxgate takes to count a chat prompt's tokens with a real
//! 248k-token vocabulary (Qwen3.6's, built by `scripts/setup-backends tokens` into
//! `.cache/qwen3.6-tokenizer`), for chat requests of about 1k, 10k and 53k tokens.
//!
//! `cargo bench --bench count_tokens` prints one table row per (size, way of counting): the
//! median and p95 of N timed runs after a warm-up. The ways of counting are the gateway's
//! `Counter::chat_tokens` (template render + encode), the render alone, the tokenizers crate's
//! raw `encode_fast` and `encode` of the rendered prompt text, and the same text cut at exact
//! pre-tokenizer boundaries into two halves encoded on two threads. The goal of issue 8:
//! the 53k-token count well under a backend round trip, ≤ 30 ms on the project's 2-core machine.
//!
//! `COUNT_TOKENS_DIR` overrides the tokenizer directory; `COUNT_TOKENS_RUNS` the number of runs.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

/// The gateway's own allocator (src/main.rs), so the figures are the gateway's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The sizes measured, in tokens of the rendered prompt.
const SIZES: [usize; 3] = [1_000, 10_000, 53_000];

/// About how many tokens each piece has when the text is counted in pieces.
const PIECE_TOKENS: usize = 2_000;

/// A long system prompt in the style of coding agents.
const SYSTEM: &str = "You are an expert software engineer working in a user's repository. \
Follow the user's instructions precisely. Prefer small, reviewable changes; explain the reason for \
each change in one sentence; never invent APIs; when unsure, read the code first. Answer in the \
language of the question. Format code as fenced blocks with the language named.\n";

/// Prose: sentences picked by a fixed pseudo-random sequence.
const PROSE: [&str; 12] = [
    "The gateway queues requests per model and hands each one to the backend that holds the GPU.",
    "When a prompt exceeds the context window, the request is rejected before it reaches the server.",
    "Latency figures are measured at the first byte of the stream, not when the headers arrive.",
    "A swap unloads one model and loads another; it costs seconds, so the scheduler batches work.",
    "Each client key has its own budget of requests and tokens per minute.",
    "The simulator answers like a real server, with delays and failures set by each test.",
    "Middle-out keeps the system prompt and the first question, and drops the oldest turns.",
    "Counting must agree with the server's tokenizer, or the cap is either too strict or too loose.",
    "Restarting a crashed backend takes as long as loading its weights from the disk cache.",
    "The keeper process outlives the gateway, so a restart does not kill the model servers.",
    "Metrics are exported in the Prometheus text format on a separate listener.",
    "Streams are forwarded byte for byte; only the meter reads the events as they pass.",
];

/// Unicode text: CJK, Cyrillic, accents, emoji.
const UNICODE: [&str; 5] = [
    "网关按模型排队请求，并把每个请求交给持有GPU的后端。上下文超过上限时，请求在到达服务器之前就被拒绝。",
    "日本語の説明：ゲートウェイはモデルごとにリクエストを並べ、GPUを持つバックエンドに渡します。",
    "Шлюз ставит запросы в очередь для каждой модели и передаёт их серверу, который держит GPU.",
    "Café, naïve, façade, Ångström, señor — déjà vu; ½ ≤ ∞ ≠ π ≈ 3.14159.",
    "Status: ✅ ready 🚀 fast ⚠️ warning 🔥 hot 👍🏽 ok 🇫🇷 fr 🤖 bot ✨ — done.",
];

/// Source code: the gateway's own modules (real Rust as a user would paste it).
const CODE: [&str; 4] = [
    include_str!("../src/config/clients.rs"),
    include_str!("../src/error.rs"),
    include_str!("../src/metrics.rs"),
    include_str!("../src/tokens/mod.rs"),
];

fn main() {
    let dir = std::env::var_os("COUNT_TOKENS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".cache/qwen3.6-tokenizer"));
    let file = dir.join("tokenizer.json");
    if !file.is_file() {
        eprintln!("count_tokens: skipped: no {} (build it with `scripts/setup-backends tokens`)", file.display());
        return;
    }
    let started = Instant::now();
    let tokenizer = Tokenizer::from_file(&file).expect("tokenizer.json loads");
    println!(
        "count_tokens: {} ({} tokens in the vocabulary) loaded in {:.0} ms; {}",
        file.display(),
        tokenizer.get_vocab_size(true),
        started.elapsed().as_secs_f64() * 1e3,
        machine()
    );
    // The text measured is already NFC (as most is): the same tokenizer without its NFC
    // normalizer gives the same ids, which tells what normalizing costs.
    let mut without_normalizer = tokenizer.clone();
    without_normalizer.with_normalizer(None::<tokenizers::NormalizerWrapper>).expect("a tokenizer without normalizer");
    let counter = Counter::load(&dir).expect("Counter loads the tokenizer directory");

    let mut rows = Vec::new();
    for target in SIZES {
        let messages = chat_request(&counter, target);
        let text = render(&counter, &messages);
        let tokens = count(&tokenizer, &text);
        assert_eq!(
            counter.chat_tokens(prompt(&messages)).expect("counts"),
            tokens,
            "Counter::chat_tokens and the raw encode disagree"
        );
        let runs = runs_for(tokens);
        let label = format!("{}k", (tokens + 500) / 1000);
        rows.push(Row::time(&label, tokens, "Counter::chat_tokens", runs, || {
            counter.chat_tokens(prompt(&messages)).expect("counts")
        }));
        rows.push(Row::time(&label, tokens, "raw encode_fast", runs, || count(&tokenizer, &text)));
        rows.push(Row::time(&label, tokens, "raw encode (offsets)", runs, || {
            tokenizer.encode(text.as_str(), false).expect("encodes").len()
        }));
        let nfc_skipped = count(&without_normalizer, &text);
        assert_eq!(nfc_skipped, tokens, "the bench text is NFC: NFC must change nothing");
        rows.push(Row::time(&label, tokens, "encode_fast, NFC skipped", runs, || count(&without_normalizer, &text)));
        rows.push(Row::time(&label, tokens, "encode_fast, 1 spawned thread", runs, || {
            count_parallel(&tokenizer, &[text.as_str()])
        }));
        let halves = split_exact(&text, 2);
        let split_count = count_parallel(&tokenizer, &halves);
        assert_eq!(split_count, tokens, "cutting at pre-tokenizer boundaries changed the count");
        rows.push(Row::time(&label, tokens, "encode_fast 2 threads", runs, || count_parallel(&tokenizer, &halves)));
        let pieces = split_exact(&text, tokens.div_ceil(PIECE_TOKENS));
        assert_eq!(
            pieces.iter().map(|piece| count(&tokenizer, piece)).sum::<usize>(),
            tokens,
            "cutting at pre-tokenizer boundaries changed the count"
        );
        rows.push(Row::time(&label, tokens, "encode_fast ~2k-token pieces", runs, || {
            pieces.iter().map(|piece| count(&tokenizer, piece)).sum()
        }));
        rows.push(Row::time(&label, tokens, "Counter::render (template)", runs, || render(&counter, &messages).len()));
    }
    print_table(&rows);
}

/// Tokens of `text` as the server tokenizes a rendered chat prompt (no special tokens added).
fn count(tokenizer: &Tokenizer, text: &str) -> usize {
    tokenizer.encode_fast(text, false).expect("encodes").len()
}

/// Counts pieces of one text on one thread each and adds the counts.
fn count_parallel(tokenizer: &Tokenizer, pieces: &[&str]) -> usize {
    std::thread::scope(|scope| {
        let handles: Vec<_> = pieces.iter().map(|piece| scope.spawn(move || count(tokenizer, piece))).collect();
        handles.into_iter().map(|handle| handle.join().expect("counting thread")).sum()
    })
}

/// Cuts `text` into about `parts` pieces whose token counts add up to the whole's: each cut
/// is right after a newline that a letter follows. No pre-tokenizer match crosses there (the
/// Qwen pattern's newline alternatives end at the letter, its letter alternative cannot start
/// with a newline), no special token holds a newline, and NFC does not join a newline with a
/// letter.
fn split_exact(text: &str, parts: usize) -> Vec<&str> {
    let mut pieces = Vec::with_capacity(parts);
    let mut start = 0;
    for part in 1..parts {
        let mut at = (text.len() * part / parts).max(start);
        while at < text.len() && !cut_here(text, at) {
            at += 1;
        }
        if at >= text.len() {
            break;
        }
        pieces.push(&text[start..at]);
        start = at;
    }
    pieces.push(&text[start..]);
    pieces
}

fn cut_here(text: &str, at: usize) -> bool {
    text.is_char_boundary(at)
        && text[..at].ends_with('\n')
        && text[at..].chars().next().is_some_and(char::is_alphabetic)
}

/// A chat request of about `target` rendered tokens: a system prompt, then turns of prose,
/// code and unicode text, grown until the rendered prompt reaches the target.
fn chat_request(counter: &Counter, target: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let mut turn = 0;
    loop {
        let content = turn_text(turn, &mut seed);
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": content}));
        let rendered = counter.chat_tokens(prompt(&messages)).expect("counts");
        if rendered >= target {
            trim_last_to(counter, &mut messages, target);
            if role == "assistant" {
                messages.push(json!({"role": "user", "content": "Summarise the above."}));
            }
            return messages;
        }
        turn += 1;
    }
}

/// Cuts the last message's text (bisecting on its length) so that the rendered prompt has
/// about `target` tokens.
fn trim_last_to(counter: &Counter, messages: &mut [Value], target: usize) {
    let Some(last) = messages.len().checked_sub(1) else {
        return;
    };
    let text = messages[last]["content"].as_str().unwrap_or_default().to_owned();
    let (mut low, mut high) = (0, text.len());
    while high - low > 16 {
        let mid = floor_char_boundary(&text, (low + high) / 2);
        messages[last]["content"] = Value::String(text[..mid].to_owned());
        let rendered = counter.chat_tokens(prompt(messages)).expect("counts");
        if rendered > target {
            high = mid;
        } else {
            low = mid.max(low + 1);
        }
    }
    messages[last]["content"] = Value::String(text[..floor_char_boundary(&text, low)].to_owned());
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// One turn's text: prose with a code block and a unicode paragraph.
fn turn_text(turn: usize, seed: &mut u64) -> String {
    let mut text = String::new();
    for _ in 0..12 {
        text.push_str(PROSE[next(seed) % PROSE.len()]);
        text.push(' ');
    }
    text.push_str("\n\n");
    text.push_str(UNICODE[turn % UNICODE.len()]);
    text.push_str("\n\n```rust\n");
    text.push_str(CODE[turn % CODE.len()]);
    text.push_str("```\n\nWhat does this code do, and what would you change?\n");
    text
}

/// xorshift64: a fixed pseudo-random sequence, so every run measures the same text.
fn next(seed: &mut u64) -> usize {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 33) as usize
}

/// A chat request's prompt without tools or template arguments.
fn prompt(messages: &[Value]) -> ChatPrompt<'_> {
    ChatPrompt { messages, tools: None, template_kwargs: None }
}

/// The chat prompt's text as the model's template renders it.
fn render(counter: &Counter, messages: &[Value]) -> String {
    counter.render(prompt(messages)).expect("the template renders")
}

fn runs_for(tokens: usize) -> usize {
    std::env::var("COUNT_TOKENS_RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(if tokens > 20_000 {
        40
    } else {
        100
    })
}

/// One measured way of counting one prompt.
struct Row {
    size: String,
    tokens: usize,
    what: &'static str,
    runs: usize,
    median: Duration,
    p95: Duration,
}

impl Row {
    /// Warms up, then times `runs` calls of `work`.
    fn time(size: &str, tokens: usize, what: &'static str, runs: usize, mut work: impl FnMut() -> usize) -> Row {
        for _ in 0..3 {
            black_box(work());
        }
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let started = Instant::now();
                black_box(work());
                started.elapsed()
            })
            .collect();
        times.sort();
        let p95 = times[((runs * 95).div_ceil(100)).saturating_sub(1).min(runs - 1)];
        Row { size: size.to_owned(), tokens, what, runs, median: times[runs / 2], p95 }
    }
}

fn print_table(rows: &[Row]) {
    println!("\n| prompt | tokens | counting | runs | median ms | p95 ms |\n|---|---:|---|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} |",
            row.size,
            row.tokens,
            row.what,
            row.runs,
            row.median.as_secs_f64() * 1e3,
            row.p95.as_secs_f64() * 1e3
        );
    }
}

/// The CPU model and core count, for the report.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|name| name.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores")
}
