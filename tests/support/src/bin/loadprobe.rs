//! A small load probe for streaming benchmarks: sends streaming chat requests over
//! kept-alive HTTP/1.1 connections at a fixed concurrency and reports time to first
//! byte and time to last byte, and checks every SSE frame arrived.
//!
//! `sluice-loadprobe URL KEY BODY_FILE CONCURRENCY REQUESTS EXPECTED_FRAMES`
//! prints one JSON line: {"requests","ttfb_p50_us","ttfb_p99_us","total_p50_us","total_p99_us","frames_ok"}.

use std::io::Write as _;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Sample {
    ttfb_us: u64,
    total_us: u64,
    frames: usize,
}

/// Reads one chunked (or content-length) response; returns (ttfb, frames).
async fn one(
    conn: &mut BufReader<TcpStream>,
    req: &[u8],
    started: Instant,
) -> std::io::Result<(u64, usize)> {
    conn.get_mut().write_all(req).await?;
    // Headers.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        return Err(std::io::Error::other(format!(
            "status: {}",
            head.lines().next().unwrap_or("")
        )));
    }
    let mut ttfb = None;
    let mut body = Vec::new();
    if head.contains("transfer-encoding: chunked") {
        loop {
            let mut line = Vec::new();
            while !line.ends_with(b"\r\n") {
                if conn.read(&mut byte).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                line.push(byte[0]);
            }
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&line)
                    .trim()
                    .split(';')
                    .next()
                    .unwrap_or("0"),
                16,
            )
            .map_err(std::io::Error::other)?;
            let mut chunk = vec![0u8; size + 2];
            conn.read_exact(&mut chunk).await?;
            if size == 0 {
                break;
            }
            if ttfb.is_none() && chunk.windows(6).any(|w| w == b"data: ") {
                ttfb = Some(started.elapsed().as_micros() as u64);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        body.resize(len, 0);
        conn.read_exact(&mut body).await?;
        ttfb = Some(started.elapsed().as_micros() as u64);
    }
    let frames = body.windows(6).filter(|w| *w == b"data: ").count();
    Ok((ttfb.unwrap_or(0), frames))
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 7 {
        eprintln!("usage: sluice-loadprobe URL KEY BODY_FILE CONCURRENCY REQUESTS EXPECTED_FRAMES");
        std::process::exit(2);
    }
    let url = a[1].strip_prefix("http://").expect("http URL").to_string();
    let (authority, path) = url.split_at(url.find('/').unwrap_or(url.len()));
    let body = std::fs::read(&a[3]).expect("body file");
    let conc: usize = a[4].parse().expect("concurrency");
    let total: usize = a[5].parse().expect("requests");
    let expected: usize = a[6].parse().expect("frames");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        a[2],
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let req = std::sync::Arc::new(req);
    let per = total.div_ceil(conc);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let req = req.clone();
        let authority = authority.to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = BufReader::new(TcpStream::connect(&authority).await.expect("connect"));
            let mut out = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                match one(&mut conn, &req, t).await {
                    Ok((ttfb_us, frames)) => out.push(Sample {
                        ttfb_us,
                        total_us: t.elapsed().as_micros() as u64,
                        frames,
                    }),
                    Err(e) => {
                        eprintln!("request failed: {e}");
                        conn = BufReader::new(
                            TcpStream::connect(&authority).await.expect("reconnect"),
                        );
                    }
                }
            }
            out
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.expect("task"));
    }
    let frames_ok = samples.iter().all(|s| s.frames >= expected);
    let mut ttfb: Vec<u64> = samples.iter().map(|s| s.ttfb_us).collect();
    let mut tot: Vec<u64> = samples.iter().map(|s| s.total_us).collect();
    let line = format!(
        "{{\"requests\":{},\"ttfb_p50_us\":{},\"ttfb_p99_us\":{},\"total_p50_us\":{},\"total_p99_us\":{},\"frames_ok\":{}}}",
        samples.len(),
        pct(&mut ttfb, 0.5),
        pct(&mut ttfb, 0.99),
        pct(&mut tot, 0.5),
        pct(&mut tot, 0.99),
        frames_ok
    );
    let _ = writeln!(std::io::stdout(), "{line}");
}
