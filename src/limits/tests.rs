//! The limiter as a handler sees it, on the memory store with a clock that moves only when told.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::*;

fn limiter(clients: &[(&str, Limits)]) -> (Limiter, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let limiter = Limiter::new(Arc::new(MemoryStore::new(clock.clone())));
    limiter.configure(clients.iter().map(|(name, l)| ((*name).to_owned(), *l)), Limits::default());
    (limiter, clock)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn n(n: u32) -> Option<NonZeroU32> {
    NonZeroU32::new(n)
}

fn rpm(per_minute: u32) -> Limits {
    Limits { rpm: n(per_minute), ..Limits::default() }
}

fn tpm(per_minute: u32) -> Limits {
    Limits { tpm: n(per_minute), ..Limits::default() }
}

#[tokio::test]
async fn the_sixth_request_in_a_minute_is_refused_with_openai_headers() {
    let (limiter, clock) = limiter(&[("aider", rpm(5))]);
    for left in (0..5).rev() {
        let admitted = limiter.admit("aider", 100).await.expect("within the limit");
        assert_eq!(header(admitted.headers(), "x-ratelimit-limit-requests"), Some("5"));
        assert_eq!(header(admitted.headers(), "x-ratelimit-remaining-requests"), Some(&*left.to_string()));
        assert_eq!(admitted.tokens_charged(), 0, "no token limit: nothing to charge");
    }
    clock.advance(Duration::from_millis(500));
    let denied = limiter.admit("aider", 100).await.expect_err("sixth");
    assert_eq!(denied.limit, Limit::Rpm);
    assert_eq!(denied.retry_after, Some(Duration::from_millis(11_500)));
    assert_eq!(header(&denied.headers, "retry-after"), Some("12"), "11.5 s rounded up");
    assert_eq!(header(&denied.headers, "retry-after-ms"), Some("11500"));
    assert_eq!(header(&denied.headers, "x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(header(&denied.headers, "x-ratelimit-reset-requests"), Some("59.5s"));
    assert_eq!(header(&denied.headers, "x-ratelimit-limit-tokens"), None);
    assert!(denied.message.contains("Please try again in 11.5s"), "{}", denied.message);
    assert!(!denied.message.contains("context length"), "never confused with a context error");

    clock.advance(Duration::from_millis(11_500));
    assert!(limiter.admit("aider", 100).await.is_ok(), "one more after 60/5 s");
}

#[tokio::test]
async fn clients_have_buckets_of_their_own() {
    let (limiter, _clock) = limiter(&[("runaway", rpm(2)), ("polite", rpm(2))]);
    assert!(limiter.admit("runaway", 0).await.is_ok());
    assert!(limiter.admit("runaway", 0).await.is_ok());
    assert!(limiter.admit("runaway", 0).await.is_err());
    assert!(limiter.admit("polite", 0).await.is_ok(), "another client is still served");
}

#[tokio::test]
async fn unnamed_clients_get_the_default_limits_and_none_means_unlimited() {
    let (limiter, _clock) = limiter(&[]);
    for _ in 0..1000 {
        let admitted = limiter.admit("anonymous", 10_000).await.expect("unlimited");
        assert!(admitted.headers().is_empty(), "no limits, no rate headers");
    }
    limiter.configure([], rpm(1));
    assert!(limiter.admit("anonymous", 0).await.is_ok());
    assert_eq!(limiter.admit("anonymous", 0).await.map(drop).map_err(|d| d.limit), Err(Limit::Rpm));
}

#[tokio::test]
async fn prompt_tokens_are_charged_up_front_and_settled_to_the_real_usage() {
    let (limiter, clock) = limiter(&[("agent", tpm(1000))]);
    let mut first = limiter.admit("agent", 600).await.expect("600 of 1000");
    assert_eq!(header(first.headers(), "x-ratelimit-remaining-tokens"), Some("400"));
    assert_eq!(header(first.headers(), "x-ratelimit-reset-tokens"), Some("36s"));
    // The estimate was high: the backend counted 450 prompt tokens and generated 50.
    first.settle(450, 50).await;
    assert_eq!(first.tokens_charged(), 500);
    let second = limiter.admit("agent", 500).await.expect("the refund made room");
    assert_eq!(header(second.headers(), "x-ratelimit-remaining-tokens"), Some("0"));
    // It generated more than the bucket held: charged anyway, the client waits it off.
    let mut second = second;
    second.settle(500, 300).await;
    let denied = limiter.admit("agent", 100).await.expect_err("in debt");
    assert_eq!(denied.limit, Limit::Tpm);
    assert_eq!(denied.retry_after, Some(Duration::from_secs(24)), "300 of debt + 100 at 1000/min");
    clock.advance(Duration::from_secs(24));
    assert!(limiter.admit("agent", 100).await.is_ok());
}

#[tokio::test]
async fn settling_twice_corrects_against_the_last_settlement() {
    let (limiter, _clock) = limiter(&[("agent", tpm(1000))]);
    let mut admitted = limiter.admit("agent", 100).await.expect("fits");
    admitted.settle(100, 400).await;
    admitted.settle(100, 200).await;
    assert_eq!(admitted.tokens_charged(), 300);
    assert!(limiter.admit("agent", 700).await.is_ok(), "exactly 300 charged");
    assert!(limiter.admit("agent", 1).await.is_err());
}

#[tokio::test]
async fn a_request_refused_before_the_backend_costs_nothing() {
    let (limiter, _clock) = limiter(&[("agent", Limits { rpm: n(2), tpm: n(1000), concurrency: None })]);
    let admitted = limiter.admit("agent", 900).await.expect("fits");
    admitted.cancel().await;
    let again = limiter.admit("agent", 1000).await.expect("everything was given back");
    assert_eq!(header(again.headers(), "x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(header(again.headers(), "x-ratelimit-remaining-tokens"), Some("0"));
}

#[tokio::test]
async fn a_prompt_larger_than_the_token_limit_is_told_not_to_retry() {
    let (limiter, _clock) = limiter(&[("agent", Limits { rpm: n(5), tpm: n(1000), concurrency: None })]);
    let denied = limiter.admit("agent", 1001).await.expect_err("never fits");
    assert_eq!(denied.limit, Limit::Tpm);
    assert_eq!(denied.retry_after, None);
    assert_eq!(header(&denied.headers, "x-should-retry"), Some("false"));
    assert_eq!(header(&denied.headers, "retry-after"), None);
    assert!(denied.message.starts_with("Request too large"), "{}", denied.message);
    let after = limiter.admit("agent", 0).await.expect("the refusal took no request slot");
    assert_eq!(header(after.headers(), "x-ratelimit-remaining-requests"), Some("4"));
}

#[tokio::test]
async fn a_token_refusal_takes_no_request_slot_and_names_the_longer_wait() {
    let (limiter, clock) = limiter(&[("agent", Limits { rpm: n(2), tpm: n(100), concurrency: None })]);
    assert!(limiter.admit("agent", 100).await.is_ok());
    let denied = limiter.admit("agent", 50).await.expect_err("tokens spent");
    assert_eq!(denied.limit, Limit::Tpm);
    assert_eq!(header(&denied.headers, "x-ratelimit-remaining-requests"), Some("1"), "nothing charged");
    clock.advance(Duration::from_secs(30));
    assert!(limiter.admit("agent", 50).await.is_ok(), "the request slot was still there");
    // Now both are short; the token bucket needs 30 s, the request bucket 0: tokens refuse.
    let denied = limiter.admit("agent", 50).await.expect_err("both short");
    assert_eq!(denied.limit, Limit::Tpm);
    assert_eq!(denied.retry_after, Some(Duration::from_secs(30)));
}

#[tokio::test]
async fn concurrency_permits_are_held_until_the_admission_is_dropped() {
    let (limiter, _clock) = limiter(&[("agent", Limits { concurrency: n(1), rpm: n(100), tpm: None })]);
    let running = limiter.admit("agent", 0).await.expect("first");
    let denied = limiter.admit("agent", 0).await.expect_err("second at once");
    assert_eq!(denied.limit, Limit::Concurrency);
    assert_eq!(header(&denied.headers, "retry-after"), Some("1"));
    assert_eq!(header(&denied.headers, "x-ratelimit-remaining-requests"), Some("99"), "read, not charged");
    drop(running);
    assert!(limiter.admit("agent", 0).await.is_ok(), "the permit went with the admission");
}

#[tokio::test]
async fn a_reload_keeps_the_buckets_and_applies_new_limits() {
    let (limiter, _clock) = limiter(&[("agent", rpm(3))]);
    assert!(limiter.admit("agent", 0).await.is_ok());
    assert!(limiter.admit("agent", 0).await.is_ok());
    limiter.configure([("agent".to_owned(), rpm(2))], Limits::default());
    assert!(limiter.admit("agent", 0).await.is_err(), "two already spent of the new two");
    limiter.configure([("agent".to_owned(), rpm(10))], Limits::default());
    let admitted = limiter.admit("agent", 0).await.expect("raised");
    assert_eq!(header(admitted.headers(), "x-ratelimit-remaining-requests"), Some("7"));
}

#[tokio::test]
async fn a_reload_that_lowers_concurrency_counts_the_requests_already_running() {
    let (limiter, _clock) = limiter(&[("agent", Limits { concurrency: n(3), ..Limits::default() })]);
    let mut running: Vec<Admission> = Vec::new();
    for _ in 0..3 {
        running.push(limiter.admit("agent", 0).await.expect("within 3"));
    }
    limiter.configure([("agent".to_owned(), Limits { concurrency: n(1), ..Limits::default() })], Limits::default());
    assert_eq!(limiter.admit("agent", 0).await.expect_err("3 running, limit 1").limit, Limit::Concurrency);
    running.truncate(1);
    assert!(limiter.admit("agent", 0).await.is_err(), "still 1 running of 1");
    assert!(limiter.precheck("agent", None).await.is_err(), "and the pre-check agrees");
    running.clear();
    let admitted = limiter.admit("agent", 0).await.expect("none running");
    assert!(limiter.admit("agent", 0).await.is_err(), "the new limit holds: 1");
    drop(admitted);
    limiter.configure([("agent".to_owned(), Limits { concurrency: n(2), ..Limits::default() })], Limits::default());
    let _a = limiter.admit("agent", 0).await.expect("raised to 2");
    let _b = limiter.admit("agent", 0).await.expect("raised to 2");
}

#[tokio::test]
async fn the_precheck_refuses_a_client_its_rate_refused_until_one_request_fits_and_charges_nothing() {
    let (limiter, clock) = limiter(&[("runaway", rpm(2)), ("polite", rpm(2))]);
    assert!(limiter.precheck("runaway", None).await.is_ok(), "nothing refused yet");
    let _a = limiter.admit("runaway", 0).await.expect("1 of 2");
    let _b = limiter.admit("runaway", 0).await.expect("2 of 2");
    assert!(limiter.precheck("runaway", None).await.is_ok(), "at the limit but never refused: admit decides");
    let denied = limiter.admit("runaway", 0).await.expect_err("third");
    assert_eq!(denied.retry_after, Some(Duration::from_secs(30)));
    for _ in 0..5 {
        let early = limiter.precheck("runaway", None).await.expect_err("refused before counting");
        assert_eq!(early.limit, Limit::Rpm);
        assert!(early.retry_after.is_some_and(|w| w > Duration::ZERO && w <= Duration::from_secs(30)));
        assert_eq!(header(&early.headers, "x-ratelimit-remaining-requests"), Some("0"));
        assert!(header(&early.headers, "retry-after").is_some());
        assert!(early.message.contains("requests per min (RPM)"), "{}", early.message);
    }
    assert!(limiter.precheck("polite", None).await.is_ok(), "another client is not touched");
    // The bucket refills (the store's clock): the pre-check asks the store and lets it through.
    clock.advance(Duration::from_secs(30));
    assert!(limiter.precheck("runaway", None).await.is_ok());
    let admitted = limiter.admit("runaway", 0).await.expect("one request's worth came back");
    assert_eq!(
        header(admitted.headers(), "x-ratelimit-remaining-requests"),
        Some("0"),
        "the refused pre-checks charged nothing"
    );
}

#[tokio::test]
async fn the_precheck_after_a_token_refusal_waits_only_for_one_token() {
    let (limiter, clock) = limiter(&[("agent", tpm(100))]);
    let _spent = limiter.admit("agent", 90).await.expect("90 of 100");
    let big = limiter.admit("agent", 50).await.expect_err("50 > 10 left");
    assert_eq!(big.limit, Limit::Tpm);
    assert!(limiter.precheck("agent", None).await.is_ok(), "10 tokens are left: a small request may fit");
    let _rest = limiter.admit("agent", 10).await.expect("the last 10");
    let denied = limiter.admit("agent", 20).await.expect_err("none left");
    assert_eq!(denied.retry_after, Some(Duration::from_secs(12)), "20 tokens at 100/min");
    let early = limiter.precheck("agent", None).await.expect_err("not even one token fits");
    assert_eq!(early.limit, Limit::Tpm);
    // One token fits 0.6 s later (60 s / 100), not after the 20 tokens' 12 s.
    assert!(early.retry_after.is_some_and(|w| w <= Duration::from_millis(600)), "{:?}", early.retry_after);
    clock.advance(Duration::from_millis(600));
    assert!(limiter.precheck("agent", None).await.is_ok(), "one token's worth is back");
}

#[tokio::test]
async fn a_reload_forgets_refusals_made_under_the_old_limits() {
    let (limiter, _clock) = limiter(&[("agent", rpm(1))]);
    let _a = limiter.admit("agent", 0).await.expect("1 of 1");
    assert!(limiter.admit("agent", 0).await.is_err());
    assert!(limiter.precheck("agent", None).await.is_err());
    limiter.configure([("agent".to_owned(), rpm(100))], Limits::default());
    assert!(limiter.precheck("agent", None).await.is_ok(), "raised: no refusal on the old limit's word");
    assert!(limiter.admit("agent", 0).await.is_ok());
}

#[tokio::test]
async fn the_precheck_refuses_at_the_concurrency_limit_without_taking_a_slot() {
    let (limiter, _clock) = limiter(&[("agent", Limits { concurrency: n(1), rpm: n(100), tpm: None })]);
    assert!(limiter.precheck("agent", None).await.is_ok());
    assert!(limiter.precheck("agent", None).await.is_ok(), "a pre-check takes no slot");
    let running = limiter.admit("agent", 0).await.expect("first");
    let denied = limiter.precheck("agent", None).await.expect_err("one in flight of one");
    assert_eq!(denied.limit, Limit::Concurrency);
    assert_eq!(header(&denied.headers, "x-ratelimit-remaining-requests"), Some("99"));
    drop(running);
    assert!(limiter.precheck("agent", None).await.is_ok());
}

#[tokio::test]
async fn a_reload_that_sets_a_concurrency_limit_counts_the_requests_already_running() {
    let (limiter, _clock) = limiter(&[("agent", Limits::default())]);
    let running: Vec<Admission> =
        vec![limiter.admit("agent", 0).await.expect("no limit"), limiter.admit("agent", 0).await.expect("no limit")];
    limiter.configure([("agent".to_owned(), Limits { concurrency: n(1), ..Limits::default() })], Limits::default());
    assert_eq!(limiter.admit("agent", 0).await.expect_err("2 running, now 1").limit, Limit::Concurrency);
    drop(running);
    assert!(limiter.admit("agent", 0).await.is_ok());
}

#[tokio::test]
async fn leaving_frees_the_slot_before_the_charge_is_settled() {
    let (limiter, _clock) = limiter(&[("agent", Limits { concurrency: n(1), tpm: n(1000), rpm: None })]);
    let mut first = limiter.admit("agent", 10).await.expect("first");
    first.leave();
    let second = limiter.admit("agent", 10).await.expect("the first left: its slot is free");
    first.settle(10, 5).await;
    assert_eq!(second.tokens_charged(), 10);
}

#[tokio::test]
async fn the_same_body_refused_by_the_token_rate_is_refused_before_it_is_counted() {
    let (limiter, clock) = limiter(&[("agent", tpm(100))]);
    let huge = body_fingerprint(b"a prompt larger than the whole bucket");
    let other = body_fingerprint(b"a short prompt");
    let denied = limiter.admit_body("agent", 150, Some(huge)).await.expect_err("150 > 100 ever");
    assert!(denied.retry_after.is_none());
    let again = limiter.precheck("agent", Some(huge)).await.expect_err("the same body: never fits");
    assert_eq!(again.limit, Limit::Tpm);
    assert_eq!(again.retry_after, None);
    assert_eq!(header(&again.headers, "x-should-retry"), Some("false"));
    assert!(
        again.message.contains("Request too large") && again.message.contains("requested 150"),
        "{}",
        again.message
    );
    assert!(limiter.precheck("agent", Some(other)).await.is_ok(), "another body is counted as usual");
    assert!(limiter.precheck("agent", None).await.is_ok());

    // A body refused for now: refused again until the bucket holds its count.
    let _spent = limiter.admit("agent", 90).await.expect("90 of 100");
    let later = body_fingerprint(b"a prompt of 50 tokens");
    let denied = limiter.admit_body("agent", 50, Some(later)).await.expect_err("10 left");
    assert_eq!(denied.retry_after, Some(Duration::from_secs(24)));
    let again = limiter.precheck("agent", Some(later)).await.expect_err("still 10 left");
    assert!(again.retry_after.is_some_and(|w| w > Duration::ZERO && w <= Duration::from_secs(24)));
    assert!(header(&again.headers, "retry-after").is_some());
    assert!(limiter.precheck("agent", Some(other)).await.is_ok(), "a small body may fit the 10 left");
    clock.advance(Duration::from_secs(24));
    assert!(limiter.precheck("agent", Some(later)).await.is_ok(), "the store says it fits now");
    assert!(limiter.admit_body("agent", 50, Some(later)).await.is_ok());
}

#[tokio::test]
async fn a_reload_forgets_refused_bodies() {
    let (limiter, _clock) = limiter(&[("agent", tpm(100))]);
    let huge = body_fingerprint(b"huge");
    assert!(limiter.admit_body("agent", 150, Some(huge)).await.is_err());
    limiter.configure([("agent".to_owned(), tpm(1000))], Limits::default());
    assert!(limiter.precheck("agent", Some(huge)).await.is_ok(), "it fits the raised limit");
}

#[test]
fn the_store_is_memory_or_redis() {
    assert!(open_store("memory").is_ok_and(|s| s.health() == StoreHealth::Local));
    assert!(open_store("redis://127.0.0.1:6379").is_ok_and(|s| s.health() == StoreHealth::Shared));
    assert!(open_store("memcached://x").is_err());
}
