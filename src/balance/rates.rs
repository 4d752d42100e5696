//! What one backend's answers showed, as moving averages with priors: prefill tokens per second
//! (`(prompt − cached) ÷ (first token − the answering attempt's send)`), decode tokens per second and the mean
//! completion length ([`Rates`]); and, for the model (its tokenizer's, whichever backend
//! answered), prompt tokens per byte of a [`Prompt`](super::Prompt)'s size ([`Ewma`] with
//! [`PRIOR_TOKENS_PER_BYTE`]). A rate's prior is replaced by the first answer's figure (rates
//! differ by orders of magnitude between a Mac and a CPU, and a prior averaged in would stay
//! wrong for many answers); after that each answer weighs [`ALPHA`] once a few are in. A
//! backend whose answers taught it no prefill rate yet takes the rate its model's other
//! backends measured ([`Balancer`](super::Balancer) does), before the prior.

use std::time::Duration;

/// The weight of a new sample once a few are in.
pub const ALPHA: f64 = 0.2;

/// Prefill tokens per second before any answer (a Mac: hundreds to a few thousand).
pub const PRIOR_PREFILL_PER_S: f64 = 500.0;
/// Decode tokens per second before any answer.
pub const PRIOR_DECODE_PER_S: f64 = 20.0;
/// Prompt tokens per byte before any answer (English text and JSON: about 3.5 bytes a token).
pub const PRIOR_TOKENS_PER_BYTE: f64 = 1.0 / 3.5;
/// Completion tokens before any answer.
pub const PRIOR_COMPLETION_TOKENS: f64 = 200.0;

/// A rate's sample counts at most this many times above or below the rate it updates (the
/// prior, for the first): a Mac at 3000 tokens/s and a CPU at 20 are both within reach of the
/// prior, while one answer that stalled for an hour moves the rate by this factor at most, and
/// the next answers bring it back.
pub const MAX_SAMPLE_FACTOR: f64 = 32.0;

/// A prefill sample needs at least this many uncached tokens: below it, the time to the first
/// token is mostly the server's fixed cost, not prefill.
pub const MIN_PREFILL_SAMPLE: u64 = 64;

/// An exponentially weighted moving average with a prior.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ewma {
    value: f64,
    /// Samples taken, the prior counted as one when it is averaged in.
    samples: u64,
    /// Whether any sample was taken.
    sampled: bool,
}

impl Ewma {
    /// The average before any sample: `prior`, which then counts as one sample.
    pub fn new(prior: f64) -> Ewma {
        Ewma { value: prior, samples: 1, sampled: false }
    }

    /// The average before any sample: `prior`, which the first sample replaces.
    pub fn until_sampled(prior: f64) -> Ewma {
        Ewma { value: prior, samples: 0, sampled: false }
    }

    /// Takes a sample clamped to within `factor` times the current average, either way.
    pub fn add_bounded(&mut self, sample: f64, factor: f64) {
        if sample.is_finite() && sample >= 0.0 && self.value > 0.0 {
            self.add(sample.clamp(self.value / factor, self.value * factor));
        } else {
            self.add(sample);
        }
    }

    /// Whether any sample was taken (else the value is the prior).
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// Takes a sample; one that is not finite or is negative is ignored.
    pub fn add(&mut self, sample: f64) {
        if !(sample.is_finite() && sample >= 0.0) {
            return;
        }
        self.samples = self.samples.saturating_add(1);
        self.sampled = true;
        let weight = (1.0 / self.samples as f64).max(ALPHA);
        self.value += weight * (sample - self.value);
    }

    /// The average.
    pub fn value(&self) -> f64 {
        self.value
    }
}

/// What an answer showed, as the meter measured it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    /// The whole prompt's tokens, cached ones included (for a server whose `prompt_tokens`
    /// leaves out the cached ones, the caller adds them).
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// From the sending of the attempt that answered to its first token (a streamed answer's
    /// only: a whole answer's first token is its end).
    pub prefill_time: Option<Duration>,
    pub decode_tokens_per_s: Option<f64>,
}

/// One backend's rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    prefill_per_s: Ewma,
    decode_per_s: Ewma,
    completion_tokens: Ewma,
}

impl Default for Rates {
    fn default() -> Rates {
        Rates {
            prefill_per_s: Ewma::until_sampled(PRIOR_PREFILL_PER_S),
            decode_per_s: Ewma::until_sampled(PRIOR_DECODE_PER_S),
            completion_tokens: Ewma::until_sampled(PRIOR_COMPLETION_TOKENS),
        }
    }
}

impl Rates {
    /// Learns from one answer.
    pub fn observe(&mut self, observed: &Observed) {
        if let Some(prompt) = observed.prompt_tokens {
            let uncached = prompt.saturating_sub(observed.cached_tokens.unwrap_or(0));
            if let Some(time) = observed.prefill_time
                && uncached >= MIN_PREFILL_SAMPLE
                && !time.is_zero()
            {
                self.prefill_per_s.add_bounded(uncached as f64 / time.as_secs_f64(), MAX_SAMPLE_FACTOR);
            }
        }
        if let Some(rate) = observed.decode_tokens_per_s.filter(|r| *r > 0.0) {
            self.decode_per_s.add_bounded(rate, MAX_SAMPLE_FACTOR);
        }
        if let Some(tokens) = observed.completion_tokens {
            self.completion_tokens.add(tokens as f64);
        }
    }

    /// Prefill tokens per second.
    pub fn prefill_per_s(&self) -> f64 {
        self.prefill_per_s.value()
    }

    /// Prefill tokens per second if answers taught it one.
    pub fn learnt_prefill_per_s(&self) -> Option<f64> {
        self.prefill_per_s.sampled().then(|| self.prefill_per_s.value())
    }

    /// Decode tokens per second.
    pub fn decode_per_s(&self) -> f64 {
        self.decode_per_s.value()
    }

    /// Mean completion tokens.
    pub fn completion_tokens(&self) -> f64 {
        self.completion_tokens.value()
    }

    /// How long an answer holds a slot, on average: its completion at the decode rate.
    pub fn service(&self) -> Duration {
        Duration::from_secs_f64((self.completion_tokens() / self.decode_per_s()).clamp(0.0, 3600.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prior_gives_way_to_the_first_samples() {
        let mut e = Ewma::new(100.0);
        e.add(300.0);
        assert_eq!(e.value(), 200.0, "the prior counts as one sample");
        for _ in 0..50 {
            e.add(300.0);
        }
        assert!((e.value() - 300.0).abs() < 0.01, "{}", e.value());
    }

    #[test]
    fn a_prior_until_sampled_is_replaced_by_the_first_sample() {
        // A Mac's prior against a CPU's 20 tokens/s: averaged in, the prior would leave the
        // rate 13× too high after one answer.
        let mut e = Ewma::until_sampled(500.0);
        assert!(!e.sampled());
        e.add(20.0);
        assert_eq!(e.value(), 20.0);
        assert!(e.sampled());
        e.add(40.0);
        assert_eq!(e.value(), 30.0, "the second sample weighs a half");
    }

    #[test]
    fn one_absurd_sample_moves_a_rate_by_the_bounded_factor_and_the_next_bring_it_back() {
        let mut r = Rates::default();
        // A first streamed answer that stalled an hour before its first token.
        r.observe(&Observed {
            prompt_tokens: Some(1600),
            cached_tokens: Some(0),
            prefill_time: Some(Duration::from_secs(3600)),
            ..Observed::default()
        });
        assert_eq!(r.prefill_per_s(), PRIOR_PREFILL_PER_S / MAX_SAMPLE_FACTOR);
        // A CPU's real 20 tokens/s is within reach of the prior, and is learnt at once.
        let mut cpu = Rates::default();
        cpu.observe(&Observed {
            prompt_tokens: Some(200),
            cached_tokens: Some(0),
            prefill_time: Some(Duration::from_secs(10)),
            ..Observed::default()
        });
        assert_eq!(cpu.prefill_per_s(), 20.0);
        // The stalled one recovers: its next answers at 1000 tokens/s.
        for _ in 0..8 {
            r.observe(&Observed {
                prompt_tokens: Some(1000),
                cached_tokens: Some(0),
                prefill_time: Some(Duration::from_secs(1)),
                ..Observed::default()
            });
        }
        assert!(r.prefill_per_s() > 500.0, "{}", r.prefill_per_s());
    }

    #[test]
    fn a_later_sample_weighs_alpha() {
        let mut e = Ewma::new(10.0);
        for _ in 0..10 {
            e.add(10.0);
        }
        e.add(20.0);
        assert!((e.value() - (10.0 + ALPHA * 10.0)).abs() < 1e-9);
    }

    #[test]
    fn nonsense_samples_are_ignored() {
        let mut e = Ewma::new(5.0);
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            e.add(bad);
        }
        assert_eq!(e, Ewma::new(5.0));
    }

    #[test]
    fn prefill_is_the_uncached_tokens_over_the_time_to_first_token_after_the_queue() {
        let mut r = Rates::default();
        r.observe(&Observed {
            prompt_tokens: Some(10_000),
            cached_tokens: Some(8_000),
            prefill_time: Some(Duration::from_secs(2)),
            ..Observed::default()
        });
        // The first sample replaces the prior.
        assert_eq!(r.prefill_per_s(), 1000.0);
        assert_eq!(r.learnt_prefill_per_s(), Some(1000.0));
    }

    #[test]
    fn a_mostly_cached_prompt_teaches_no_prefill_rate() {
        let mut r = Rates::default();
        r.observe(&Observed {
            prompt_tokens: Some(10_000),
            cached_tokens: Some(9_990),
            prefill_time: Some(Duration::from_millis(300)),
            ..Observed::default()
        });
        assert_eq!(r.prefill_per_s(), PRIOR_PREFILL_PER_S);
        assert_eq!(r.learnt_prefill_per_s(), None);
    }

    #[test]
    fn service_is_the_mean_completion_at_the_decode_rate() {
        let mut r = Rates::default();
        assert_eq!(r.service(), Duration::from_secs_f64(PRIOR_COMPLETION_TOKENS / PRIOR_DECODE_PER_S));
        for _ in 0..100 {
            r.observe(&Observed {
                completion_tokens: Some(100),
                decode_tokens_per_s: Some(50.0),
                ..Observed::default()
            });
        }
        assert!((r.service().as_secs_f64() - 2.0).abs() < 0.01, "{:?}", r.service());
    }
}
