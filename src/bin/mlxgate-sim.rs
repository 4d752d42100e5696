//! `mlxgate-sim`: the OpenAI-compatible test and benchmark server (see `mlxgate::sim`).
#![forbid(unsafe_code)]

use clap::Parser;
use mlxgate::sim::{Behaviour, Framing, SimConfig, SimState, run};

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
    #[command(flatten)]
    defaults: Behaviour,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
    });
    // `run` returns only when a request's exit_after crashes the server.
    run(listener, state).await;
    eprintln!("mlxgate-sim: exiting as asked by exit_after");
    std::process::ExitCode::from(137)
}
