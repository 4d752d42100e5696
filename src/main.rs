//! The `mlxgate` command: `serve` runs the gateway, `check` validates a gateway.yaml, `reload`
//! makes a running gateway put its file's keys and limits in force, `drain` takes a backend out
//! of service (and back), `bench` measures what users see of a model's server (directly or
//! through mlxgate).
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use mlxgate::Config;
use tracing_subscriber::EnvFilter;

/// mimalloc: glibc's allocator made counting a long prompt (the tokenizer allocates per piece)
/// twice as slow, most of it in malloc/free; the gateway's small per-request allocations gain
/// too. Built with `no_thp`: mimalloc 2.3 asks Linux for transparent huge pages on its arenas,
/// so each segment touched costs 2 MiB pages: 17.6 MiB idle and 68 MiB with 1000 streams,
/// against 9.4 and 46 MiB without, at the same request rate (measured side by side).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "mlxgate", version, about = "OpenAI-compatible gateway for local MLX servers")]
struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, env = "MLXGATE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The configuration file.
        #[arg(long, short, default_value = "gateway.yaml", env = "MLXGATE_CONFIG")]
        config: PathBuf,
        /// Write no access-log line (one per request, target `mlxgate::access`), whatever
        /// gateway.yaml's `access_log` says.
        #[arg(long, env = "MLXGATE_NO_ACCESS_LOG")]
        no_access_log: bool,
        /// Read environment variables (the values of the file's `${VAR}`s) from this file of
        /// `NAME=value` lines before the configuration; it must be readable by its owner only
        /// (mode 0600). Its values win over the environment's.
        #[arg(long, env = "MLXGATE_ENV_FILE")]
        env_file: Option<PathBuf>,
        #[command(flatten)]
        log_file: LogFileOptions,
    },
    /// Run the gateway as a service that starts at login and restarts after a crash: a launchd
    /// LaunchAgent on macOS, a systemd user unit on Linux (`--system`: at boot).
    #[command(subcommand)]
    Service(mlxgate::service::ServiceCommand),
    /// Validate a configuration file and list every problem in it.
    Check {
        #[arg(long, short, default_value = "gateway.yaml", env = "MLXGATE_CONFIG")]
        config: PathBuf,
        /// Take `${VAR}` values from this environment file first (as `serve --env-file` does).
        #[arg(long)]
        env_file: Option<PathBuf>,
    },
    /// Print the JSON Schema of gateway.yaml, for editors to complete and check its keys (the
    /// repository ships it as gateway.schema.json; gateway.yaml's first line names it).
    Schema,
    /// Make the running gateway re-read its configuration file and put its clients, keys and
    /// limits in force (it is sent SIGHUP; running streams go on). The file is checked first: an
    /// invalid one is not sent for.
    Reload {
        /// The gateway's configuration file: checked, and its `listen` port finds the gateway.
        #[arg(long, short, env = "MLXGATE_CONFIG")]
        config: Option<PathBuf>,
        /// The gateway's process id, when its pid file cannot find it.
        #[arg(long)]
        pid: Option<u32>,
        /// The gateway's environment file (`serve --env-file`): its values answer the file's
        /// `${VAR}`s this shell does not set (a service's `listen: ${LISTEN}`).
        #[arg(long)]
        env_file: Option<PathBuf>,
    },
    /// Drain a backend of the running gateway for maintenance: it takes no new request (its
    /// models' other backends serve them) while its running requests finish; `--undrain` takes
    /// it back. Prints the backend as `/admin/backends` shows it.
    Drain {
        /// The backend's name in gateway.yaml.
        backend: String,
        /// Take the backend back instead.
        #[arg(long)]
        undrain: bool,
        /// The gateway's configuration file: its `listen` finds the gateway.
        #[arg(long, short, default_value = "gateway.yaml", env = "MLXGATE_CONFIG")]
        config: PathBuf,
        /// The gateway's base URL (http://host:port), instead of the file's `listen`.
        #[arg(long)]
        url: Option<String>,
        /// The admin key, when the gateway has one (`admin_key_sha256`); without it, the call
        /// is made from this machine, which a gateway with no admin key admits.
        #[arg(long, env = "MLXGATE_ADMIN_KEY", hide_env_values = true)]
        admin_key: Option<String>,
        /// The gateway's environment file (`serve --env-file`), for the file's `${VAR}`s.
        #[arg(long)]
        env_file: Option<PathBuf>,
    },
    /// Measure a model's server as its users see it: wall tokens/s, time to first token, decode
    /// tokens/s and the batching speedup, medians over repeats, for each prompt size.
    ///
    /// Each prompt is generated here (no download), sized with the model's tokenizer when one
    /// is found, and differs from every other in its first characters, so that a server's prompt
    /// cache does not turn repeats into cache hits. Tokens are the server's usage (asked for with
    /// stream_options.include_usage), never a count of frames; a stream whose tokens arrive
    /// mostly at once is flagged as a burst and gives no decode speed.
    Bench(Box<mlxgate::bench::BenchOptions>),
    /// Measure an OpenAI-compatible server's wire behaviour (framing, keep-alive, SSE shape,
    /// errors, concurrency, cancellation) and print the gateway.yaml backend stanza for it.
    Probe(mlxgate::probe::ProbeOptions),
    /// Internal: run COMMAND and stop its process group when standard input closes (the gateway
    /// runs each managed server this way so that none outlives it).
    #[command(hide = true)]
    Keep {
        /// SIGTERM to SIGKILL.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// Where the log goes: stderr, or a file rotated by size.
#[derive(clap::Args)]
struct LogFileOptions {
    /// Write the log (the gateway's lines, the access log, the managed servers' output) to this
    /// file instead of stderr, rotated by size: PATH.1 is the previous file, and so on.
    #[arg(long, env = "MLXGATE_LOG_FILE")]
    log_file: Option<PathBuf>,
    /// Each log file's size limit, like 10MiB: a line that would pass it starts a new file.
    #[arg(long, default_value = "10MiB", value_parser = mlxgate::service::parse_size, env = "MLXGATE_LOG_FILE_SIZE")]
    log_file_size: u64,
    /// How many rotated files to keep beside the current one; older ones are deleted.
    #[arg(long, default_value_t = mlxgate::log_file::DEFAULT_KEEP, value_parser = mlxgate::service::parse_keep, env = "MLXGATE_LOG_FILE_KEEP")]
    log_file_keep: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Keep { grace, command } = &cli.command {
        return mlxgate::backend::keeper::run(*grace, command);
    }
    // The environment file is read before anything else (its RUST_LOG is the log's filter);
    // a refusal is reported once the log is set up, so that it reaches the log file too.
    let mut env_refused = None;
    if let Command::Serve { env_file: Some(path), .. } = &cli.command {
        match load_env_file(path) {
            Ok(loaded) => mlxgate::reload::reload_with_env_file(path.clone(), loaded),
            Err(why) => env_refused = Some(why),
        }
    }
    let file = match &cli.command {
        Command::Serve { log_file: LogFileOptions { log_file: Some(path), log_file_size, log_file_keep }, .. } => {
            match mlxgate::log_file::LogFile::open(path, *log_file_size, *log_file_keep) {
                Ok(file) => Some(file),
                Err(e) => {
                    eprintln!("mlxgate: cannot open the log file: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    init_logging(cli.log_format, file);
    if let Some(why) = env_refused {
        eprintln!("mlxgate: --env-file {why}");
        if mlxgate::log_file::installed().is_some() {
            tracing::error!("--env-file {why}");
        }
        return ExitCode::FAILURE;
    }
    match cli.command {
        Command::Keep { .. } => ExitCode::SUCCESS,
        Command::Check { config, env_file } => match check(&config, env_file.as_deref()) {
            Ok(c) => {
                println!(
                    "{}: ok ({} backends, {} models, listening on {})",
                    config.display(),
                    c.backends.len(),
                    c.models.len(),
                    c.listen
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Schema => {
            print!("{}", mlxgate::config::schema::json_schema_text());
            ExitCode::SUCCESS
        }
        Command::Reload { config, pid, env_file } => reload(config, pid, env_file.as_deref()),
        Command::Drain { backend, undrain, config, url, admin_key, env_file } => {
            drain(&backend, !undrain, &config, url, admin_key.as_deref(), env_file.as_deref())
        }
        Command::Bench(options) => mlxgate::bench::main(*options),
        Command::Probe(options) => mlxgate::probe::main(options),
        Command::Service(command) => mlxgate::service::main(command, matches!(cli.log_format, LogFormat::Json)),
        Command::Serve { config, no_access_log, .. } => {
            let mut loaded = match load(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if no_access_log {
                loaded.access_log = false;
            }
            raise_open_files_limit();
            let runtime = match runtime_for(loaded.worker_threads) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(loaded, config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("mlxgate: {e}");
                    if mlxgate::log_file::installed().is_some() {
                        eprintln!("mlxgate: {e}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Loads and validates `path`, then checks that every managed backend's venv and program exist
/// on this machine; prints every problem and gives the exit code when any is found. With a log
/// file, the problems are logged there too (where `mlxgate service status` shows them).
fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    mlxgate::reload::check_file(path).map_err(|problems| refused(path, &problems))
}

fn refused(path: &std::path::Path, problems: &[String]) -> ExitCode {
    let text = format!("{}: invalid configuration\n{}", path.display(), problems.join("\n"));
    eprintln!("{text}");
    if mlxgate::log_file::installed().is_some() {
        tracing::error!("{text}");
    }
    ExitCode::FAILURE
}

/// `mlxgate check`: as [`load`], with `${VAR}`s from `env_file` first when given.
fn check(path: &std::path::Path, env_file: Option<&std::path::Path>) -> Result<Config, ExitCode> {
    let Some(env_file) = env_file else { return load(path) };
    let vars = mlxgate::config::env_file::read(env_file).map_err(|why| {
        eprintln!("mlxgate check: --env-file {why}");
        ExitCode::FAILURE
    })?;
    mlxgate::reload::check_file_with_env(path, &|name| vars.get(name).cloned().or_else(|| std::env::var(name).ok()))
        .map_err(|problems| refused(path, &problems))
}

/// `mlxgate reload`: checks the file (an invalid one would be refused by the gateway anyway),
/// then signals the gateway its pid file or `--pid` names. 0 when signalled, 1 with the reason.
fn reload(config: Option<PathBuf>, pid: Option<u32>, env_file: Option<&std::path::Path>) -> ExitCode {
    use mlxgate::reload::{Target, signal_gateway};
    // With --pid alone there is no file to check: the gateway reads the one it was started with.
    let config = config.or_else(|| pid.is_none().then(|| PathBuf::from("gateway.yaml")));
    let vars = match env_file_vars(env_file) {
        Ok(vars) => vars,
        Err(why) => {
            eprintln!("mlxgate reload: {why}");
            return ExitCode::FAILURE;
        }
    };
    let checked = match &config {
        Some(path) => match mlxgate::reload::check_file_elsewhere_with(path, &vars) {
            Ok((c, unset)) => {
                for name in unset {
                    eprintln!(
                        "note: {name} is not set in this shell; the gateway reads it from its own environment \
                         (its log says if it is unset there too)"
                    );
                }
                Some(c)
            }
            Err(problems) => {
                eprintln!(
                    "{}: invalid configuration, not reloaded (the gateway keeps the keys and limits in force)\n{}",
                    path.display(),
                    problems.join("\n")
                );
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let target = match (pid, &checked) {
        (Some(pid), _) => Target::Pid(pid),
        (None, Some(c)) => Target::Port(c.listen.port()),
        (None, None) => Target::Port(0),
    };
    match signal_gateway(target) {
        Ok(done) => {
            println!(
                "sent SIGHUP to the gateway (pid {}): it reloads clients, keys and limits from the file it was \
                 started with; its log says what changed or why it kept the old ones",
                done.pid
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("mlxgate reload: not reloaded: {why}");
            ExitCode::FAILURE
        }
    }
}

/// `mlxgate drain`: finds the gateway (`--url`, else the file's `listen`), makes the admin
/// call, prints the backend's entry. 0 when done, 1 with the reason.
fn drain(
    backend: &str,
    drained: bool,
    config: &std::path::Path,
    url: Option<String>,
    key: Option<&str>,
    env_file: Option<&std::path::Path>,
) -> ExitCode {
    let base = match url {
        Some(url) => Ok(url),
        None => match env_file_vars(env_file).and_then(|vars| {
            mlxgate::reload::check_file_elsewhere_with(config, &vars).map_err(|problems| {
                format!(
                    "{}: invalid configuration, so the gateway's address is unknown (give --url)\n{}",
                    config.display(),
                    problems.join("\n")
                )
            })
        }) {
            Ok((c, _)) => mlxgate::control::gateway_url(c.listen),
            Err(why) => Err(why),
        },
    };
    let done = base.and_then(|base| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        runtime.block_on(mlxgate::control::drain(&base, key, backend, drained))
    });
    match done {
        Ok(entry) => {
            let in_flight = entry["in_flight"].as_u64().unwrap_or(0);
            if drained {
                println!("backend {backend} drained: it takes no new request; {in_flight} running finish there");
            } else {
                println!("backend {backend} undrained: it takes requests again");
            }
            println!("{}", serde_json::to_string_pretty(&entry).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(why) => {
            let verb = if drained { "drain" } else { "undrain" };
            eprintln!("mlxgate drain: {backend} not {verb}ed: {why}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime that serves the connections: tokio's threads (`worker_threads: 0`, the default:
/// one per core), or one thread, an event loop (`1`: no wake-ups across threads, the least work
/// per request, but a large body's parsing holds the others). Counting prompts and other
/// blocking work has its own threads either way.
fn runtime_for(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match worker_threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
}

async fn run(config: Config, path: PathBuf) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen)))?;
    let keeper = std::env::current_exe()?;
    mlxgate::serve_file(config, path, listener, shutdown_signal(), keeper).await
}

/// Raises the soft open-files limit to the hard one, so that client connections are not refused
/// at a soft limit as low as macOS's default of 256; logs the limit the gateway runs with.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        tracing::warn!("cannot read the open-files limit");
        return;
    };
    let target = open_files_target(hard);
    if soft >= target {
        tracing::info!(limit = soft, "open files limit left as it is (already the highest allowed)");
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => tracing::info!("open files limit raised from {soft} to {target}"),
        Err(e) => tracing::warn!(limit = soft, hard, error = %e, "open files limit could not be raised"),
    }
}

/// The soft limit to ask for: the hard one, except that macOS refuses a soft limit above
/// OPEN_MAX (10240) however high (even unlimited) the hard limit is.
fn open_files_target(hard: nix::sys::resource::rlim_t) -> nix::sys::resource::rlim_t {
    const OPEN_MAX: nix::sys::resource::rlim_t = 10240;
    if cfg!(target_os = "macos") || hard == nix::sys::resource::RLIM_INFINITY { hard.min(OPEN_MAX) } else { hard }
}

/// Resolves on SIGINT or SIGTERM; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; stop the gateway with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    // A second signal (a second Ctrl-C) does not wait for the grace period: exit now. The
    // keepers see their pipes close and stop the servers.
    tokio::spawn(async move {
        // The shell's convention: 128 + the signal's number.
        let code = tokio::select! {
            _ = term.recv() => 143,
            _ = int.recv() => 130,
        };
        tracing::warn!("second signal: exiting now, without waiting for running requests");
        std::process::exit(code);
    });
}

/// Sets the variables of an environment file (`--env-file`) in this process, so that the
/// configuration's `${VAR}`s and the managed servers see them.
/// The names it set.
#[allow(unsafe_code)]
fn load_env_file(path: &std::path::Path) -> Result<std::collections::BTreeSet<String>, String> {
    let vars = mlxgate::config::env_file::read(path)?;
    let names = vars.keys().cloned().collect();
    for (name, value) in vars {
        // SAFETY: called first thing in main, before the runtime or any other thread exists, so
        // no other thread can read the environment while it changes.
        unsafe { std::env::set_var(name, value) };
    }
    Ok(names)
}

/// The variables of a running gateway's environment file (`reload`, `drain --env-file`).
fn env_file_vars(path: Option<&std::path::Path>) -> Result<std::collections::BTreeMap<String, String>, String> {
    path.map_or(Ok(Default::default()), |p| {
        mlxgate::config::env_file::read(p).map_err(|why| format!("--env-file {why}"))
    })
}

fn init_logging(format: LogFormat, file: Option<mlxgate::log_file::LogFile>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal: log files and pipes get plain `key=value` text.
    let to_file = file.is_some();
    if let Some(file) = file {
        // The only call: main opens one file, once.
        mlxgate::log_file::install(file);
        // A panic's message goes to the log file too, not only to the service's stderr.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            tracing::error!("panic: {info}");
            default_hook(info);
        }));
    }
    let ansi = !to_file && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(mlxgate::log_file::Writer);
    match format {
        LogFormat::Text => {
            builder.init();
            // Plain text to a file or a pipe: the access line is written without the formatter
            // (the same text, a tenth of the request's work less).
            if !ansi {
                mlxgate::access_log::text::enable();
            }
        }
        LogFormat::Json => builder.json().init(),
    }
}
