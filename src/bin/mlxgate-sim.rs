//! `mlxgate-sim`: the OpenAI-compatible test and benchmark server (see `mlxgate::sim`).
#![forbid(unsafe_code)]

use clap::Parser;
use mlxgate::sim::{Behaviour, Framing, Script, SimConfig, SimState, run};

#[derive(Parser)]
#[command(name = "mlxgate-sim", version, about = "OpenAI-compatible server with scripted timing and faults")]
struct Cli {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the chosen address is printed on the first line of stdout.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Requests generating at once; more wait inside the server (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    capacity: usize,
    /// Aggregate throughput with 1, 2, … requests generating, relative to one (e.g. 1,2.17,2.6).
    #[arg(long, value_delimiter = ',')]
    speedup: Vec<f64>,
    /// Model ids listed by /v1/models (repeatable).
    #[arg(long = "model")]
    models: Vec<String>,
    /// Response framing; default: the style's (`close`, HTTP/1.0, for mlx-lm; else `chunked`).
    #[arg(long, value_enum)]
    framing: Option<Framing>,
    /// Close a keep-alive connection idle this many milliseconds when its next request arrives,
    /// unanswered (the idle-close race of uvicorn's 5 s keep-alive, at its worst).
    #[arg(long)]
    idle_close_ms: Option<u64>,
    /// Answer 422 to any request carrying `stream_options`.
    #[arg(long)]
    refuse_stream_options: bool,
    /// Scripted turns for chat requests, from a JSON file (the simulator playing an agent's
    /// backend: call a tool, then answer in text after its result; see `mlxgate::sim::script`).
    #[arg(long, conflicts_with = "script_json")]
    script: Option<std::path::PathBuf>,
    /// The same script given inline, as JSON text.
    #[arg(long)]
    script_json: Option<String>,
    /// Keep mlx_lm.server's prompt cache: an LRU of this many whole sequences (its own
    /// `--prompt-cache-size`, default 10 there; 0 keeps nothing). Without it: the previous prompt.
    #[arg(long)]
    prompt_cache_size: Option<usize>,
    #[command(flatten)]
    defaults: Behaviour,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let script = match (&cli.script, &cli.script_json) {
        (Some(path), _) => match std::fs::read_to_string(path) {
            Ok(text) => Some((text, path.display().to_string())),
            Err(e) => {
                eprintln!("mlxgate-sim: cannot read the script {}: {e}", path.display());
                return std::process::ExitCode::FAILURE;
            }
        },
        (None, Some(text)) => Some((text.clone(), "--script-json".to_string())),
        (None, None) => None,
    };
    let script = match script.map(|(text, source)| Script::parse(&text).map_err(|e| (e, source))).transpose() {
        Ok(s) => s,
        Err((e, source)) => {
            eprintln!("mlxgate-sim: bad script in {source}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind((cli.host.as_str(), cli.port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mlxgate-sim: cannot listen on {}:{}: {e}", cli.host, cli.port);
            return std::process::ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("mlxgate-sim listening on http://{addr}"),
        Err(e) => eprintln!("mlxgate-sim: {e}"),
    }
    let state = SimState::new(SimConfig {
        defaults: cli.defaults,
        capacity: cli.capacity,
        speedup: cli.speedup,
        models: cli.models,
        framing: cli.framing,
        idle_close: cli.idle_close_ms.map(std::time::Duration::from_millis),
        refuse_stream_options: cli.refuse_stream_options,
        script,
        prompt_cache_size: cli.prompt_cache_size,
    });
    // `run` returns only when a request's exit_after crashes the server.
    run(listener, state).await;
    eprintln!("mlxgate-sim: exiting as asked by exit_after");
    std::process::ExitCode::from(137)
}
