//! Which tokenizer and which context cap each public model uses, resolved once at start-up:
//! the cap from the backend's `context_cap`, else its kind's own limit, else the model's
//! `config.json`; the tokenizer from the model's `tokenizer:` directory, else the managed
//! backend's model, else the model's `upstream_model` (each a local directory, or a Hugging
//! Face id in the local cache: a `url:` backend on this Mac serving a Hub model is counted with
//! it), else a conservative estimate (said once in the log).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::counter::{Counter, Estimate, LoadError, locate};
use super::{Count, OnOverflow};
use crate::config::{BackendConfig, Config, ModelConfig};

/// How a model's prompts are measured and what happens over its cap.
#[derive(Clone)]
pub struct ModelTokens {
    /// Largest prompt + `max_tokens`; `None`: no cap known, prompts are not counted.
    pub cap: Option<usize>,
    pub on_overflow: OnOverflow,
    /// The model's tokenizer, or the estimate.
    pub counter: Arc<dyn Count>,
    /// Where the tokenizer was loaded from (`None`: the estimate).
    pub source: Option<PathBuf>,
}

/// A model's named tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("models.{model}.tokenizer: {source}")]
    Tokenizer { model: String, source: LoadError },
}

/// Every model's [`ModelTokens`], by public name.
#[derive(Clone, Default)]
pub struct Registry {
    models: BTreeMap<String, ModelTokens>,
}

impl Registry {
    /// Resolves every model of `config`. A `tokenizer:` the file names that cannot be loaded is
    /// an error (the user asked for it); a tokenizer merely not found falls back to the estimate.
    /// Tokenizers shared by several models are loaded once.
    pub fn load(config: &Config) -> Result<Registry, RegistryError> {
        let mut loaded: BTreeMap<PathBuf, Arc<dyn Count>> = BTreeMap::new();
        let mut models = BTreeMap::new();
        for model in config.models.values() {
            let Some(backend) = config.backends.get(&model.backend) else { continue };
            let tokens = resolve(model, backend, &mut loaded)?;
            models.insert(model.name.clone(), tokens);
        }
        Ok(Registry { models })
    }

    /// The model's tokens, if it is configured.
    pub fn get(&self, model: &str) -> Option<&ModelTokens> {
        self.models.get(model)
    }
}

/// Models whose `tokenizer:` directory has no `tokenizer.json` (for `mlxgate check`).
pub fn tokenizer_problems(config: &Config) -> Vec<crate::config::Problem> {
    config
        .models
        .values()
        .filter_map(|m| Some((m, m.tokenizer.as_ref()?)))
        .filter(|(_, dir)| !dir.join("tokenizer.json").is_file())
        .map(|(m, dir)| crate::config::Problem {
            path: format!("models.{}.tokenizer", m.name),
            reason: format!("{} has no tokenizer.json (give the model's directory)", dir.display()),
        })
        .collect()
}

fn resolve(
    model: &ModelConfig,
    backend: &BackendConfig,
    loaded: &mut BTreeMap<PathBuf, Arc<dyn Count>>,
) -> Result<ModelTokens, RegistryError> {
    let explicit = model.tokenizer.clone();
    let dir = explicit.clone().or_else(|| backend_model_dir(backend)).or_else(|| locate(&model.upstream_model));
    let counter = match &dir {
        Some(dir) => match loaded.get(dir) {
            Some(counter) => Some(Arc::clone(counter)),
            None => match Counter::load(dir) {
                Ok(counter) => {
                    let counter: Arc<dyn Count> = Arc::new(counter);
                    loaded.insert(dir.clone(), Arc::clone(&counter));
                    Some(counter)
                }
                Err(source) if explicit.is_some() => {
                    return Err(RegistryError::Tokenizer { model: model.name.clone(), source });
                }
                Err(e) => {
                    tracing::warn!(model = %model.name, dir = %dir.display(), error = %e, "cannot load the model's tokenizer");
                    None
                }
            },
        },
        None => None,
    };
    let cap =
        backend.context_cap.or_else(|| backend.kind.context_cap()).or_else(|| dir.as_deref().and_then(model_limit));
    let source = counter.as_ref().and(dir);
    let counter = counter.unwrap_or_else(|| {
        if cap.is_some() {
            tracing::warn!(
                model = %model.name,
                "no tokenizer found for this model (give models.{}.tokenizer: a directory with tokenizer.json); \
                 prompts are counted with a conservative estimate (about twice the real count on English \
                 prose), so prompts that would fit may be refused or cut",
                model.name
            );
        }
        Arc::new(Estimate)
    });
    if let Some(cap) = cap {
        tracing::info!(model = %model.name, cap, on_overflow = model.on_overflow.label(), tokenizer = ?source, "context cap");
    }
    Ok(ModelTokens { cap, on_overflow: model.on_overflow, counter, source })
}

/// The directory of a managed backend's model: a local path (relative to the config file's
/// directory) or a Hugging Face id in the local cache.
fn backend_model_dir(backend: &BackendConfig) -> Option<PathBuf> {
    let managed = backend.managed.as_ref()?;
    let path = Path::new(&managed.model);
    let local = if path.is_relative() { managed.workdir.join(path) } else { path.to_path_buf() };
    if local.join("tokenizer.json").is_file() {
        return Some(local);
    }
    locate(&managed.model)
}

/// The model's own context length from its `config.json` (`max_position_embeddings`, also
/// under `text_config` for vision-language models).
fn model_limit(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let limit = |v: &serde_json::Value| v.get("max_position_embeddings").and_then(serde_json::Value::as_u64);
    let n = limit(&config).or_else(|| config.get("text_config").and_then(limit))?;
    usize::try_from(n).ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_limit_reads_config_json_and_text_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), r#"{"max_position_embeddings": 40960}"#).unwrap();
        assert_eq!(model_limit(dir.path()), Some(40960));
        std::fs::write(dir.path().join("config.json"), r#"{"text_config": {"max_position_embeddings": 8192}}"#)
            .unwrap();
        assert_eq!(model_limit(dir.path()), Some(8192));
        std::fs::write(dir.path().join("config.json"), r#"{"hidden_size": 64}"#).unwrap();
        assert_eq!(model_limit(dir.path()), None);
    }
}
