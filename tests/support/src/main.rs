//! `sluice-mock`: the mock model provider as a process, for load benches and
//! out-of-process tests.
//!
//! ```text
//! sluice-mock [--listen ADDR] [--chunks N] [--record] [--slow MODEL:N:MS]
//!
//! `--slow` makes every answer of MODEL a stream of N chunks, one every MS
//! milliseconds (the load bench's many-open-streams workload).
//! ```
//!
//! Prints `listening mock <addr>` once bound, then serves until killed.
//! Recording of requests is off unless `--record` is given (a bench would
//! otherwise grow without bound); scripting goes through `/_mock/*`.
//! Tokio worker threads: `MOCK_THREADS` (default 1).

use std::{io::Write, process::ExitCode};

use sluice_mock::{Mock, DEFAULT_CHUNKS};

struct Args {
    listen: String,
    chunks: usize,
    record: bool,
    slow: Vec<(String, usize, u64)>,
}

const USAGE: &str =
    "usage: sluice-mock [--listen ADDR] [--chunks N] [--record] [--slow MODEL:N:MS]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:0".to_owned(),
        chunks: DEFAULT_CHUNKS,
        record: false,
        slow: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg, None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--listen" => args.listen = value("--listen")?,
            "--chunks" => {
                let v = value("--chunks")?;
                args.chunks = v
                    .parse()
                    .map_err(|_| format!("--chunks: not a number: {v}"))?;
            }
            "--record" => args.record = true,
            "--slow" => {
                let v = value("--slow")?;
                let bad = || format!("--slow: expected MODEL:N:MS, got {v}");
                let mut parts = v.rsplitn(3, ':');
                let ms: u64 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
                let n: usize = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
                let model = parts.next().ok_or_else(bad)?.to_string();
                args.slow.push((model, n, ms));
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let threads = std::env::var("MOCK_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice-mock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mock = match Mock::bind(&args.listen).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("sluice-mock: cannot listen on {}: {e}", args.listen);
                return ExitCode::FAILURE;
            }
        };
        mock.set_default_chunks(args.chunks);
        mock.set_recording(args.record);
        for (model, n, ms) in &args.slow {
            let every = std::time::Duration::from_millis(*ms);
            mock.set_default(model, sluice_mock::Step::SlowChunks { n: *n, every });
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening mock {}", mock.addr());
        let _ = out.flush();
        drop(out);
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handling: serve until killed.
            std::future::pending::<()>().await;
        }
        ExitCode::SUCCESS
    })
}
