//! A minimal HTTP/1.1 server for the metrics endpoint: `GET /metrics` answers the exposition of
//! the latest snapshot, every other path 404 and every other method 405; one connection at a
//! time, closed after each answer.
//!
//! It runs on a thread of its own over a listener the caller bound (so `127.0.0.1:0` works and
//! the caller knows the port before the run starts), blocked in `accept`: it costs nothing
//! between scrapes. [`MetricsServer::stop`] sets a flag and connects once to wake it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::TelemetryError;
use super::prometheus::{CONTENT_TYPE, LatestSnapshot};

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read.
const MAX_HEAD: usize = 8192;

/// Binds `addr` for the metrics endpoint. Only loopback addresses are accepted: the endpoint
/// has no authentication, so it is for a local scraper (or a proxy in front of it).
pub fn bind_local(addr: &str) -> Result<TcpListener, TelemetryError> {
    let err = |why: String| TelemetryError::Endpoint {
        addr: addr.to_string(),
        why,
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| err(format!("not an address: {e}")))?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(err(
            "not a loopback address (the endpoint has no authentication: use 127.0.0.1:PORT or [::1]:PORT)".into(),
        ));
    }
    TcpListener::bind(&addrs[..]).map_err(|e| err(format!("cannot bind: {e}")))
}

/// The running endpoint; stopped when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `latest` on `listener` from a new thread.
    pub fn start(listener: TcpListener, latest: LatestSnapshot) -> Result<Self, TelemetryError> {
        let addr = listener.local_addr().map_err(|e| TelemetryError::Endpoint {
            addr: "listener".into(),
            why: e.to_string(),
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("hsiedge-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    // A failed accept (a client gone before it was taken) ends nothing.
                    if let Ok(stream) = conn {
                        let _ = answer(stream, &latest);
                    }
                }
            })
            .map_err(|e| TelemetryError::Endpoint {
                addr: addr.to_string(),
                why: format!("cannot start its thread: {e}"),
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.stop.store(true, Ordering::Release);
        // Wakes the blocked accept; if the connect fails the thread was not in accept anyway.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        let _ = thread.join();
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads one request head and answers it.
fn answer(stream: TcpStream, latest: &LatestSnapshot) -> std::io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    // A client cannot make the server buffer more than one head's worth, however long its lines.
    let mut reader = BufReader::new(Read::take(&stream, MAX_HEAD as u64));
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The rest of the head is read and ignored, so the client sees its request consumed.
    let mut seen = request.len();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line)?;
        seen += n;
        if n == 0 || line == "\r\n" || line == "\n" || seen >= MAX_HEAD {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", latest.render()),
        ("GET" | "HEAD", _) => ("404 Not Found", "not found: the metrics are at /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "only GET /metrics\n".to_string()),
    };
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut out = &stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        out.write_all(body.as_bytes())?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Snapshot;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => return format!("connect: {e}"),
        };
        let _ = s.write_all(request.as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_metrics_404_405_and_stops() {
        let listener = bind_local("127.0.0.1:0");
        let Ok(listener) = listener else {
            panic!("cannot bind loopback: {:?}", listener.err())
        };
        let latest = LatestSnapshot::new();
        let server = MetricsServer::start(listener, latest.clone());
        let Ok(server) = server else {
            panic!("{:?}", server.err())
        };
        let addr = server.addr();
        let before = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(before.starts_with("HTTP/1.1 200 OK\r\n"), "{before}");
        assert!(before.contains("hsiedge_telemetry_snapshots_total 0"), "{before}");
        latest.set(&Snapshot {
            seq: 2,
            pixels_done: 4242,
            ..Default::default()
        });
        let after = get(addr, "GET /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(after.contains(CONTENT_TYPE), "{after}");
        assert!(after.contains("\nhsiedge_pixels_total 4242\n"), "{after}");
        let (head, body) = after.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, "GET /metricsx HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        // A client that connects and sends nothing is dropped after the read timeout, not served
        // forever; the next one is served.
        let idle = TcpStream::connect(addr);
        assert!(get(addr, "GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        drop(idle);
        server.stop();
        // Stopped: nothing accepts any more.
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn refuses_non_loopback_and_bad_addresses() {
        for addr in ["0.0.0.0:0", "192.0.2.1:9184", "nonsense"] {
            let err = bind_local(addr).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.starts_with(&format!("metrics endpoint {addr}: ")), "{err}");
        }
    }
}
