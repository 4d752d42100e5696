//! `mlxgate bench`: what users see of a model's server, measured right (the scenarios of the
//! 2026 "eight MLX servers on a Mac" study). `single` sends prompts of each size one after
//! another; `double` and `parallel:N` then release 2 or N identical streamed requests at one
//! instant. Per scenario and prompt size it reports medians over repeats of wall tokens/s, TTFT,
//! decode tokens/s (usage's tokens over the spread of their arrival; bursts flagged, frames
//! never counted as tokens) and the batching speedup; `--compare` runs a second endpoint
//! interleaved and gives the ratios.
//!
//! `prompts` makes the prompts, `run` sends them and reads the streams, `stats` computes,
//! `report` prints the table and the JSON.

pub mod prompts;
pub mod report;
pub mod run;
pub mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use prompts::PromptMaker;
use report::Report;
use run::{Endpoint, Plan};

/// Which requests run together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// One request at a time.
    Single,
    /// Two identical requests released together (after the single one, the speedup's baseline).
    Double,
    /// N identical requests released together.
    Parallel(usize),
}

impl Scenario {
    /// Parses `single`, `double` or `parallel:N` (N ≥ 2: `parallel:1` would be `single`).
    pub fn parse(text: &str) -> Result<Scenario, String> {
        match text {
            "single" => Ok(Scenario::Single),
            "double" => Ok(Scenario::Double),
            other => other
                .strip_prefix("parallel:")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n >= 2)
                .map(Scenario::Parallel)
                .ok_or_else(|| format!("{other:?}: expected single, double or parallel:N (N ≥ 2)")),
        }
    }

    /// Requests released together.
    pub fn concurrency(self) -> usize {
        match self {
            Scenario::Single => 1,
            Scenario::Double => 2,
            Scenario::Parallel(n) => n,
        }
    }

    /// The scenario as written on the command line.
    pub fn name(self) -> String {
        match self {
            Scenario::Single => "single".into(),
            Scenario::Double => "double".into(),
            Scenario::Parallel(n) => format!("parallel:{n}"),
        }
    }
}

/// The options of `mlxgate bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// The server's OpenAI base URL (http://host:port/v1); requests go to its /chat/completions.
    #[arg(long)]
    pub url: String,
    /// The model name sent to it.
    #[arg(long)]
    pub model: String,
    /// single: one request at a time; double: then two identical requests released at the same
    /// instant; parallel:N: then N of them.
    #[arg(long, default_value = "single", value_parser = Scenario::parse)]
    pub scenario: Scenario,
    /// Repeats of each prompt size (figures are medians over them).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Prompt sizes in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000,53000")]
    pub prompt_tokens: Vec<usize>,
    /// Tokens to generate per request (max_tokens; a model may stop earlier: usage says).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Write the report as JSON to this file too.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A second base URL (e.g. the same server through mlxgate), run interleaved with the first
    /// (A B, B A, A B…); the table ends with B / A ratios.
    #[arg(long)]
    pub compare: Option<String>,
    /// The model name sent to --compare (default: --model), e.g. mlxgate's public name.
    #[arg(long)]
    pub compare_model: Option<String>,
    /// Sent as `Authorization: Bearer KEY` to both endpoints.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The model's directory with tokenizer.json, to size prompts exactly (default: the model
    /// name as a local directory or a Hugging Face id in the local cache; else prompts are sized
    /// from the first server's usage.prompt_tokens for two calibration prompts; else estimated).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Unmeasured requests sent to each endpoint first (a server may load its model then).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Longest a request may take.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

impl BenchOptions {
    /// Refuses what would measure nothing (clap checks the types, this the values).
    fn check(&self) -> Result<(), String> {
        if self.repeats == 0 {
            return Err("--repeats 0: nothing would be measured (at least 1)".into());
        }
        if self.max_tokens == 0 {
            return Err("--max-tokens 0: nothing would be generated (at least 1)".into());
        }
        if self.compare_model.is_some() && self.compare.is_none() {
            return Err("--compare-model names the model of --compare, which is missing".into());
        }
        if self.timeout.is_zero() {
            return Err("--timeout 0s: every request would time out".into());
        }
        if self.prompt_tokens.contains(&0) {
            return Err("--prompt-tokens: a prompt has at least 1 token".into());
        }
        Ok(())
    }

    /// What to send.
    fn plan(&self) -> Plan {
        let base = |url: &str| url.trim_end_matches('/').to_string();
        let mut endpoints = vec![Endpoint { label: "A", url: base(&self.url), model: self.model.clone() }];
        if let Some(url) = &self.compare {
            let model = self.compare_model.clone().unwrap_or_else(|| self.model.clone());
            endpoints.push(Endpoint { label: "B", url: base(url), model });
        }
        Plan {
            endpoints,
            prompt_sizes: self.prompt_tokens.clone(),
            repeats: self.repeats,
            concurrency: self.scenario.concurrency(),
            max_tokens: self.max_tokens,
            warmup: self.warmup,
            api_key: self.api_key.clone(),
            timeout: self.timeout,
        }
    }
}

/// Runs `mlxgate bench`: the table on stdout, the JSON to `--json`. Exit code 1 when any
/// request failed or answered without usage (the figures are printed all the same), or the
/// run could not start.
pub fn main(options: BenchOptions) -> ExitCode {
    if let Err(e) = options.check() {
        eprintln!("mlxgate bench: {e}");
        return ExitCode::FAILURE;
    }
    let mut prompts = match PromptMaker::load(options.tokenizer.as_deref(), &options.model) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mlxgate bench: --tokenizer: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !prompts.has_tokenizer() {
        eprintln!(
            "mlxgate bench: no tokenizer found for {:?} (give --tokenizer DIR): prompt sizes are \
             calibrated against the server's own count of two prompts",
            options.model
        );
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mlxgate bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let plan = options.plan();
    let progress = progress_bar(run::steps(&plan));
    let measured = runtime.block_on(run::measure(&plan, &mut prompts, &progress));
    progress.finish_and_clear();
    let measured = match measured {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mlxgate bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sizing = prompts.sizing();
    if let prompts::Sizing::Estimate { why } = &sizing {
        eprintln!("mlxgate bench: prompt sizes are estimated (a token per word): {why}");
    }
    let report = Report::new(options.scenario.name(), &plan, sizing, measured);
    print!("{}", report.table());
    if let Some(path) = &options.json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(path, text));
        if let Err(e) = written {
            eprintln!("mlxgate bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    for line in report.oversized_prompts() {
        eprintln!("mlxgate bench: {line}");
    }
    let without_usage = report.without_usage();
    if !without_usage.is_empty() {
        eprintln!(
            "mlxgate bench: no tokens/s where the server sent no usage.completion_tokens (it was asked \
             for with stream_options.include_usage; frames are not tokens, so none are counted):"
        );
        for line in &without_usage {
            eprintln!("  {line}");
        }
    }
    let failed = report.failed();
    if failed > 0 {
        eprintln!(
            "mlxgate bench: {failed} requests failed (the figures leave out every request of a group \
             where one failed):"
        );
        for line in report.failures(10) {
            eprintln!("  {line}");
        }
        return ExitCode::FAILURE;
    }
    if without_usage.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// A progress bar on stderr when it is a terminal; hidden otherwise (logs, pipes, tests).
fn progress_bar(steps: u64) -> ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse() {
        assert_eq!(Scenario::parse("single"), Ok(Scenario::Single));
        assert_eq!(Scenario::parse("double").map(Scenario::concurrency), Ok(2));
        assert_eq!(Scenario::parse("parallel:8"), Ok(Scenario::Parallel(8)));
        assert!(Scenario::parse("parallel:0").is_err());
        assert!(Scenario::parse("parallel:1").is_err(), "that is single");
        assert!(Scenario::parse("triple").is_err());
    }
}
