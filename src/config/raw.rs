//! gateway.yaml as serde reads it: the raw types (`deny_unknown_fields`, every key optional
//! where the file may leave it out), durations (`30s`) and sizes (`64MiB`). Sections whose
//! entries are checked one by one (`backends`, `models`, `clients`, …) stay YAML values here,
//! so that a mistake in one entry does not hide the problems of the others.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml::Value;

use crate::kinds::Kind;
use crate::tokens::OnOverflow;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) metrics_listen: Option<String>,
    pub(super) shutdown_grace: Option<RawDuration>,
    pub(super) max_body: Option<RawSize>,
    pub(super) swap_after: Option<RawDuration>,
    pub(super) header_read_timeout: Option<RawDuration>,
    pub(super) max_connections_per_client: Option<usize>,
    pub(super) body_read_timeout: Option<RawDuration>,
    pub(super) access_log: Option<bool>,
    #[serde(default)]
    pub(super) backends: BTreeMap<String, Value>,
    #[serde(default)]
    pub(super) models: BTreeMap<String, Value>,
    pub(super) auth: Option<Value>,
    #[serde(default)]
    pub(super) clients: BTreeMap<String, Value>,
    pub(super) default_limits: Option<Value>,
    pub(super) admin_key_sha256: Option<Value>,
    pub(super) rate_limit_store: Option<Value>,
    pub(super) aliases: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) url: Option<String>,
    pub(super) kind: Option<Kind>,
    pub(super) model: Option<String>,
    pub(super) port: Option<u16>,
    pub(super) command: Option<Vec<String>>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    pub(super) venv: Option<String>,
    pub(super) ready: Option<RawReady>,
    pub(super) idle_timeout: Option<RawDuration>,
    pub(super) preload: Option<bool>,
    pub(super) gpu: Option<bool>,
    pub(super) drain_timeout: Option<RawDuration>,
    pub(super) stop_timeout: Option<RawDuration>,
    pub(super) max_restarts: Option<u32>,
    pub(super) restart_window: Option<RawDuration>,
    pub(super) health: Option<RawHealth>,
    pub(super) max_concurrency: Option<usize>,
    pub(super) connect_timeout: Option<RawDuration>,
    pub(super) response_timeout: Option<RawDuration>,
    pub(super) first_byte_timeout: Option<RawDuration>,
    pub(super) stream_idle_timeout: Option<RawDuration>,
    pub(super) context_cap: Option<usize>,
    pub(super) normalise: Option<RawNormalise>,
}

/// A backend's `normalise:` switches; each one left out keeps the kind's default.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNormalise {
    pub(super) pool_idle_timeout: Option<RawDuration>,
    pub(super) loopback_host: Option<bool>,
    pub(super) serialize: Option<bool>,
    pub(super) hold_abandoned: Option<bool>,
    pub(super) finish_length: Option<bool>,
    pub(super) single_finish: Option<bool>,
    pub(super) stream_options: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReady {
    pub(super) path: Option<String>,
    pub(super) timeout: Option<RawDuration>,
    pub(super) warmup: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) interval: Option<RawDuration>,
    pub(super) timeout: Option<RawDuration>,
    pub(super) failures: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) backend: String,
    pub(super) default_max_tokens: Option<u32>,
    pub(super) upstream_model: Option<String>,
    pub(super) max_queue: Option<usize>,
    pub(super) max_wait: Option<RawDuration>,
    pub(super) on_overflow: Option<OnOverflow>,
    pub(super) min_room: Option<u32>,
    pub(super) tokenizer: Option<String>,
}

/// A duration written as `30s`, `5m`, `1h 30m`.
#[derive(Clone, Copy)]
pub(super) struct RawDuration(pub(super) Duration);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)
            .map_err(|_| serde::de::Error::custom("a duration is written with its unit, like 30s or 5m"))?;
        humantime::parse_duration(text.trim())
            .map(RawDuration)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e}); write it like 30s or 5m")))
    }
}

/// A size written as `64MiB`, `512KB` or a number of bytes.
pub(super) struct RawSize(pub(super) usize);

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let parsed = match &value {
            Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
            Value::String(s) => parse_size(s),
            _ => None,
        };
        parsed.map(RawSize).ok_or_else(|| serde::de::Error::custom("a size is a number of bytes or like 64MiB, 512KB"))
    }
}

pub(super) fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: usize = digits.parse().ok()?;
    let factor: usize = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(factor)
}
