//! A TCP proxy with an added delay on every answer: the load bench's "Redis one
//! network hop away" (`FaultProxy` in the library).
//!
//! `sluice-faultproxy TARGET DELAY_US` prints `listening proxy ADDR` and forwards
//! until killed.

use sluice_mock::fault_proxy::FaultProxy;
use std::io::Write as _;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(target), Some(delay)) = (args.next(), args.next()) else {
        eprintln!("usage: sluice-faultproxy TARGET DELAY_US");
        std::process::exit(2);
    };
    let delay: u64 = delay.parse().expect("DELAY_US: a number");
    let proxy = FaultProxy::start(&target).await;
    proxy.set_delay(Duration::from_micros(delay));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening proxy {}", proxy.addr());
    let _ = out.flush();
    drop(out);
    std::future::pending::<()>().await;
}
