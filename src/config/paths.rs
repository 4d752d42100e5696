//! Paths in a loaded file: relative paths (tokenizer, venv, a managed server's working
//! directory and model) mean the same wherever mlxgate is started, since they are taken
//! relative to the file that names them.

use std::path::{Path, PathBuf};

use super::types::{Config, ModelConfig};

/// Makes `config`'s relative paths relative to `file`'s directory.
pub(super) fn resolve(config: &mut Config, file: &Path) {
    let base = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base = std::fs::canonicalize(&base).unwrap_or(base);
    for tokenizer in config.models.values_mut().filter_map(|m| m.tokenizer.as_mut()) {
        if tokenizer.is_relative() {
            *tokenizer = base.join(&*tokenizer);
        }
    }
    let mut renamed = Vec::new();
    for backend in config.backends.values_mut() {
        let kind = backend.kind;
        let Some(managed) = backend.managed.as_mut() else { continue };
        managed.workdir = base.clone();
        if let Some(venv) = managed.venv.as_mut()
            && venv.is_relative()
        {
            *venv = base.join(&*venv);
        }
        // mlx-omni-server loads the model each request names, and looks a relative path up
        // on the Hub: a local model directory is named by its absolute path.
        let local = base.join(&managed.model);
        if kind.model_from_request() && Path::new(&managed.model).is_relative() && local.is_dir() {
            let absolute = std::fs::canonicalize(&local).unwrap_or(local).display().to_string();
            renamed.push((backend.name.clone(), std::mem::replace(&mut managed.model, absolute.clone()), absolute));
        }
    }
    for (backend, relative, absolute) in renamed {
        // A model naming the relative path itself means the same directory.
        let named_relative =
            |m: &ModelConfig| m.backends.contains(&backend) && m.upstream_model == Some(relative.clone());
        for model in config.models.values_mut().filter(|m| named_relative(m)) {
            model.upstream_model = Some(absolute.clone());
        }
    }
}
