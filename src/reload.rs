//! Reloading keys and limits without a restart: on SIGHUP the gateway re-reads the file it was
//! started with, checks it as `mlxgate check` does, and puts its clients, keys, admin key and
//! limits in force at once ([`AppState::reload_access`]); running requests and streams keep the
//! snapshot they started with. Anything else that changed in the file is only reported: it
//! applies at the next start. A file with any problem changes nothing, and every problem is
//! logged (problems never quote a key).
//!
//! Also the gateway's pid file (`gateway-<port>.pid`, beside the keeper's records), through
//! which `mlxgate reload` finds the gateway to signal.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::AppState;
use crate::backend::keeper;
use subtle::ConstantTimeEq;

use crate::auth::Access;
use crate::config::{Config, KeyHash};

/// Loads `path` and checks it fully: the file itself ([`Config::load`]), then every managed
/// backend's venv and program and every model's tokenizer directory on this machine. Gives
/// every problem found, one a line, when there is any.
pub fn check_file(path: &Path) -> Result<Config, Vec<String>> {
    let config = Config::load(path).map_err(|e| e.to_string().lines().map(str::to_owned).collect::<Vec<_>>())?;
    preflight(config)
}

/// The environment file the gateway was started with (`serve --env-file`): read again for each
/// reload, so that a key changed in it is put in force as one changed in the configuration.
static ENV_FILE: std::sync::OnceLock<(PathBuf, BTreeSet<String>)> = std::sync::OnceLock::new();

/// Makes reloads read `path`'s variables before the process environment, as the start did.
/// `loaded`: the names the file set at the start (copied into the process environment then): a
/// name removed from the file since is unset for a reload, not its value at the start.
pub fn reload_with_env_file(path: PathBuf, loaded: BTreeSet<String>) {
    let _ = ENV_FILE.set((path, loaded));
}

/// [`check_file`] for a reload: with the environment file's values first when there is one.
pub fn check_for_reload(path: &Path) -> Result<Config, Vec<String>> {
    let Some((env_file, loaded)) = ENV_FILE.get() else { return check_file(path) };
    let vars =
        crate::config::env_file::read(env_file).map_err(|e| vec![format!("the environment file (--env-file) {e}")])?;
    check_file_with_env(path, &|name| match vars.get(name) {
        Some(value) => Some(value.clone()),
        None if loaded.contains(name) => None,
        None => std::env::var(name).ok(),
    })
}

/// As [`check_file`], with `${VAR}` answered by `lookup` (the environment a service will have).
pub fn check_file_with_env(path: &Path, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<String>> {
    let config = Config::load_with_env(path, lookup)
        .map_err(|e| e.to_string().lines().map(str::to_owned).collect::<Vec<_>>())?;
    preflight(config)
}

/// As [`check_file`], for the file of a gateway running with its own environment (`mlxgate
/// reload`): a `${VAR}` unset here is not a problem (the gateway resolves it, and logs it if it
/// is unset there too); its name is returned beside the configuration.
pub fn check_file_elsewhere(path: &Path) -> Result<(Config, BTreeSet<String>), Vec<String>> {
    check_file_elsewhere_with(path, &std::collections::BTreeMap::new())
}

/// As [`check_file_elsewhere`], with the running gateway's environment file's `vars` first.
pub fn check_file_elsewhere_with(
    path: &Path,
    vars: &std::collections::BTreeMap<String, String>,
) -> Result<(Config, BTreeSet<String>), Vec<String>> {
    let unset = RefCell::new(BTreeSet::new());
    let config = Config::load_elsewhere_with(path, &unset, &|name| vars.get(name).cloned())
        .map_err(|e| e.to_string().lines().map(str::to_owned).collect::<Vec<_>>())?;
    Ok((preflight(config)?, unset.into_inner()))
}

fn preflight(config: Config) -> Result<Config, Vec<String>> {
    let mut problems = crate::backend::preflight::problems(&config);
    problems.extend(crate::tokens::registry::tokenizer_problems(&config));
    if problems.is_empty() { Ok(config) } else { Err(problems.iter().map(ToString::to_string).collect()) }
}

/// The top-level keys whose values differ between the running configuration and `new`, among
/// those a reload does not apply (everything but `auth`, `clients`, `default_limits` and
/// `admin_key_sha256`), by their names in gateway.yaml.
pub fn unapplied_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    let keys: [(&'static str, bool); 17] = [
        ("listen", running.listen == new.listen),
        ("metrics_listen", running.metrics_listen == new.metrics_listen),
        ("worker_threads", running.worker_threads == new.worker_threads),
        ("shutdown_grace", running.shutdown_grace == new.shutdown_grace),
        ("max_body", running.max_body_bytes == new.max_body_bytes),
        ("header_read_timeout", running.header_read_timeout == new.header_read_timeout),
        ("max_connections_per_client", running.max_connections_per_client == new.max_connections_per_client),
        ("body_read_timeout", running.body_read_timeout == new.body_read_timeout),
        ("swap_after", running.swap_after == new.swap_after),
        ("loading_share", running.loading_share == new.loading_share),
        ("gpu_memory_budget", running.gpu_memory_budget == new.gpu_memory_budget),
        // Plain data all through: their Debug text is their value.
        ("backends", same(&running.backends, &new.backends)),
        ("models", same(&running.models, &new.models)),
        ("aliases", running.aliases == new.aliases),
        ("rate_limit_store", running.rate_limit_store == new.rate_limit_store),
        ("access_log", running.access_log == new.access_log),
        ("admin_hosts", running.admin_hosts == new.admin_hosts),
    ];
    keys.iter().filter(|(_, unchanged)| !unchanged).map(|(key, _)| *key).collect()
}

/// The keys a reload puts in force whose values differ between the access in force (`running`)
/// and `new`'s, by their names in gateway.yaml. Keys are compared by their digests (a digest's
/// `Debug` hides it).
pub fn applied_changes(running: &Access, new: &Config) -> Vec<&'static str> {
    let new = Access::of(new);
    let same_key = |a: Option<&KeyHash>, b: Option<&KeyHash>| match (a, b) {
        (Some(a), Some(b)) => bool::from(a.ct_eq(b)),
        (a, b) => a.is_none() && b.is_none(),
    };
    let same_clients = running.clients.len() == new.clients.len()
        && running.clients.iter().zip(&new.clients).all(|((name, a), (other, b))| {
            name == other && a.models == b.models && a.limits == b.limits && same_key(Some(&a.key), Some(&b.key))
        });
    let keys = [
        ("auth", running.auth == new.auth),
        ("clients", same_clients),
        ("default_limits", running.default_limits == new.default_limits),
        ("admin_key_sha256", same_key(running.admin_key.as_ref(), new.admin_key.as_ref())),
    ];
    keys.iter().filter(|(_, unchanged)| !unchanged).map(|(key, _)| *key).collect()
}

/// The SIGHUP listener, installed before the gateway can be found (its pid file), so that a
/// SIGHUP never meets the default action (which would end the gateway).
pub struct Reloader {
    path: PathBuf,
    hangups: Signal,
}

impl Reloader {
    /// Installs the SIGHUP handler; reloads will read `path`.
    pub fn install(path: PathBuf) -> std::io::Result<Reloader> {
        Ok(Reloader { path, hangups: signal(SignalKind::hangup())? })
    }

    /// The file reloads read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reloads on every SIGHUP, for as long as the gateway runs.
    pub async fn run(mut self, state: Arc<AppState>) {
        while self.hangups.recv().await.is_some() {
            tracing::info!(config = %self.path.display(), "SIGHUP received: reloading keys and limits");
            let path = self.path.clone();
            match tokio::task::spawn_blocking(move || check_for_reload(&path)).await {
                Ok(checked) => apply(&state, &self.path, checked),
                Err(e) => tracing::error!("reload failed: {e}; the configuration in force is kept"),
            }
        }
    }
}

/// Puts a checked file's access in force, or logs why not (SIGHUP and `POST /admin/reload`).
pub fn apply(state: &AppState, path: &Path, checked: Result<Config, Vec<String>>) {
    let new = match checked {
        Ok(new) => new,
        Err(problems) => {
            for problem in &problems {
                tracing::error!(config = %path.display(), "reload: {problem}");
            }
            tracing::error!(
                config = %path.display(),
                problems = problems.len(),
                "reload refused: the configuration or its environment file is invalid; the keys, clients and limits in force are kept"
            );
            return;
        }
    };
    state.reload_access(&new);
    tracing::info!(
        config = %path.display(),
        auth = ?new.auth,
        clients = new.clients.len(),
        admin_key = new.admin_key.is_some(),
        "reloaded keys, clients and limits"
    );
    let unapplied = unapplied_changes(&state.config, &new);
    if !unapplied.is_empty() {
        tracing::warn!(
            config = %path.display(),
            changed = ?unapplied,
            "these settings differ from the running ones and apply only at a restart: {}",
            unapplied.join(", ")
        );
    }
}

/// The pid file of the gateway listening on `port`.
pub fn pid_file_path(port: u16) -> std::io::Result<PathBuf> {
    Ok(keeper::records_dir()?.join(format!("gateway-{port}.pid")))
}

/// The gateway's pid file, removed when dropped (if it still names this process).
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Writes this process's pid for the gateway on `port` (whole or not at all: written aside,
    /// then renamed).
    pub fn create(port: u16) -> std::io::Result<PidFile> {
        let path = pid_file_path(port)?;
        let partial = path.with_extension(format!("pid.{}", std::process::id()));
        let mut file = std::fs::File::create(&partial)?;
        writeln!(file, "{}", std::process::id())?;
        std::fs::rename(&partial, &path)?;
        Ok(PidFile { path })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if read_pid(&self.path) == Some(std::process::id()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Where `mlxgate reload` finds the gateway.
pub enum Target {
    /// The pid given on the command line.
    Pid(u32),
    /// The gateway listening on this port (its pid file).
    Port(u16),
}

/// What `mlxgate reload` did.
#[derive(Debug)]
pub struct Signalled {
    pub pid: u32,
}

/// Sends SIGHUP to the gateway `target` names, after checking that it is a live mlxgate
/// process (a stale pid file may name a pid reused by anything else). The error says why not.
pub fn signal_gateway(target: Target) -> Result<Signalled, String> {
    use nix::sys::signal::{Signal as NixSignal, kill};
    let by_port = matches!(target, Target::Port(port) if port != 0);
    let pid = find_gateway(target).map_err(|why| if by_port { format!("{why}; give --pid") } else { why })?;
    let raw = i32::try_from(pid).map_err(|_| format!("{pid} is not a pid"))?;
    kill(nix::unistd::Pid::from_raw(raw), NixSignal::SIGHUP)
        .map_err(|e| format!("cannot signal process {pid}: {e}"))?;
    Ok(Signalled { pid })
}

/// The pid of the live mlxgate gateway `target` names (its pid file, for a port), checked to be
/// an mlxgate process; the error says why there is none.
pub fn find_gateway(target: Target) -> Result<u32, String> {
    let pid = match target {
        Target::Pid(pid) => pid,
        Target::Port(0) => {
            return Err("the file listens on port 0 (a port chosen at start): give the gateway's --pid".into());
        }
        Target::Port(port) => {
            let path = pid_file_path(port).map_err(|e| format!("cannot open the runtime directory: {e}"))?;
            read_pid(&path)
                .ok_or_else(|| format!("no gateway is running on port {port} (no pid file at {})", path.display()))?
        }
    };
    let command = keeper::command_of(pid).ok_or_else(|| format!("no process {pid} is running"))?;
    let program = command.split_whitespace().next().map(Path::new).and_then(Path::file_name);
    if !program.is_some_and(|name| name.to_string_lossy().starts_with("mlxgate")) {
        return Err(format!("process {pid} is not an mlxgate gateway ({command}): not signalled"));
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Config {
        let text = format!(
            "backends: {{local: {{url: 'http://127.0.0.1:9'}}}}\nmodels: {{qwen: {{backend: local}}}}\n{extra}"
        );
        Config::parse(&text, &|name| Some(format!("key-of-{name}"))).expect("valid")
    }

    #[test]
    fn only_the_settings_a_reload_does_not_apply_are_reported() {
        let running = parse("clients: {a: {key: '${A}'}}\n");
        let access_only = parse("clients: {b: {key: '${B}', limits: {rpm: 5}}}\ndefault_limits: {rpm: 9}\n");
        assert!(unapplied_changes(&running, &access_only).is_empty());
        let moved = parse("listen: 127.0.0.1:8001\nswap_after: 3s\nclients: {a: {key: '${A}'}}\n");
        assert_eq!(unapplied_changes(&running, &moved), ["listen", "swap_after"]);
        // The scheduler's terms (issue 22) apply only at a restart too.
        let costed = parse("loading_share: 0.5\ngpu_memory_budget: 48GB\nclients: {a: {key: '${A}'}}\n");
        assert_eq!(unapplied_changes(&running, &costed), ["loading_share", "gpu_memory_budget"]);
        // The runtime is built once, before the gateway starts.
        assert_eq!(running.worker_threads, 0, "a thread per core by default");
        let threaded = parse("worker_threads: 1\nclients: {a: {key: '${A}'}}\n");
        assert_eq!(unapplied_changes(&running, &threaded), ["worker_threads"]);
        let text = "backends: {local: {url: 'http://127.0.0.1:10'}}\nmodels: {qwen: {backend: local, max_queue: 3}}\n";
        let other = Config::parse(text, &|_| None).expect("valid");
        assert_eq!(unapplied_changes(&running, &other), ["backends", "models"]);
    }
}
