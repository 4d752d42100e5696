//! The statistics of `mlxgate bench`, pure: one request's figures from what its stream showed
//! (wall tokens/s, TTFT, decode tokens/s or a burst), a group of requests released together
//! (its aggregate tokens/s), medians over repeats and the batching speedup. No I/O, no clock:
//! the runner records the instants, this module computes.
//!
//! Tokens are always the server's `usage.completion_tokens`; the count of frames that carried
//! output is kept beside it for comparison and never stands in for it (a server that sends no
//! usage gets no tokens/s at all rather than a frame rate).

use std::time::Instant;

use serde::Serialize;

use crate::stream::figures::StreamFigures;

/// What one streamed request showed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// From sending the request to the first frame with generated text, reasoning or a tool
    /// call (role-only chunks, comments and keepalives do not count), in seconds.
    pub ttft_seconds: Option<f64>,
    /// From sending the request to the end of its body, in seconds.
    pub wall_seconds: f64,
    /// The server's `usage.completion_tokens` (its last usage); `None` when it sent none.
    pub completion_tokens: Option<u64>,
    /// The server's `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// The server's `usage.prompt_tokens_details.cached_tokens`, when it reports them.
    pub cached_tokens: Option<u64>,
    /// Frames that carried output: for comparison only, never a token count.
    pub output_frames: u64,
    /// (tokens − 1) / (last output frame − first output frame), from usage's tokens; `None` for
    /// a burst, for fewer than two tokens, or without usage.
    pub decode_tokens_per_second: Option<f64>,
    /// Most output frames arrived together (within one read or [`super::run::BURST_WINDOW`]):
    /// the stream's timing says nothing about decode speed.
    pub burst: bool,
    /// Why the request failed (an HTTP error, an error event, a cut stream, a timeout).
    pub error: Option<String>,
}

impl Sample {
    /// The figures of a stream sent at `sent` whose body ended at `ended`. A stream with an
    /// error event, or that ended before `[DONE]` or a `finish_reason`, is a failure.
    pub fn measured(sent: Instant, ended: Instant, figures: &StreamFigures) -> Sample {
        let error = match (&figures.error, figures.complete()) {
            (Some(message), _) => Some(format!("error event: {message}")),
            (None, false) => Some("the stream ended before [DONE] or a finish_reason".to_string()),
            (None, true) => None,
        };
        Sample {
            ttft_seconds: figures.first_token.map(|t| t.saturating_duration_since(sent).as_secs_f64()),
            wall_seconds: ended.saturating_duration_since(sent).as_secs_f64(),
            completion_tokens: figures.tokens(),
            prompt_tokens: figures.prompt_tokens,
            cached_tokens: figures.cached_tokens,
            output_frames: figures.token_frames,
            decode_tokens_per_second: figures.decode_tokens_per_second(),
            burst: figures.is_burst(),
            error,
        }
    }

    /// A request that failed before its stream could be read.
    pub fn failed(wall_seconds: f64, why: String) -> Sample {
        Sample { wall_seconds, error: Some(why), ..Sample::default() }
    }

    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Completion tokens / wall time: what the user of this one request saw.
    pub fn wall_tokens_per_second(&self) -> Option<f64> {
        let tokens = self.completion_tokens?;
        (self.ok() && self.wall_seconds > 0.0).then(|| tokens as f64 / self.wall_seconds)
    }
}

/// Requests released together at one instant (one request for the `single` runs).
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// From the release to the end of the last body, in seconds.
    pub wall_seconds: f64,
    /// From the first request sent to the last, in seconds: how simultaneous the release was.
    pub sent_spread_seconds: f64,
    pub samples: Vec<Sample>,
}

impl Group {
    /// Every request's completion tokens over the group's wall time; `None` when any request
    /// failed or sent no usage (a partial sum would flatter the server).
    pub fn aggregate_tokens_per_second(&self) -> Option<f64> {
        let mut tokens = 0;
        for sample in &self.samples {
            if !sample.ok() {
                return None;
            }
            tokens += sample.completion_tokens?;
        }
        (self.wall_seconds > 0.0 && !self.samples.is_empty()).then(|| tokens as f64 / self.wall_seconds)
    }

    /// The median of `figure` over the group's requests; `None` when any request failed (as
    /// in [`summarize`], a survivor of a failed group ran alone).
    pub fn median_of(&self, figure: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        if !self.samples.iter().all(Sample::ok) {
            return None;
        }
        median(self.samples.iter().filter_map(figure))
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut sorted: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) { (sorted[mid - 1] + sorted[mid]) / 2.0 } else { sorted[mid] })
}

/// Medians over the repeats of one run (one scenario, one prompt size, one endpoint). The
/// figures come from the groups whose every request succeeded: the survivor of a pair whose
/// other request failed at once ran alone, and would pass a single run's speed off as the
/// pair's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Requests sent, and how many of them failed.
    pub requests: usize,
    pub failed: usize,
    /// Successful requests left out of the figures because another of their group failed.
    pub left_out: usize,
    /// Median over the measured requests of completion tokens / wall time.
    pub wall_tokens_per_second: Option<f64>,
    /// Median time to first token, seconds.
    pub ttft_seconds: Option<f64>,
    /// Median decode speed over the requests that were not bursts.
    pub decode_tokens_per_second: Option<f64>,
    /// Requests whose output arrived in a burst (no decode speed from them).
    pub bursts: usize,
    /// Median of usage's completion tokens.
    pub completion_tokens: Option<f64>,
    /// Median of frames that carried output (for comparison with the tokens, never as them).
    pub output_frames: Option<f64>,
    /// Median of usage's prompt tokens.
    pub prompt_tokens: Option<f64>,
    /// Median of usage's cached prompt tokens, when the server reports them: the requests of
    /// a group carry the same prompt, so a server that runs them one after the other serves
    /// the later ones from its prompt cache (a speedup that is not batching).
    pub cached_tokens: Option<f64>,
    /// Measured requests that succeeded without `usage.completion_tokens`.
    pub without_usage: usize,
    /// Median over the groups of all their requests' tokens / the group's wall time.
    pub aggregate_tokens_per_second: Option<f64>,
}

/// The medians of `groups` (the repeats of one run).
pub fn summarize(groups: &[Group]) -> Summary {
    let samples = || groups.iter().flat_map(|g| &g.samples);
    let complete = || groups.iter().filter(|g| g.samples.iter().all(Sample::ok));
    let ok = || complete().flat_map(|g| &g.samples);
    let failed = samples().filter(|s| !s.ok()).count();
    Summary {
        requests: samples().count(),
        failed,
        left_out: samples().count() - failed - ok().count(),
        wall_tokens_per_second: median(ok().filter_map(Sample::wall_tokens_per_second)),
        ttft_seconds: median(ok().filter_map(|s| s.ttft_seconds)),
        decode_tokens_per_second: median(ok().filter_map(|s| s.decode_tokens_per_second)),
        bursts: ok().filter(|s| s.burst).count(),
        completion_tokens: median(ok().filter_map(|s| s.completion_tokens.map(|t| t as f64))),
        output_frames: median(ok().map(|s| s.output_frames as f64)),
        prompt_tokens: median(ok().filter_map(|s| s.prompt_tokens.map(|t| t as f64))),
        cached_tokens: median(ok().filter_map(|s| s.cached_tokens.map(|t| t as f64))),
        without_usage: ok().filter(|s| s.completion_tokens.is_none()).count(),
        aggregate_tokens_per_second: median(groups.iter().filter_map(Group::aggregate_tokens_per_second)),
    }
}

/// The batching speedup: the median over repeats of the concurrent group's aggregate tokens/s
/// over the single group's of the same repeat (run just before it, at the same prompt size).
/// 1.0: batching gained nothing; below 1.0: running together was slower than one after the
/// other. Repeats where either group failed have no speedup.
pub fn speedup(concurrent: &[Group], single: &[Group]) -> Option<f64> {
    median(speedups(concurrent, single).into_iter().flatten())
}

/// Each repeat's speedup (`None` where either group failed), in the repeats' order.
pub fn speedups(concurrent: &[Group], single: &[Group]) -> Vec<Option<f64>> {
    let each = |(c, s): (&Group, &Group)| ratio(c.aggregate_tokens_per_second(), s.aggregate_tokens_per_second());
    concurrent.iter().zip(single).map(each).collect()
}

/// The median over repeats of `figure(b) / figure(a)` of the same repeat: repeats that ran
/// side by side share the machine's state of the moment, so the ratio of a pair is robust to
/// a drift that a ratio of two medians would take for a difference. Repeats where either
/// side has no figure are left out.
pub fn paired_ratio(b: &[Group], a: &[Group], figure: impl Fn(&Group) -> Option<f64>) -> Option<f64> {
    median(b.iter().zip(a).filter_map(|(b, a)| ratio(figure(b), figure(a))))
}

/// `b / a` when both are known and `a` is not zero.
pub fn ratio(b: Option<f64>, a: Option<f64>) -> Option<f64> {
    match (b, a) {
        (Some(b), Some(a)) if a != 0.0 => Some(b / a),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A stream's figures from recorded timings: `reads` are (milliseconds after the send,
    /// output frames that arrived together then); `usage` the server's completion tokens.
    fn recorded(reads: &[(u64, u64)], usage: Option<u64>, end_ms: u64) -> Sample {
        let sent = Instant::now();
        let at = |ms: u64| sent + Duration::from_millis(ms);
        let mut figures = StreamFigures { metered: true, done: true, completion_tokens: usage, ..Default::default() };
        for &(ms, frames) in reads {
            figures.first_token.get_or_insert(at(ms));
            figures.last_token = Some(at(ms));
            figures.token_frames += frames;
            figures.max_frames_in_one_read = figures.max_frames_in_one_read.max(frames);
        }
        Sample::measured(sent, at(end_ms), &figures)
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9 * b.abs().max(1.0))
    }

    #[test]
    fn medians_of_odd_even_and_empty_sets() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([7.0]), Some(7.0));
        assert_eq!(median([]), None);
        assert_eq!(median([f64::NAN, 5.0]), Some(5.0), "a NaN is no figure");
    }

    #[test]
    fn a_spread_stream_gives_ttft_wall_and_decode_speed_from_usage() {
        // 11 tokens, one frame every 20 ms from 200 ms on: 50 tokens/s of decode.
        let reads: Vec<(u64, u64)> = (0..11).map(|i| (200 + 20 * i, 1)).collect();
        let s = recorded(&reads, Some(11), 500);
        assert!(s.ok());
        assert!(close(s.ttft_seconds, 0.2));
        assert!(close(s.decode_tokens_per_second, 10.0 / 0.2));
        assert!(close(s.wall_tokens_per_second(), 11.0 / 0.5));
        assert!(!s.burst);
    }

    #[test]
    fn decode_speed_counts_usage_tokens_not_frames() {
        // A server that puts 3 tokens in each frame: 4 frames over 300 ms, 12 tokens.
        let s = recorded(&[(100, 1), (200, 1), (300, 1), (400, 1)], Some(12), 400);
        assert!(close(s.decode_tokens_per_second, 11.0 / 0.3));
        assert_eq!(s.output_frames, 4);
        // No usage: no tokens and no speed, whatever the frames.
        let s = recorded(&[(100, 1), (200, 1), (300, 1)], None, 300);
        assert_eq!((s.completion_tokens, s.decode_tokens_per_second, s.wall_tokens_per_second()), (None, None, None));
        let summary = summarize(&[Group { wall_seconds: 0.3, sent_spread_seconds: 0.0, samples: vec![s] }]);
        assert_eq!(summary.completion_tokens, None);
        assert_eq!(summary.aggregate_tokens_per_second, None);
        assert_eq!(summary.output_frames, Some(3.0));
    }

    #[test]
    fn most_frames_at_once_is_a_burst_with_no_decode_speed() {
        // 14 of 16 frames in one read at the end: the "14000 tokens/s" of a detokenizer burst.
        let s = recorded(&[(100, 1), (110, 1), (900, 14)], Some(16), 900);
        assert!(s.burst);
        assert_eq!(s.decode_tokens_per_second, None);
        assert!(s.wall_tokens_per_second().is_some(), "wall speed stays true");
        // Under half together is no burst.
        let s = recorded(&[(100, 3), (200, 3), (300, 2)], Some(8), 300);
        assert!(!s.burst);
        let bursts = summarize(&[Group {
            wall_seconds: 0.9,
            sent_spread_seconds: 0.0,
            samples: vec![recorded(&[(100, 1), (900, 15)], Some(16), 900), s],
        }]);
        assert_eq!(bursts.bursts, 1);
        assert!(close(bursts.decode_tokens_per_second, 7.0 / 0.2), "only the spread stream's speed");
    }

    #[test]
    fn a_stream_without_its_end_or_with_an_error_event_is_a_failure() {
        let sent = Instant::now();
        let cut = StreamFigures { completion_tokens: Some(3), choices_seen: vec![0], ..Default::default() };
        assert!(!Sample::measured(sent, sent, &cut).ok());
        let error = StreamFigures { done: true, error: Some("boom".into()), ..Default::default() };
        assert_eq!(Sample::measured(sent, sent, &error).error.as_deref(), Some("error event: boom"));
    }

    #[test]
    fn paired_ratios_are_taken_within_each_repeat() {
        // 20 tokens in `ms`: A's repeats at 10, 20 and 40 tokens/s, B's at 12, 30 and 44
        // (B 1.2, 1.5 and 1.1 times A of the same repeat): the paired figure is 1.2, where the
        // medians' ratio would be 30 / 20 = 1.5.
        let alone = |ms: u64| Group {
            wall_seconds: ms as f64 / 1e3,
            sent_spread_seconds: 0.0,
            samples: vec![recorded(&[(10, 1), (ms, 1)], Some(20), ms)],
        };
        let a: Vec<Group> = [2000, 1000, 500].map(alone).to_vec();
        let b: Vec<Group> = [20_000 / 12, 20_000 / 30, 20_000 / 44].map(alone).to_vec();
        let wall = |g: &Group| g.median_of(Sample::wall_tokens_per_second);
        let paired = paired_ratio(&b, &a, wall).expect("a ratio");
        assert!((paired - 1.2).abs() < 0.01, "{paired}");
        assert!((paired_ratio(&b, &a, Group::aggregate_tokens_per_second).expect("a ratio") - 1.2).abs() < 0.01);
        // A repeat where one side failed is left out, not counted as a ratio.
        let mut b_failed = b.clone();
        b_failed[0].samples.push(Sample::failed(0.1, "HTTP 503".into()));
        let left = paired_ratio(&b_failed, &a, wall).expect("a ratio");
        assert!((left - 1.3).abs() < 0.01, "the median of 1.5 and 1.1: {left}");
        assert_eq!(paired_ratio(&[], &a, wall), None);
    }

    #[test]
    fn speedup_is_the_median_over_repeats_of_the_aggregate_over_the_single_run() {
        let one = |ms: u64| recorded(&[(100, 1), (ms, 1)], Some(20), ms);
        let group = |wall: f64, samples: Vec<Sample>| Group { wall_seconds: wall, sent_spread_seconds: 0.0, samples };
        // Single: 20 tokens in 1 s, in 2 s and in 0.8 s: 20, 10 and 25 tokens/s.
        let single: Vec<Group> = [1000, 2000, 800].iter().map(|&ms| group(ms as f64 / 1e3, vec![one(ms)])).collect();
        // Double: 40 tokens within 1 s, 2 s and 0.8 s: 40, 20 and 50 tokens/s, twice each
        // single of its repeat (a slow machine in repeat 2 slowed both).
        let double = vec![
            group(1.0, vec![one(990), one(1000)]),
            group(2.0, vec![one(1900), one(2000)]),
            group(0.8, vec![one(700), one(800)]),
        ];
        assert!(close(speedup(&double, &single), 2.0), "paired by repeat");
        let (single_summary, double_summary) = (summarize(&single), summarize(&double));
        assert!(close(single_summary.aggregate_tokens_per_second, 20.0));
        assert!(close(double_summary.aggregate_tokens_per_second, 40.0));
        assert_eq!(double_summary.requests, 6);
        // The median of the repeats' speedups, not a ratio of medians: singles at 40, 5 and
        // 12.5 tokens/s, doubles at 40, 10 and 200 give speedups 1, 2 and 16 (median 2) where
        // the medians' ratio would be 40 / 12.5 = 3.2.
        let uneven = vec![
            group(1.0, vec![one(990), one(1000)]),
            group(4.0, vec![one(3900), one(4000)]),
            group(0.2, vec![one(150), one(200)]),
        ];
        let uneven_single: Vec<Group> =
            [500, 4000, 1600].iter().map(|&ms| group(ms as f64 / 1e3, vec![one(ms)])).collect();
        assert!(close(speedup(&uneven, &uneven_single), 2.0), "{:?}", speedup(&uneven, &uneven_single));
        // A failed request takes its group out of the aggregate, not half of it in, and its
        // repeat out of the speedup.
        let failed = group(0.5, vec![one(500), Sample::failed(0.1, "HTTP 503".into())]);
        assert_eq!(failed.aggregate_tokens_per_second(), None);
        // Nor does its survivor count: it ran alone from 0.1 s on.
        let with_failure = summarize(&[failed.clone(), double[1].clone()]);
        assert_eq!((with_failure.requests, with_failure.failed, with_failure.left_out), (4, 1, 1));
        assert!(
            close(with_failure.wall_tokens_per_second, (20.0 / 1.9 + 20.0 / 2.0) / 2.0),
            "the complete pair's only"
        );
        assert!(close(speedup(&[failed, double[1].clone()], &single[..2]), 2.0));
        assert_eq!(speedup(&double, &[]), None);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
    }
}
