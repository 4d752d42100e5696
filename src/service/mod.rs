//! `mlxgate service`: runs the gateway as a service that starts at login (or boot) and comes back
//! after a crash: a launchd LaunchAgent on macOS, a `systemd --user` unit on Linux (`--system`: a
//! LaunchDaemon or a system unit, run as a named user).
//!
//! `install` checks the configuration as `mlxgate check` does, against the environment the
//! service will have, and writes nothing when it is refused. It writes three things:
//! - the plist or unit (never over one it did not write, without `--force`);
//! - the environment file (mode 0600) with the values of the `${VAR}`s the configuration names.
//!   Secrets never go into the plist or unit;
//! - the log's directory (`--log-file`, rotated by size).
//!
//! Then it starts the service. `uninstall`, `status` and `restart` do what they say.

pub mod manager;
pub mod units;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::env_file;
use manager::Scope;
use units::{LAUNCHD_LABEL, MARKER, Manager, Plan, SYSTEMD_UNIT};

/// Prints a line to stdout; a closed stdout (`| head`) is not an error worth a panic halfway
/// through an install.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `mlxgate service …`.
#[derive(clap::Subcommand, Debug)]
pub enum ServiceCommand {
    /// Install the gateway as a service and start it: a LaunchAgent on macOS, a `systemd --user`
    /// unit on Linux. The configuration is checked first; a refused one writes nothing.
    Install(InstallOptions),
    /// Stop the service and remove its plist or unit (the environment file and the logs stay).
    Uninstall(WhereOptions),
    /// Say whether the service runs (which pid, which configuration) and show its last log lines.
    /// Exits 0 when it runs, 3 when it is installed but not running, 4 when it is not installed.
    Status {
        #[command(flatten)]
        at: WhereOptions,
        /// How many of the log's last lines to show.
        #[arg(long, short = 'n', default_value_t = 20)]
        lines: usize,
    },
    /// Restart the service (after editing its configuration or environment file).
    Restart(WhereOptions),
}

/// Which service: the user's (default) or the system's.
#[derive(clap::Args, Debug, Clone)]
pub struct WhereOptions {
    /// The system's service (a LaunchDaemon, a system unit) rather than the user's; needs root.
    #[arg(long)]
    pub system: bool,
    /// The service manager whose files to use (default: launchd on macOS, systemd elsewhere).
    #[arg(long, value_enum)]
    pub manager: Option<Manager>,
    /// Act on a plist or unit that `service install` did not write.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct InstallOptions {
    /// The configuration file the service serves (made absolute).
    #[arg(long, short, default_value = "gateway.yaml", env = "MLXGATE_CONFIG")]
    pub config: PathBuf,
    /// A system service that runs before anyone logs in: a LaunchDaemon (macOS) or a system unit
    /// (Linux), run as `--user`. Needs root (sudo). On Linux, `loginctl enable-linger USER`
    /// with the default user unit does the same without root's files.
    #[arg(long)]
    pub system: bool,
    /// With `--system`: the user the gateway runs as (default: the one who ran sudo).
    #[arg(long, requires = "system")]
    pub user: Option<String>,
    /// The service manager to write for (default: launchd on macOS, systemd elsewhere).
    #[arg(long, value_enum)]
    pub manager: Option<Manager>,
    /// Overwrite a plist or unit that `service install` did not write.
    #[arg(long)]
    pub force: bool,
    /// Write the files but do not load or start the service.
    #[arg(long)]
    pub no_start: bool,
    /// The mlxgate binary the service runs (default: this one).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// The log file (default: ~/Library/Logs/mlxgate/mlxgate.log on macOS,
    /// $XDG_STATE_HOME/mlxgate/mlxgate.log on Linux).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Each log file's size limit, like 10MiB.
    #[arg(long, default_value = "10MiB", value_parser = parse_size)]
    pub log_file_size: u64,
    /// How many rotated log files to keep beside the current one (0: only the current one).
    #[arg(long, default_value_t = crate::log_file::DEFAULT_KEEP, value_parser = parse_keep)]
    pub log_file_keep: usize,
}

/// A number of rotated log files, at most [`crate::log_file::MAX_KEEP`].
pub fn parse_keep(text: &str) -> Result<usize, String> {
    let keep: usize = text.trim().parse().map_err(|_| format!("{text:?} is not a number of files"))?;
    if keep > crate::log_file::MAX_KEEP {
        return Err(format!("at most {} rotated log files are kept", crate::log_file::MAX_KEEP));
    }
    Ok(keep)
}

/// A log file's size on the command line, read as gateway.yaml's sizes are: bytes, or like
/// `10MiB`, `512KB`; at least [`crate::log_file::MIN_SIZE`].
pub fn parse_size(text: &str) -> Result<u64, String> {
    let size = crate::config::parse_size(text)
        .ok_or_else(|| format!("{:?} is not a size (bytes, or like 10MiB, 512KB)", text.trim()))? as u64;
    if size < crate::log_file::MIN_SIZE {
        return Err(format!("a log file's size limit must be at least {} bytes", crate::log_file::MIN_SIZE));
    }
    Ok(size)
}

/// Runs a `service` subcommand; prints what it did or why not. `json_logs`: the service logs
/// JSON lines (`mlxgate --log-format json service install`).
pub fn main(command: ServiceCommand, json_logs: bool) -> ExitCode {
    let outcome = match command {
        ServiceCommand::Install(options) => install(&options, json_logs),
        ServiceCommand::Uninstall(at) => uninstall(&at),
        ServiceCommand::Status { at, lines } => return status(&at, lines),
        ServiceCommand::Restart(at) => restart(&at),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("mlxgate service: {why}");
            ExitCode::FAILURE
        }
    }
}

/// The places a service's files go, for a manager and scope.
#[derive(Debug, Clone)]
pub struct Places {
    pub unit_path: PathBuf,
    pub env_file: PathBuf,
    pub log_dir: PathBuf,
}

/// Where the files go: the platform's conventions, under `home` for the user's service.
pub fn places(manager: Manager, system: bool, home: &Path, xdg: &dyn Fn(&str) -> Option<PathBuf>) -> Places {
    match (manager, system) {
        (Manager::Launchd, false) => Places {
            unit_path: home.join(format!("Library/LaunchAgents/{LAUNCHD_LABEL}.plist")),
            env_file: home.join("Library/Application Support/mlxgate/env"),
            log_dir: home.join("Library/Logs/mlxgate"),
        },
        (Manager::Launchd, true) => Places {
            unit_path: PathBuf::from(format!("/Library/LaunchDaemons/{LAUNCHD_LABEL}.plist")),
            env_file: PathBuf::from("/Library/Application Support/mlxgate/env"),
            log_dir: PathBuf::from("/Library/Logs/mlxgate"),
        },
        (Manager::Systemd, false) => {
            let config = xdg("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
            let state = xdg("XDG_STATE_HOME").unwrap_or_else(|| home.join(".local/state"));
            Places {
                unit_path: config.join("systemd/user").join(SYSTEMD_UNIT),
                env_file: config.join("mlxgate/env"),
                log_dir: state.join("mlxgate"),
            }
        }
        (Manager::Systemd, true) => Places {
            unit_path: PathBuf::from("/etc/systemd/system").join(SYSTEMD_UNIT),
            env_file: PathBuf::from("/etc/mlxgate/env"),
            log_dir: PathBuf::from("/var/log/mlxgate"),
        },
    }
}

fn here_places(manager: Manager, system: bool) -> Result<Places, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute());
    let home = match (home, system) {
        (Some(home), _) => home,
        (None, true) => PathBuf::from("/"),
        (None, false) => return Err("HOME is not set to an absolute path: the user's service files go under it".into()),
    };
    let xdg = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
    Ok(places(manager, system, &home, &xdg))
}

fn scope_of(manager: Option<Manager>, system: bool) -> Scope {
    Scope { manager: manager.unwrap_or_else(Manager::native), system }
}

fn describe(scope: &Scope) -> &'static str {
    match (scope.manager, scope.system) {
        (Manager::Launchd, false) => "launchd LaunchAgent",
        (Manager::Launchd, true) => "launchd LaunchDaemon",
        (Manager::Systemd, false) => "systemd --user unit",
        (Manager::Systemd, true) => "systemd system unit",
    }
}

fn need_root(system: bool, what: &str) -> Result<(), String> {
    if system && !nix::unistd::geteuid().is_root() {
        return Err(format!("{what} a system service needs root: run it with sudo"));
    }
    Ok(())
}

fn install(options: &InstallOptions, json_logs: bool) -> Result<(), String> {
    let scope = scope_of(options.manager, options.system);
    need_root(options.system, "installing")?;
    let run_as = if options.system {
        let user = options.user.clone().or_else(|| std::env::var("SUDO_USER").ok()).ok_or_else(|| {
            "--system: name the user the gateway runs as with --user (it should not run as root)".to_string()
        })?;
        nix::unistd::User::from_name(&user)
            .map_err(|e| format!("cannot look up user {user}: {e}"))?
            .ok_or_else(|| format!("there is no user {user} on this machine"))?;
        Some(user)
    } else {
        None
    };
    let places = here_places(scope.manager, options.system)?;

    let config = std::fs::canonicalize(&options.config)
        .map_err(|e| format!("{}: {e} (give the configuration with --config)", options.config.display()))?;
    let existing_env = match std::fs::symlink_metadata(&places.env_file) {
        Ok(_) => env_file::read(&places.env_file)?,
        Err(_) => BTreeMap::new(),
    };
    let had_env_file = !existing_env.is_empty();
    // The check sees the environment the service will have: what the environment file already
    // holds, overridden by what this shell sets now.
    let value_of = |name: &str| std::env::var(name).ok().or_else(|| existing_env.get(name).cloned());
    let named = RefCell::new(BTreeSet::new());
    let lookup = |name: &str| {
        named.borrow_mut().insert(name.to_owned());
        value_of(name)
    };
    let checked = crate::reload::check_file_with_env(&config, &lookup).map_err(|problems| {
        let same = if had_env_file {
            format!(
                "`${{VAR}}`s from this shell, else from {}: `mlxgate check --env-file` gives the same answer",
                places.env_file.display()
            )
        } else {
            "`mlxgate check` refuses it too".to_string()
        };
        format!("{}: refused, nothing was written ({same})\n{}", config.display(), problems.join("\n"))
    })?;
    // Everything the file held stays (a hand-added RUST_LOG or HF_TOKEN too); the variables the
    // configuration names take this shell's values where it sets them.
    let named = named.into_inner();
    let set_now: BTreeMap<String, String> =
        named.iter().filter_map(|name| Some((name.clone(), std::env::var(name).ok()?))).collect();
    let existing_text =
        if had_env_file { std::fs::read_to_string(&places.env_file).unwrap_or_default() } else { String::new() };
    let env_text = env_file::update(&existing_text, &set_now)?;
    let vars = env_file::parse(&env_text)?;

    let unit_exists = std::fs::symlink_metadata(&places.unit_path).is_ok();
    if unit_exists && !written_here(&places.unit_path) && !options.force {
        return Err(format!(
            "{} exists and was not written by `mlxgate service install`: not overwritten (--force replaces it)",
            places.unit_path.display()
        ));
    }
    let binary = match &options.binary {
        Some(b) => {
            let binary = std::fs::canonicalize(b).map_err(|e| format!("--binary {}: {e}", b.display()))?;
            let version = std::process::Command::new(&binary).arg("--version").output();
            if !version.is_ok_and(|v| v.status.success() && v.stdout.starts_with(b"mlxgate ")) {
                return Err(format!(
                    "--binary {}: not an mlxgate binary (its --version does not say mlxgate)",
                    b.display()
                ));
            }
            binary
        }
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(|e| format!("cannot find this mlxgate binary: {e}"))?,
    };
    let log_file = match &options.log_file {
        Some(path) if path.is_absolute() => path.clone(),
        Some(path) => std::env::current_dir().map_err(|e| e.to_string())?.join(path),
        None => places.log_dir.join("mlxgate.log"),
    };
    let early_output = log_file.with_file_name("mlxgate-early-output.log");
    if log_file.is_dir() {
        return Err(format!("--log-file {} is a directory", log_file.display()));
    }
    if scope.manager == Manager::Launchd && log_file == early_output {
        return Err(format!("--log-file {}: that name is the service's early-output file", log_file.display()));
    }
    // A service manager cannot read a path with a control character in its file (systemd's
    // quoting, XML 1.0): refused rather than written unreadable.
    for path in [&config, &binary, &log_file, &places.env_file, &places.unit_path] {
        match path.to_str() {
            None => return Err(format!("{:?} is not UTF-8, which a service file cannot hold", path.display())),
            Some(text) if !plain_text(text) => {
                return Err(format!("{text:?} has a control character, which a service file cannot hold"));
            }
            Some(_) => {}
        }
    }
    let plan = Plan {
        manager: scope.manager,
        run_as: run_as.clone(),
        unit_path: places.unit_path.clone(),
        binary: binary.clone(),
        config: config.clone(),
        env_file: places.env_file.clone(),
        log_file: log_file.clone(),
        log_size: options.log_file_size,
        json_logs,
        log_keep: options.log_file_keep,
        early_output,
        workdir: config.parent().map_or_else(|| PathBuf::from("/"), Path::to_path_buf),
        path_var: service_path(&checked),
        plain_env: std::env::var("TMPDIR")
            .ok()
            .filter(|t| scope.manager == Manager::Launchd && !options.system && t.starts_with('/') && plain_text(t))
            .map(|t| ("TMPDIR".to_string(), t))
            .into_iter()
            .collect(),
    };

    if let Some(user) = &run_as {
        for problem in unreachable_for(user, &config, &binary, &checked) {
            say!("  warning: {problem}");
        }
    }
    // Everything is checked: the directories first (a place that cannot be made stops the
    // install before any file is written), then the files.
    let owner = run_as.as_deref();
    make_dir(log_file.parent(), owner, 0o700)?;
    make_dir(places.env_file.parent(), owner, 0o700)?;
    make_dir(places.unit_path.parent(), None, 0o755)?;
    env_file::write_private(&places.env_file, &env_text)
        .map_err(|e| format!("cannot write {}: {e}", places.env_file.display()))?;
    chown(&places.env_file, owner)?;
    write_whole(&places.unit_path, &plan.render())?;

    say!("mlxgate service: installed a {} for {}", describe(&scope), config.display());
    say!("  service file: {}", places.unit_path.display());
    say!("  runs:         {}", plan.arguments().join(" "));
    say!(
        "  environment:  {} (mode 0600: {})",
        places.env_file.display(),
        if vars.is_empty() {
            "no ${VAR}s named".to_string()
        } else {
            vars.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    );
    let unused: Vec<&str> = vars.keys().filter(|k| !named.contains(*k)).map(String::as_str).collect();
    if !unused.is_empty() {
        say!(
            "  note: kept from the environment file, not named by the configuration: {} (the servers and RUST_LOG may read them)",
            unused.join(", ")
        );
    }
    say!("  log:          {} (rotated at {} bytes, {} kept)", log_file.display(), plan.log_size, plan.log_keep);
    if binary.components().any(|c| c.as_os_str() == "target") {
        say!(
            "  note: the service runs the binary in a build directory; `cargo clean` would remove it. \
             `cargo install --locked --path .` puts one in ~/.cargo/bin: install again from there."
        );
    }
    if scope.manager == Manager::Systemd && !options.system {
        say!(
            "  note: a user unit runs while you are logged in; to have it start at boot without a login: \
             sudo loginctl enable-linger $USER"
        );
    }
    if options.no_start {
        say!("not started (--no-start); start it with: {}", scope.start_hint(&places.unit_path));
        return Ok(());
    }
    scope.start(&places.unit_path).map_err(|e| {
        format!(
            "the files are written but the service did not start: {e}\nstart it with: {}",
            scope.start_hint(&places.unit_path)
        )
    })?;
    say!("started; `mlxgate service status` shows it");
    Ok(())
}

/// The service's PATH: the directories of the servers' programs as they resolve now, this
/// shell's PATH, then the usual system directories (launchd's default PATH is only
/// `/usr/bin:/bin:/usr/sbin:/sbin`).
fn service_path(config: &crate::Config) -> String {
    let mut dirs: Vec<PathBuf> = Vec::new();
    // An entry a service file cannot hold (not UTF-8, a control character: a line break would
    // start a new line of the unit) is left out.
    let mut add = |dir: PathBuf| {
        if dir.is_absolute() && dir.to_str().is_some_and(plain_text) && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    };
    for program in server_programs(config) {
        if let Some(dir) = program.parent() {
            add(dir.to_path_buf());
        }
    }
    for dir in std::env::var_os("PATH").iter().flat_map(std::env::split_paths) {
        add(dir);
    }
    for dir in ["/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        add(PathBuf::from(dir));
    }
    std::env::join_paths(dirs).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

/// What the user a system service runs as cannot reach: the configuration (read), the mlxgate
/// binary and each managed server's program (run). Asked by running `test` as that user (its
/// uid and primary group; supplementary groups are not counted, so a warning may be wrong).
fn unreachable_for(user: &str, config: &Path, binary: &Path, checked: &crate::Config) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    let Ok(Some(account)) = nix::unistd::User::from_name(user) else { return vec![] };
    let mut wanted: Vec<(&str, PathBuf)> = vec![("-r", config.to_path_buf()), ("-x", binary.to_path_buf())];
    wanted.extend(server_programs(checked).into_iter().map(|program| ("-x", program)));
    wanted
        .into_iter()
        .filter(|(test, path)| {
            !std::process::Command::new("test")
                .arg(test)
                .arg(path)
                .uid(account.uid.as_raw())
                .gid(account.gid.as_raw())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(test, path)| {
            let verb = if test == "-r" { "read" } else { "run" };
            format!("{user} cannot {verb} {} (the service runs as {user})", path.display())
        })
        .collect()
}

/// Each managed server's program, resolved as its start resolves it (through its venv, then PATH).
fn server_programs(config: &crate::Config) -> Vec<PathBuf> {
    config
        .backends
        .values()
        .filter_map(|backend| {
            let managed = backend.managed.as_ref()?;
            let program = crate::backend::process::launch_command(managed).first().cloned()?;
            crate::backend::preflight::resolve_program(&program, managed)
        })
        .collect()
}

/// Text without control characters (a line break, an escape), which a unit or plist can hold.
fn plain_text(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// Whether `path` carries [`MARKER`].
fn written_here(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.contains(MARKER))
}

fn make_dir(dir: Option<&Path>, owner: Option<&str>, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else { return Ok(()) };
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    chown(dir, owner)
}

fn chown(path: &Path, owner: Option<&str>) -> Result<(), String> {
    let Some(owner) = owner else { return Ok(()) };
    let user = nix::unistd::User::from_name(owner).ok().flatten().ok_or_else(|| format!("there is no user {owner}"))?;
    nix::unistd::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| format!("cannot give {} to {owner}: {e}", path.display()))
}

fn write_whole(path: &Path, text: &str) -> Result<(), String> {
    let aside = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&aside, text).and_then(|()| std::fs::rename(&aside, path)).map_err(|e| {
        let _ = std::fs::remove_file(&aside);
        format!("cannot write {}: {e}", path.display())
    })
}

/// The installed service's file, checked to be one `service install` wrote (unless `force`).
fn installed(at: &WhereOptions) -> Result<(Scope, PathBuf, String), String> {
    let scope = scope_of(at.manager, at.system);
    let places = here_places(scope.manager, at.system)?;
    let text = std::fs::read_to_string(&places.unit_path)
        .map_err(|e| format!("no {} is installed ({}: {e})", describe(&scope), places.unit_path.display()))?;
    if !text.contains(MARKER) && !at.force {
        return Err(format!(
            "{} was not written by `mlxgate service install`: left alone (--force acts on it anyway)",
            places.unit_path.display()
        ));
    }
    Ok((scope, places.unit_path, text))
}

fn uninstall(at: &WhereOptions) -> Result<(), String> {
    need_root(at.system, "removing")?;
    let (scope, unit_path, _) = installed(at)?;
    if let Err(e) = scope.stop() {
        say!("note: stopping it said: {e}");
    }
    std::fs::remove_file(&unit_path).map_err(|e| format!("cannot remove {}: {e}", unit_path.display()))?;
    if let Err(e) = scope.forget() {
        say!("note: {e}");
    }
    let places = here_places(scope.manager, at.system)?;
    say!("mlxgate service: removed {} ({})", unit_path.display(), describe(&scope));
    let kept: Vec<String> = [("the environment file", &places.env_file), ("the logs in", &places.log_dir)]
        .iter()
        .filter(|(_, path)| path.exists())
        .map(|(what, path)| format!("{what} {}", path.display()))
        .collect();
    if !kept.is_empty() {
        say!("  kept: {}; remove them by hand if they are not wanted", kept.join(" and "));
    }
    Ok(())
}

fn restart(at: &WhereOptions) -> Result<(), String> {
    need_root(at.system, "restarting")?;
    let (scope, _, _) = installed(at)?;
    scope.restart()?;
    say!("mlxgate service: restarted ({})", describe(&scope));
    Ok(())
}

/// `service status`: 0 running, 3 installed and not running, 4 not installed.
fn status(at: &WhereOptions, lines: usize) -> ExitCode {
    let (scope, unit_path, text) = match installed(at) {
        Ok(found) => found,
        Err(why) => {
            say!("mlxgate service: {why}");
            return ExitCode::from(4);
        }
    };
    let args = units::arguments_in(scope.manager, &text).unwrap_or_default();
    let config = units::flag_value(&args, "--config").map(PathBuf::from);
    let log = units::flag_value(&args, "--log-file").map(PathBuf::from);
    // The service's own values of the configuration's `${VAR}`s, where this shell can read them.
    let service_env =
        units::flag_value(&args, "--env-file").and_then(|f| env_file::read(Path::new(f)).ok()).unwrap_or_default();
    say!("mlxgate service ({}): installed", describe(&scope));
    say!("  service file: {}", unit_path.display());
    say!("  config:       {}", config.as_ref().map_or("(not found in the file)".into(), |c| c.display().to_string()));
    say!("  log:          {}", log.as_ref().map_or("(not found in the file)".into(), |l| l.display().to_string()));
    let state = scope.state();
    let mut running = false;
    match &state {
        Ok(s) => {
            running = s.running;
            let pid = s.pid.map_or(String::new(), |p| format!(", pid {p}"));
            let detail = s.detail.as_ref().map_or(String::new(), |d| format!("; {d}"));
            say!("  state:        {}{pid}{detail}", s.state);
        }
        Err(e) => say!("  state:        the service manager could not be asked: {e}"),
    }
    // The gateway itself, by its pid file: says which process serves even when the manager
    // cannot be asked.
    if let Some(config) = &config {
        // A variable set nowhere here gets a placeholder: only `listen` is wanted.
        let unset = RefCell::new(BTreeSet::new());
        match crate::Config::load_elsewhere_with(config, &unset, &|name| service_env.get(name).cloned()) {
            Ok(c) => match crate::reload::find_gateway(crate::reload::Target::Port(c.listen.port())) {
                Ok(pid) => {
                    say!("  gateway:      pid {pid}, listening on {}", c.listen);
                    running |= state.is_err();
                }
                Err(why) => say!("  gateway:      {why}"),
            },
            Err(e) => say!("  gateway:      the config cannot be read: {}", e.to_string().replace('\n', "; ")),
        }
    }
    if let Some(log) = &log {
        match tail(log, lines) {
            Ok(last) if last.is_empty() => say!("the log is empty"),
            Ok(last) => {
                say!("last {} lines of {}:", last.len(), log.display());
                for line in last {
                    say!("  {line}");
                }
            }
            Err(e) => say!("the log cannot be read: {}: {e}", log.display()),
        }
    }
    match scope.manager {
        Manager::Launchd => {
            if let Some(early) = log.as_ref().map(|l| l.with_file_name("mlxgate-early-output.log"))
                && std::fs::metadata(&early).is_ok_and(|m| m.len() > 0)
            {
                say!("output before logging started (a refused start, a panic): {}", early.display());
            }
        }
        Manager::Systemd => {
            let user = if scope.system { "" } else { " --user" };
            say!("output before logging started (a refused start, a panic): journalctl{user} -u {SYSTEMD_UNIT}");
        }
    }
    if running { ExitCode::SUCCESS } else { ExitCode::from(3) }
}

/// The last `n` lines of `path`, reading only its end.
fn tail(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    // Lines of the gateway's log are short: 64 KiB holds far more than a screen of them.
    let start = len.saturating_sub(64 * 1024);
    file.seek(std::io::SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    // The first line read is cut (the read started mid-line): left out, unless it is the only one.
    if start > 0 && lines.len() > 1 {
        lines.remove(0);
    }
    let keep = lines.len().saturating_sub(n);
    // A line that is not UTF-8 (a server's bytes, a character cut by a rotation) is shown with
    // U+FFFD, not left out with every line after it; control characters (a terminal's escape
    // sequences from a server's output) are shown escaped, not sent to the terminal.
    Ok(lines[keep..]
        .iter()
        .map(|l| {
            String::from_utf8_lossy(l)
                .chars()
                .flat_map(
                    |c| if c.is_control() && c != '\t' { c.escape_default().collect::<Vec<_>>() } else { vec![c] },
                )
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_the_configuration_s() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert!(parse_size("12").unwrap_err().contains("at least"));
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn each_manager_and_scope_has_its_places() {
        let xdg = |_: &str| None;
        let home = Path::new("/home/ann");
        let user = places(Manager::Systemd, false, home, &xdg);
        assert_eq!(user.unit_path, Path::new("/home/ann/.config/systemd/user/mlxgate.service"));
        assert_eq!(user.env_file, Path::new("/home/ann/.config/mlxgate/env"));
        assert_eq!(user.log_dir, Path::new("/home/ann/.local/state/mlxgate"));
        let agent = places(Manager::Launchd, false, Path::new("/Users/ann"), &xdg);
        assert_eq!(agent.unit_path, Path::new("/Users/ann/Library/LaunchAgents/io.mlxgate.gateway.plist"));
        assert_eq!(
            places(Manager::Launchd, true, home, &xdg).unit_path.parent(),
            Some(Path::new("/Library/LaunchDaemons"))
        );
        assert_eq!(places(Manager::Systemd, true, home, &xdg).env_file, Path::new("/etc/mlxgate/env"));
    }

    /// Run as root (CI, this machine): `nobody` cannot read into a directory of mode 0700.
    #[test]
    fn a_system_service_s_user_is_checked_for_what_it_must_reach() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root to run `test` as another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let config = private.join("gateway.yaml");
        std::fs::write(&config, "").unwrap();
        let open = dir.path().join("open.yaml");
        std::fs::write(&open, "").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let parsed = crate::Config::parse(
            "backends: {local: {url: 'http://127.0.0.1:9'}}\nmodels: {qwen: {backend: local}}\n",
            &|_| None,
        )
        .unwrap();
        let sh = Path::new("/bin/sh");
        assert_eq!(
            unreachable_for("nobody", &config, sh, &parsed),
            [format!("nobody cannot read {} (the service runs as nobody)", config.display())]
        );
        assert!(unreachable_for("nobody", &open, sh, &parsed).is_empty());
    }

    #[test]
    fn tail_gives_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(tail(&path, 2).unwrap(), ["line 19998", "line 19999"]);
        std::fs::write(&path, "only\n").unwrap();
        assert_eq!(tail(&path, 5).unwrap(), ["only"]);
        // A character cut where the read starts, and a line that is not UTF-8: the lines after
        // them are still shown.
        let mut bytes = "☃".repeat(40_000).into_bytes();
        bytes.extend_from_slice(b"\nbad \xff line\nlast\n");
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(tail(&path, 2).unwrap(), ["bad \u{fffd} line", "last"]);
        std::fs::write(&path, format!("first\n{}\n", "x".repeat(70_000))).unwrap();
        assert_eq!(tail(&path, 2).unwrap(), ["x".repeat(64 * 1024 - 1)]);
        std::fs::write(&path, "a\x1b]0;owned\x07\x1b[2Jb\tc\n").unwrap();
        assert_eq!(tail(&path, 1).unwrap(), ["a\\u{1b}]0;owned\\u{7}\\u{1b}[2Jb\tc"]);
    }
}
