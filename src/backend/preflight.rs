//! Checks, before a managed backend is started, that what its start needs is on this machine:
//! its `venv` directory and its command's program (looked up as the keeper's spawn does:
//! through `venv/bin` first, then PATH; a relative path against the config file's directory).
//!
//! `mlxgate check` and `mlxgate serve` refuse a configuration that fails them, and the
//! supervisor runs them again before each start (a venv deleted while the gateway runs fails
//! the backend at once instead of crash-looping). The configuration itself stays plain data:
//! these look at the filesystem, so they live here and not in `config/`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::process::{launch_command, search_path};
use crate::config::{Config, ManagedConfig, Problem};
use crate::kinds::Kind;

/// Every managed backend's missing pieces, each at its YAML path.
pub fn problems(config: &Config) -> Vec<Problem> {
    config
        .backends
        .values()
        .filter_map(|b| Some((b, b.managed.as_ref()?)))
        .flat_map(|(b, managed)| managed_problems(&b.name, b.kind, managed))
        .collect()
}

/// What is missing for backend `name` to start: its venv, or its command's program.
pub fn managed_problems(name: &str, kind: Kind, managed: &ManagedConfig) -> Vec<Problem> {
    let at = |field: &str| format!("backends.{name}.{field}");
    if let Some(venv) = &managed.venv
        && !venv.is_dir()
    {
        return vec![Problem {
            path: at("venv"),
            reason: format!("{} does not exist{}", shown(venv, &managed.workdir), build_hint(kind)),
        }];
    }
    let command = launch_command(managed);
    let Some(program) = command.first() else {
        return vec![Problem { path: at("command"), reason: "must name a program".into() }];
    };
    if resolve_program(program, managed).is_some() {
        return vec![];
    }
    let reason = if program.contains('/') {
        format!("{program} does not exist or is not executable")
    } else {
        let mut places: Vec<String> =
            managed.venv.iter().map(|v| format!("{}/bin", shown(v, &managed.workdir))).collect();
        places.push("PATH".into());
        format!("{program} is not found in {}", places.join(" or "))
    };
    let hint = if managed.venv.is_some() { build_hint(kind) } else { String::new() };
    vec![Problem { path: at("command"), reason: format!("{reason}{hint}") }]
}

/// The executable `program` names, resolved like the spawn: a path with a `/` against
/// `workdir`, a bare name through the venv's `bin/` and then PATH.
pub fn resolve_program(program: &str, managed: &ManagedConfig) -> Option<PathBuf> {
    if program.contains('/') {
        let path = managed.workdir.join(program);
        return is_executable(&path).then_some(path);
    }
    search_path(managed).into_iter().map(|dir| managed.workdir.join(dir).join(program)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `path` as the user wrote it when it lies under the config file's directory.
fn shown(path: &Path, workdir: &Path) -> String {
    path.strip_prefix(workdir).unwrap_or(path).display().to_string()
}

/// How to build a known kind's venv.
fn build_hint(kind: Kind) -> String {
    kind.setup_name().map_or(String::new(), |name| format!(" (build it with: scripts/setup-backends {name})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managed(yaml_backend: &str, workdir: &Path) -> (Kind, ManagedConfig) {
        let text = format!("backends:\n  b: {yaml_backend}\nmodels:\n  m: {{backend: b}}\n");
        let config = Config::parse(&text, &|_| None).expect("valid");
        let b = &config.backends["b"];
        let mut m = b.managed.clone().expect("managed");
        m.workdir = workdir.to_path_buf();
        if let Some(v) = m.venv.as_mut() {
            *v = workdir.join(&*v);
        }
        (b.kind, m)
    }

    #[test]
    fn missing_venv_names_the_field_and_the_build_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (kind, m) =
            managed("{kind: mlx-openai-server, model: /m, port: 8102, venv: .venv-mlx-openai-server}", dir.path());
        let p: Vec<String> = managed_problems("openai-server", kind, &m).iter().map(ToString::to_string).collect();
        assert_eq!(
            p,
            ["backends.openai-server.venv: .venv-mlx-openai-server does not exist \
              (build it with: scripts/setup-backends mlx-openai-server)"]
        );
    }

    #[test]
    fn the_program_is_looked_up_in_the_venv_then_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("venv/bin")).expect("mkdir");
        let (kind, m) = managed("{kind: mlx-lm, model: /m, port: 8101, venv: venv}", dir.path());
        let p: Vec<String> = managed_problems("native", kind, &m).iter().map(ToString::to_string).collect();
        assert_eq!(
            p,
            ["backends.native.command: mlx_lm.server is not found in venv/bin or PATH \
              (build it with: scripts/setup-backends mlx-lm)"]
        );
        let server = dir.path().join("venv/bin/mlx_lm.server");
        std::fs::write(&server, "#!/bin/sh\n").expect("write");
        assert!(!managed_problems("native", kind, &m).is_empty(), "not executable yet");
        std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(managed_problems("native", kind, &m), vec![]);

        let (kind, m) = managed("{kind: custom, command: [sh, -c, 'exit 0'], port: 9000}", dir.path());
        assert_eq!(managed_problems("c", kind, &m), vec![], "sh is on PATH");
        let (kind, m) = managed("{kind: custom, command: [./bin/srv], port: 9000}", dir.path());
        let p: Vec<String> = managed_problems("c", kind, &m).iter().map(ToString::to_string).collect();
        assert_eq!(p, ["backends.c.command: ./bin/srv does not exist or is not executable"]);
    }
}
