//! gateway.yaml as plain data: the file is read, `${VAR}` substituted ([`env`]), deserialized
//! into raw serde types with `deny_unknown_fields` ([`raw`]), and checked by one `validate()`
//! ([`validate`], a backend's own keys in [`backend`]) into the immutable [`Config`] the gateway
//! runs on ([`types`]); relative paths are then taken from the file's directory ([`paths`]).
//!
//! Every problem in a file is reported at once, each with its YAML path
//! (`models.qwen.backend: no backend named "qwen-local"`), so a user fixes the file in one pass
//! ([`problem`]). Clients, keys and limits are checked in [`clients`], `aliases:` in [`aliases`].

mod aliases;
mod backend_keys;
mod clients;
mod env;
pub mod env_file;
mod paths;
mod problem;
mod raw;
pub mod schema;
mod types;
mod validate;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use serde_yaml::Value;

use env::{Env, substitute_env};
use problem::typed;
use raw::RawConfig;

pub use crate::kinds::launch::MANAGED_HOST;
pub use aliases::Aliases;
pub use clients::{ANONYMOUS, AuthMode, ClientConfig, KeyHash, Limits, RateLimitStore, RedisUrl};
pub use problem::{ConfigError, Problem};
pub use raw::parse_size;
pub use types::{
    BackendConfig, BalanceConfig, BalancePolicy, Config, DEFAULT_LOADING_SHARE, HealthCheck, ManagedConfig,
    ModelConfig, RemoteHealth,
};

impl Config {
    /// Reads, substitutes `${VAR}` from the process environment, and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with(path, None)
    }

    /// As [`load`](Config::load), for a file meant for another process's environment (`mlxgate
    /// reload` checks the running gateway's file): a `${VAR}` without a default that is unset
    /// here gets a placeholder and its name goes into `unset`, rather than being a problem.
    pub fn load_elsewhere(path: &Path, unset: &RefCell<BTreeSet<String>>) -> Result<Config, ConfigError> {
        Config::load_with(path, Some(unset))
    }

    /// As [`load_elsewhere`](Config::load_elsewhere), with `${VAR}` answered by `lookup` first
    /// (the other process's environment file), then by this process's environment.
    pub fn load_elsewhere_with(
        path: &Path,
        unset: &RefCell<BTreeSet<String>>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::load_from(
            path,
            &Env { lookup: &|name| lookup(name).or_else(|| std::env::var(name).ok()), unset: Some(unset) },
        )
    }

    /// As [`load`](Config::load), with `${VAR}` answered by `lookup` (`mlxgate service install`
    /// checks the file against the environment the service will have).
    pub fn load_with_env(path: &Path, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::load_from(path, &Env { lookup, unset: None })
    }

    fn load_with(path: &Path, unset: Option<&RefCell<BTreeSet<String>>>) -> Result<Config, ConfigError> {
        Config::load_from(path, &Env { lookup: &|name| std::env::var(name).ok(), unset })
    }

    fn load_from(path: &Path, env: &Env<'_>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let mut config = Config::parse_env(&text, env)?;
        paths::resolve(&mut config, path);
        Ok(config)
    }

    /// Parses YAML text; `env` answers `${VAR}` look-ups (tests pass their own).
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::parse_env(text, &Env { lookup: env, unset: None })
    }

    fn parse_env(text: &str, env: &Env<'_>) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let mut root: Value = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Invalid(vec![Problem { path: "(file)".into(), reason: e.to_string() }]))?;
        if root.is_null() {
            root = Value::Mapping(Default::default());
        }
        substitute_env(&mut root, &mut Vec::new(), env, &mut problems);
        let raw: Option<RawConfig> = typed(root, "", &mut problems);
        let config = raw.and_then(|raw| validate::validate(raw, &mut problems));
        match config {
            Some(config) if problems.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }
}

#[cfg(test)]
mod tests;
