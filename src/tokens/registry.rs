//! Which tokenizer and which context cap each public model uses, resolved once at start-up:
//! the cap from the backend's `context_cap`, else its kind's own limit, else the model's
//! `config.json` (a model of several backends: the smallest of theirs); the tokenizer from the model's `tokenizer:` directory, else the managed
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

impl ModelTokens {
    /// These tokens for a model another backend serves too (`other`, resolved for it): the
    /// smaller known cap; this tokenizer, unless only the other found one.
    fn narrowed_by(self, other: ModelTokens) -> ModelTokens {
        let cap = match (self.cap, other.cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (counter, source) = match (&self.source, &other.source) {
            (None, Some(_)) => (other.counter, other.source),
            _ => (self.counter, self.source),
        };
        ModelTokens { cap, on_overflow: self.on_overflow, counter, source }
    }
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
            // A prompt must fit whichever backend serves it: the model's cap is its backends'
            // smallest; its tokenizer the first one found, in the backends' order.
            let mut tokens: Option<ModelTokens> = None;
            for backend in model.backends.iter().filter_map(|name| config.backends.get(name)) {
                let next = resolve(model, backend, &mut loaded)?;
                tokens = Some(match tokens {
                    None => next,
                    Some(first) => first.narrowed_by(next),
                });
            }
            if let Some(tokens) = tokens {
                models.insert(model.name.clone(), tokens);
            }
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
    let dir = explicit.clone().or_else(|| backend_model_dir(backend)).or_else(|| hub_model_dir(backend, model));
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
    let (cap, cap_from) = match (backend.context_cap, backend.kind.context_cap(), dir.as_deref().and_then(model_limit))
    {
        (Some(cap), _, _) => (Some(cap), "the backend's context_cap"),
        (None, Some(cap), _) => (Some(cap), "the server kind's own limit"),
        (None, None, Some(cap)) => (Some(cap), "the model's config.json"),
        (None, None, None) => (None, "none known: prompts are not counted"),
    };
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
    if backend.managed.is_none() && cap_from == "the model's config.json" {
        tracing::warn!(model = %model.name, cap, tokenizer = ?source, "context cap of a url backend taken from the local copy of its model's config.json; set context_cap if the server runs it with another length");
    } else {
        tracing::info!(model = %model.name, cap, from = cap_from, on_overflow = model.on_overflow.label(), tokenizer = ?source, "context cap");
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

/// A `url:` backend's model found in the local Hugging Face cache by its `upstream_model`, when
/// that is a Hub id (`org/name`) and not a path: a directory that happens to sit where the
/// gateway was started never decides a remote server's tokenizer or cap.
fn hub_model_dir(backend: &BackendConfig, model: &ModelConfig) -> Option<PathBuf> {
    let id = model.upstream_model_for(backend);
    let hub_id = backend.managed.is_none()
        && id.matches('/').count() == 1
        && !id.starts_with(['.', '/', '~'])
        && !Path::new(id).exists();
    if hub_id { locate(id) } else { None }
}

/// The model's own context length from its `config.json`, as vLLM derives its default
/// `max_model_len`: `max_position_embeddings` (under `text_config` for vision-language models),
/// stretched by a `rope_scaling` of type yarn, linear or dynamic to
/// `original_max_position_embeddings` (or the same) × `factor` when that is longer (Qwen's
/// YaRN: 32768 × 4); Llama 3's `llama3` scaling is already in `max_position_embeddings`.
fn model_limit(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let text_config = config.get("text_config").filter(|t| t.get("max_position_embeddings").is_some());
    let config = text_config.unwrap_or(&config);
    let positions = config.get("max_position_embeddings").and_then(serde_json::Value::as_u64)?;
    // transformers 5 names it rope_parameters.
    let rope = config.get("rope_scaling").filter(|r| r.is_object()).or_else(|| config.get("rope_parameters"));
    let scaled = rope.filter(|r| r.is_object()).and_then(|rope| {
        let kind = rope.get("rope_type").or_else(|| rope.get("type")).and_then(serde_json::Value::as_str)?;
        if !matches!(kind, "yarn" | "linear" | "dynamic") {
            return None;
        }
        let factor = rope.get("factor").and_then(serde_json::Value::as_f64).filter(|f| *f >= 1.0)?;
        let original =
            rope.get("original_max_position_embeddings").and_then(serde_json::Value::as_u64).unwrap_or(positions);
        Some((original as f64 * factor) as u64)
    });
    let n = positions.max(scaled.unwrap_or(0));
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
        let write = |text: &str| std::fs::write(dir.path().join("config.json"), text).unwrap();
        // Qwen3 with YaRN as its model card says to enable it.
        write(
            r#"{"max_position_embeddings": 40960, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}"#,
        );
        assert_eq!(model_limit(dir.path()), Some(131072));
        // Llama 3.1: its scaling is already in max_position_embeddings.
        write(
            r#"{"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}"#,
        );
        assert_eq!(model_limit(dir.path()), Some(131072));
        write(r#"{"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}"#);
        assert_eq!(model_limit(dir.path()), Some(8192));
        write(r#"{"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}"#);
        assert_eq!(model_limit(dir.path()), Some(8192));
    }

    #[test]
    fn a_model_of_several_backends_takes_their_smallest_cap_and_the_first_tokenizer_found() {
        let config = Config::parse(
            "backends:\n  big: {url: 'http://127.0.0.1:9', context_cap: 32768}\n  \
             small: {url: 'http://127.0.0.1:10', context_cap: 8192}\n  unknown: {url: 'http://127.0.0.1:11'}\n\
             models:\n  both: {backends: [big, small, unknown]}\n  one: {backend: big}\n  \
             none: {backend: unknown}\n",
            &|_| None,
        )
        .expect("config");
        let registry = Registry::load(&config).expect("registry");
        let cap = |model: &str| registry.get(model).expect("model").cap;
        assert_eq!(cap("both"), Some(8192), "a prompt must fit whichever backend serves it");
        assert_eq!(cap("one"), Some(32768));
        assert_eq!(cap("none"), None);

        let estimate =
            |cap| ModelTokens { cap, on_overflow: OnOverflow::Reject, counter: Arc::new(Estimate), source: None };
        let found = ModelTokens { source: Some(PathBuf::from("/m")), ..estimate(Some(4096)) };
        let narrowed = estimate(None).narrowed_by(found);
        assert_eq!((narrowed.cap, narrowed.source), (Some(4096), Some(PathBuf::from("/m"))), "the one tokenizer found");
    }
}
