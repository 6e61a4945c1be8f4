//! The shaping TCP proxy: forwards every accepted connection to one upstream address, delaying
//! the data of each direction by a fixed one-way delay (a delay line, so the delay does not
//! bound throughput) and pacing each direction of each connection with a token bucket.
//!
//! It runs inside the environment's namespace (see the crate docs for why this is not `tc`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

/// Largest read from a socket.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes one direction of one connection may hold in its delay line before it stops reading
/// (then TCP flow control pushes back on the sender).
const MAX_IN_FLIGHT: usize = 16 * 1024 * 1024;
/// Credit a paced direction may accumulate while idle or behind (absorbs timer granularity).
const PACING_SLACK: Duration = Duration::from_millis(5);

/// What the proxy does to each direction of each connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shaping {
    /// Added to every byte in each direction (half the round-trip time).
    pub one_way_delay: Duration,
    /// Pace of each direction of each connection, bytes/s; `None`: unlimited.
    pub rate: Option<u64>,
}

impl Shaping {
    fn is_none(&self) -> bool {
        self.one_way_delay.is_zero() && self.rate.is_none()
    }
}

/// Accepts connections forever, forwarding each to `upstream` with `shaping`.
pub async fn serve(listener: TcpListener, upstream: SocketAddr, shaping: Shaping) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(async move {
                    if let Err(e) = handle(client, upstream, shaping).await {
                        if !matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                        ) {
                            eprintln!("silt-bench proxy: connection: {e}");
                        }
                    }
                });
            }
            Err(e) => {
                // Out of descriptors and the like: back off briefly instead of spinning.
                eprintln!("silt-bench proxy: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Forwards one connection until both directions are closed (or either fails).
pub async fn handle(
    client: TcpStream,
    upstream: SocketAddr,
    shaping: Shaping,
) -> std::io::Result<()> {
    let accepted = Instant::now();
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // The client's connect() returned at once (the proxy is a veth hop away), where a remote
    // server costs a round trip first: hold the client's first bytes until a request sent
    // after a real handshake would have reached the server (1.5 RTT after the SYN).
    let handshake_done = accepted + shaping.one_way_delay * 3;
    // On the first error the other direction is dropped too, which closes both sockets.
    tokio::try_join!(
        pipe(cr, sw, shaping, handshake_done),
        pipe(sr, cw, shaping, accepted)
    )?;
    Ok(())
}

/// One direction: read → delay line (nothing leaves before `not_before`) → pacer → write; EOF is forwarded as a write shutdown
/// once every byte before it has been delivered.
async fn pipe(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    shaping: Shaping,
    not_before: Instant,
) -> std::io::Result<()> {
    if shaping.is_none() {
        tokio::io::copy(&mut r, &mut w).await?;
        return w.shutdown().await;
    }
    let budget = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reader = async {
        loop {
            // Wait for room first, so a full delay line stops reading (flow control).
            let permit = budget
                .clone()
                .acquire_many_owned(READ_CHUNK as u32)
                .await
                .map_err(std::io::Error::other)?;
            let mut buf = vec![0u8; READ_CHUNK];
            let n = r.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            buf.shrink_to_fit();
            let arrival = Instant::now();
            if tx.send((arrival, buf, permit)).is_err() {
                break;
            }
        }
        drop(tx);
        Ok::<(), std::io::Error>(())
    };
    let writer = async {
        let mut pacer = Pacer::new(shaping.rate);
        while let Some((arrival, buf, permit)) = rx.recv().await {
            tokio::time::sleep_until((arrival + shaping.one_way_delay).max(not_before)).await;
            for piece in buf.chunks(pacer.quantum) {
                pacer.wait(piece.len()).await;
                w.write_all(piece).await?;
            }
            drop(permit);
        }
        w.shutdown().await
    };
    tokio::try_join!(reader, writer)?;
    Ok(())
}

/// A token bucket kept as a virtual clock: `next` is when the next byte may leave.
struct Pacer {
    rate: Option<u64>,
    next: Instant,
    /// Largest write at once (about 2 ms worth of bytes at the rate).
    quantum: usize,
}

impl Pacer {
    fn new(rate: Option<u64>) -> Pacer {
        let quantum = match rate {
            Some(r) => (r / 500).clamp(1024, READ_CHUNK as u64) as usize,
            None => READ_CHUNK,
        };
        Pacer {
            rate,
            next: Instant::now(),
            quantum,
        }
    }

    async fn wait(&mut self, n: usize) {
        let Some(rate) = self.rate.filter(|r| *r > 0) else {
            return;
        };
        let now = Instant::now();
        if let Some(floor) = now.checked_sub(PACING_SLACK) {
            if self.next < floor {
                self.next = floor;
            }
        }
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        }
        self.next += Duration::from_secs_f64(n as f64 / rate as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    /// An upstream that echoes everything and closes its side after the client's EOF.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        addr
    }

    async fn start_proxy(shaping: Shaping) -> SocketAddr {
        let upstream = echo_server().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, upstream, shaping));
        addr
    }

    /// Sends `payload`, half-closes, and returns everything read until the proxy closes.
    async fn round_trip(proxy: SocketAddr, payload: Arc<Vec<u8>>) -> Vec<u8> {
        let stream = TcpStream::connect(proxy).await.unwrap();
        let (mut r, mut w) = stream.into_split();
        let p = payload.clone();
        let sender = tokio::spawn(async move {
            // Uneven writes, to exercise chunking.
            for piece in p.chunks(77_777) {
                w.write_all(piece).await.unwrap();
            }
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        // Returns at EOF: the proxy forwarded our EOF and the echo server's close back.
        r.read_to_end(&mut got).await.unwrap();
        sender.await.unwrap();
        got
    }

    fn random(len: usize) -> Arc<Vec<u8>> {
        let mut v = vec![0u8; len];
        rand::thread_rng().fill_bytes(&mut v);
        Arc::new(v)
    }

    async fn check(shaping: Shaping, len: usize, connections: usize) {
        let proxy = start_proxy(shaping).await;
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let payload = random(len);
            tasks.push(tokio::spawn(async move {
                let got = round_trip(proxy, payload.clone()).await;
                assert_eq!(got.len(), payload.len());
                assert!(got == *payload, "bytes changed in transit");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pass_through_unchanged() {
        check(Shaping::default(), 8 << 20, 2).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delay_line_keeps_bytes_and_closes() {
        let shaping = Shaping {
            one_way_delay: Duration::from_millis(2),
            rate: None,
        };
        check(shaping, 8 << 20, 2).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paced_and_delayed_keeps_bytes_and_closes() {
        let shaping = Shaping {
            one_way_delay: Duration::from_millis(1),
            rate: Some(64 << 20),
        };
        check(shaping, 4 << 20, 3).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn empty_connection_closes() {
        let shaping = Shaping {
            one_way_delay: Duration::from_millis(1),
            rate: Some(1 << 20),
        };
        check(shaping, 0, 1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unreachable_upstream_closes_client() {
        // A port that was free a moment ago: nothing listens, so the proxy drops the client.
        let upstream = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, upstream, Shaping::default()));
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        // EOF or reset, but never a hang.
        let _ = s.read_to_end(&mut buf).await;
        assert!(buf.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn pacer_advances_virtual_clock() {
        let mut p = Pacer::new(Some(1_000_000));
        assert_eq!(p.quantum, 2000);
        let start = p.next;
        p.wait(1000).await;
        p.wait(1000).await;
        // Paused clock: the schedule is exact (correctness of the arithmetic, not timing).
        assert_eq!(p.next - start, Duration::from_millis(2));
        let mut unlimited = Pacer::new(None);
        unlimited.wait(1 << 20).await;
        assert_eq!(unlimited.quantum, READ_CHUNK);
    }
}
