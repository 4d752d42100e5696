//! OpenAI's rate-limit headers, from the limiter's decisions: `x-ratelimit-{limit,remaining,
//! reset}-{requests,tokens}` on every response, and on a 429 `Retry-After` (whole seconds,
//! rounded up), `retry-after-ms` (which the `openai` SDKs read first), or `x-should-retry: false`
//! when waiting cannot help (the SDKs then give up at once instead of retrying).

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::gcra::Decision;

/// The `x-ratelimit-*` headers for the request and token buckets a client has (either may be
/// unlimited, and then has no headers).
pub fn rate_limit_headers(requests: Option<&Decision>, tokens: Option<&Decision>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (unit, decision) in [("requests", requests), ("tokens", tokens)] {
        let Some(d) = decision else { continue };
        insert(&mut headers, &format!("x-ratelimit-limit-{unit}"), &d.limit.to_string());
        insert(&mut headers, &format!("x-ratelimit-remaining-{unit}"), &d.remaining.to_string());
        insert(&mut headers, &format!("x-ratelimit-reset-{unit}"), &openai_duration(d.reset_after));
    }
    headers
}

/// Adds a 429's advice: when to come back, or that coming back will not help (`None`).
pub fn add_retry_headers(headers: &mut HeaderMap, retry_after: Option<Duration>) {
    match retry_after {
        Some(wait) => {
            insert(headers, "retry-after", &retry_after_secs(wait).to_string());
            insert(headers, "retry-after-ms", &wait.as_millis().max(1).to_string());
        }
        None => insert(headers, "x-should-retry", "false"),
    }
}

/// `Retry-After` in whole seconds, rounded up, at least 1 (a client told 0 retries at once).
pub fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    whole.max(1)
}

/// A duration in OpenAI's header format (Go's `time.Duration` text, to the millisecond, rounded
/// up): `0s`, `12ms`, `1s`, `8.64s`, `6m0s`, `1h2m3.5s`.
pub fn openai_duration(d: Duration) -> String {
    let millis = d.as_nanos().div_ceil(1_000_000);
    if millis == 0 {
        return "0s".into();
    }
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let (hours, rest) = (millis / 3_600_000, millis % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let seconds = match rest % 1000 {
        0 => format!("{}s", rest / 1000),
        frac => format!("{}.{}s", rest / 1000, format!("{frac:03}").trim_end_matches('0')),
    };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

fn insert(headers: &mut HeaderMap, name: &str, value: &str) {
    // Names are the constants above and values are digits and letters: both always valid.
    if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations_read_as_openai_writes_them() {
        assert_eq!(openai_duration(Duration::ZERO), "0s");
        assert_eq!(openai_duration(Duration::from_nanos(1)), "1ms", "rounded up");
        assert_eq!(openai_duration(ms(12)), "12ms");
        assert_eq!(openai_duration(ms(1000)), "1s");
        assert_eq!(openai_duration(ms(8640)), "8.64s");
        assert_eq!(openai_duration(ms(12_005)), "12.005s");
        assert_eq!(openai_duration(ms(360_000)), "6m0s");
        assert_eq!(openai_duration(ms(86_400)), "1m26.4s");
        assert_eq!(openai_duration(ms(3_723_500)), "1h2m3.5s");
        assert_eq!(openai_duration(ms(3_600_000)), "1h0m0s");
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(retry_after_secs(Duration::from_secs(12)), 12);
        assert_eq!(retry_after_secs(ms(12_001)), 13);
        assert_eq!(retry_after_secs(ms(300)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn headers_for_the_limits_a_client_has() {
        let requests =
            Decision { allowed: false, limit: 5, remaining: 0, reset_after: ms(60_000), retry_after: Some(ms(11_500)) };
        let mut headers = rate_limit_headers(Some(&requests), None);
        add_retry_headers(&mut headers, requests.retry_after);
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(get("x-ratelimit-limit-requests").as_deref(), Some("5"));
        assert_eq!(get("x-ratelimit-remaining-requests").as_deref(), Some("0"));
        assert_eq!(get("x-ratelimit-reset-requests").as_deref(), Some("1m0s"));
        assert_eq!(get("retry-after").as_deref(), Some("12"));
        assert_eq!(get("retry-after-ms").as_deref(), Some("11500"));
        assert_eq!(get("x-ratelimit-limit-tokens"), None, "no token limit, no token headers");
        assert_eq!(get("x-should-retry"), None);

        let mut never = HeaderMap::new();
        add_retry_headers(&mut never, None);
        assert_eq!(never.get("x-should-retry").map(|v| v.as_bytes()), Some(&b"false"[..]));
        assert!(never.get("retry-after").is_none());
    }
}
