//! What `mlxgate bench` tells: the medians of each endpoint, prompt size and phase as a table
//! (stdout) and as JSON (`--json`), the batching speedup, and with `--compare` the ratios of B
//! to A. The JSON also carries every request's own sample, for whoever wants other statistics.

use std::fmt::Write as _;

use serde::Serialize;

use super::prompts::Sizing;
use super::run::{Measured, Plan};
use super::stats::{Group, Sample, Summary, median, paired_ratio, ratio, speedup, speedups, summarize};

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `single`, `double` or `parallel:N`.
    pub scenario: String,
    /// Requests released together in the concurrent phase (1 for `single`).
    pub concurrency: usize,
    pub repeats: usize,
    pub max_tokens: u32,
    /// How the prompts were sized: with the model's tokenizer, calibrated against the
    /// server's own count, or estimated.
    pub prompt_sizing: Sizing,
    pub endpoints: Vec<EndpointReport>,
    /// B / A per prompt size, with `--compare`: medians over repeats of the ratio within
    /// each repeat.
    pub ratios: Vec<Ratios>,
}

/// One endpoint's figures.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointReport {
    pub label: String,
    pub url: String,
    pub model: String,
    pub sizes: Vec<SizeReport>,
}

/// One prompt size on one endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    /// The size asked for.
    pub prompt_tokens_target: usize,
    /// Median tokens of the prompts sent, as counted or predicted here (see `prompt_sizing`).
    pub prompt_tokens_sent: Option<f64>,
    /// The requests sent alone.
    pub single: Summary,
    /// The requests released together (`null` for `single`).
    pub concurrent: Option<Summary>,
    /// Median over repeats of the aggregate tokens/s together over alone (of the same repeat).
    pub speedup: Option<f64>,
    /// Every group as measured.
    pub single_groups: Vec<Group>,
    pub concurrent_groups: Vec<Group>,
}

/// B / A at one prompt size.
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub prompt_tokens_target: usize,
    pub single: PhaseRatios,
    pub concurrent: Option<PhaseRatios>,
    pub speedup: Option<f64>,
}

/// B / A of one phase: for each figure, the median over repeats of B's over A's of the same
/// repeat (the two ran one right after the other), each side's figure being the median over
/// the requests of its group.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRatios {
    pub wall_tokens_per_second: Option<f64>,
    pub ttft_seconds: Option<f64>,
    pub decode_tokens_per_second: Option<f64>,
    pub aggregate_tokens_per_second: Option<f64>,
}

impl PhaseRatios {
    fn paired(b: &[Group], a: &[Group]) -> PhaseRatios {
        PhaseRatios {
            wall_tokens_per_second: paired_ratio(b, a, |g| g.median_of(Sample::wall_tokens_per_second)),
            ttft_seconds: paired_ratio(b, a, |g| g.median_of(|s| s.ttft_seconds)),
            decode_tokens_per_second: paired_ratio(b, a, |g| g.median_of(|s| s.decode_tokens_per_second)),
            aggregate_tokens_per_second: paired_ratio(b, a, Group::aggregate_tokens_per_second),
        }
    }
}

impl Report {
    /// The report of `measured`, run as `plan` says.
    pub fn new(scenario: String, plan: &Plan, prompt_sizing: Sizing, measured: Measured) -> Report {
        let endpoints: Vec<EndpointReport> = plan
            .endpoints
            .iter()
            .zip(measured.runs)
            .map(|(endpoint, runs)| EndpointReport {
                label: endpoint.label.to_string(),
                url: endpoint.url.clone(),
                model: endpoint.model.clone(),
                sizes: plan.prompt_sizes.iter().zip(runs).map(|(&target, r)| size_report(target, r)).collect(),
            })
            .collect();
        let ratios = match endpoints.as_slice() {
            [a, b] => a.sizes.iter().zip(&b.sizes).map(|(a, b)| size_ratios(a, b)).collect(),
            _ => Vec::new(),
        };
        Report {
            scenario,
            concurrency: plan.concurrency,
            repeats: plan.repeats,
            max_tokens: plan.max_tokens,
            prompt_sizing,
            endpoints,
            ratios,
        }
    }

    /// Requests that failed, over every endpoint and size.
    pub fn failed(&self) -> usize {
        let per_size = |s: &SizeReport| s.single.failed + s.concurrent.as_ref().map_or(0, |c| c.failed);
        self.endpoints.iter().flat_map(|e| &e.sizes).map(per_size).sum()
    }

    /// Distinct failure messages, each with the endpoint it came from (at most `limit`).
    pub fn failures(&self, limit: usize) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for endpoint in &self.endpoints {
            for size in &endpoint.sizes {
                let groups = size.single_groups.iter().chain(&size.concurrent_groups);
                for error in groups.flat_map(|g| &g.samples).filter_map(|s| s.error.as_ref()) {
                    let line = format!("{} at {} tokens: {error}", endpoint.label, size.prompt_tokens_target);
                    if !seen.contains(&line) && seen.len() < limit {
                        seen.push(line);
                    }
                }
            }
        }
        seen
    }

    /// One line per endpoint, size and phase whose answers succeeded without
    /// `usage.completion_tokens`, with the output frames they carried (shown, never counted).
    pub fn without_usage(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for endpoint in &self.endpoints {
            for size in &endpoint.sizes {
                let phases = [("single", Some(&size.single)), ("together", size.concurrent.as_ref())];
                for (phase, summary) in phases {
                    let Some(s) = summary else { continue };
                    if s.without_usage > 0 {
                        let answered = s.requests - s.failed - s.left_out;
                        lines.push(format!(
                            "{} at {} tokens ({phase}): {} of {answered} answers without usage, {} output frames each (median)",
                            endpoint.label,
                            size.prompt_tokens_target,
                            s.without_usage,
                            figure(s.output_frames, 0),
                        ));
                    }
                }
            }
        }
        lines
    }

    /// A line per prompt size whose prompts came out well above the size asked for: the chat
    /// template, the tag and the closing request alone are more (e.g. `--prompt-tokens 10`).
    pub fn oversized_prompts(&self) -> Vec<String> {
        let Some(first) = self.endpoints.first() else { return Vec::new() };
        first
            .sizes
            .iter()
            .filter_map(|size| {
                let sent = size.prompt_tokens_sent?;
                let target = size.prompt_tokens_target as f64;
                (sent > target * 1.1 + 5.0).then(|| {
                    format!(
                        "--prompt-tokens {}: the prompts had {sent:.0} tokens (the chat template, the \
                         request's tag and its closing ask alone are about that many)",
                        size.prompt_tokens_target
                    )
                })
            })
            .collect()
    }

    /// The table printed at the end.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}, {} repeats, max_tokens {}, prompts sized by {}; medians over repeats",
            self.scenario, self.repeats, self.max_tokens, self.prompt_sizing
        );
        let _ = writeln!(
            out,
            "srv prompt: the prompt's tokens as the server counted them (usage.prompt_tokens); cached: \
             of them, served from its prompt cache (the requests released together share a prompt)"
        );
        for endpoint in &self.endpoints {
            let _ = writeln!(out, "\n{}: {} (model {})", endpoint.label, endpoint.url, endpoint.model);
            let _ = writeln!(
                out,
                "{:>7} {:>9} {:>6} {:>6} {:>10} {:>8} {:>10} {:>7} {:>10} {:>8} {:>11} {:>7}",
                "prompt",
                "run",
                "reqs",
                "failed",
                "wall tok/s",
                "TTFT s",
                "decode t/s",
                "bursts",
                "aggr tok/s",
                "speedup",
                "srv prompt",
                "cached"
            );
            for size in &endpoint.sizes {
                row(&mut out, size.prompt_tokens_target, "single", &size.single, None);
                if let Some(c) = &size.concurrent {
                    row(&mut out, size.prompt_tokens_target, &format!("×{}", self.concurrency), c, size.speedup);
                }
            }
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(
                out,
                "\nB / A, medians over repeats of the ratio within a repeat (above 1: B faster, except \
                 TTFT: above 1, B slower to answer)"
            );
            let _ = writeln!(
                out,
                "{:>7} {:>9} {:>10} {:>8} {:>10} {:>10} {:>8}",
                "prompt", "run", "wall tok/s", "TTFT", "decode t/s", "aggr tok/s", "speedup"
            );
            for r in &self.ratios {
                ratio_row(&mut out, r.prompt_tokens_target, "single", &r.single, None);
                if let Some(c) = &r.concurrent {
                    ratio_row(&mut out, r.prompt_tokens_target, &format!("×{}", self.concurrency), c, r.speedup);
                }
            }
        }
        out
    }
}

fn size_report(target: usize, runs: super::run::SizeRuns) -> SizeReport {
    let single = summarize(&runs.single);
    let concurrent = (!runs.concurrent.is_empty()).then(|| summarize(&runs.concurrent));
    SizeReport {
        prompt_tokens_target: target,
        prompt_tokens_sent: median(runs.prompt_tokens_sent.iter().map(|&t| t as f64)),
        speedup: speedup(&runs.concurrent, &runs.single),
        single,
        concurrent,
        single_groups: runs.single,
        concurrent_groups: runs.concurrent,
    }
}

fn size_ratios(a: &SizeReport, b: &SizeReport) -> Ratios {
    Ratios {
        prompt_tokens_target: a.prompt_tokens_target,
        single: PhaseRatios::paired(&b.single_groups, &a.single_groups),
        concurrent: (!a.concurrent_groups.is_empty() && !b.concurrent_groups.is_empty())
            .then(|| PhaseRatios::paired(&b.concurrent_groups, &a.concurrent_groups)),
        // Per repeat too: B's speedup over A's of the same repeat.
        speedup: median(
            speedups(&b.concurrent_groups, &b.single_groups)
                .into_iter()
                .zip(speedups(&a.concurrent_groups, &a.single_groups))
                .filter_map(|(b, a)| ratio(b, a)),
        ),
    }
}

/// A figure with `decimals`, or `-` when unknown.
fn figure(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

fn row(out: &mut String, prompt: usize, run: &str, s: &Summary, speedup: Option<f64>) {
    let decode = match (s.decode_tokens_per_second, s.bursts) {
        (None, b) if b > 0 => "burst".to_string(),
        (d, _) => figure(d, 1),
    };
    let _ = writeln!(
        out,
        "{prompt:>7} {run:>9} {:>6} {:>6} {:>10} {:>8} {decode:>10} {:>7} {:>10} {:>8} {:>11} {:>7}",
        s.requests,
        s.failed,
        figure(s.wall_tokens_per_second, 1),
        figure(s.ttft_seconds, 3),
        s.bursts,
        figure(s.aggregate_tokens_per_second, 1),
        figure(speedup, 2),
        figure(s.prompt_tokens, 0),
        figure(s.cached_tokens, 0),
    );
}

fn ratio_row(out: &mut String, prompt: usize, run: &str, r: &PhaseRatios, speedup: Option<f64>) {
    let _ = writeln!(
        out,
        "{prompt:>7} {run:>9} {:>10} {:>8} {:>10} {:>10} {:>8}",
        figure(r.wall_tokens_per_second, 3),
        figure(r.ttft_seconds, 3),
        figure(r.decode_tokens_per_second, 3),
        figure(r.aggregate_tokens_per_second, 3),
        figure(speedup, 3),
    );
}
