//! The control socket: newline-delimited JSON, one request object per line and one response line
//! each.
//!
//! | request | response |
//! |---|---|
//! | `{"cmd":"status"}` | `{"ok":true,"state":...,"in_flight":[...],"totals":{...},"models":{...},...}` |
//! | `{"cmd":"drain"}` | `{"ok":true,"state":"draining"}`; the daemon stops taking scenes, finishes those in flight and exits 0 |
//! | `{"cmd":"reload"}` | `{"ok":true,"kept":[...],"started":[...],"stopped":[...],"restart_needed":[...]}` once the new configuration is in force, or `{"ok":false,"error":...}` (the old one stays) |
//!
//! Anything else gets `{"ok":false,"error":...}` naming what was wrong; the connection stays open.

use std::sync::Arc;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::{Shared, log};

/// The longest request line.
const MAX_REQUEST: u64 = 64 << 10;

/// What the control socket asks of the service loop.
#[derive(Debug)]
pub enum Command {
    /// Stop intake, finish the scenes in flight, exit.
    Drain,
    /// Re-read the configuration; the response goes back on the sender.
    Reload(oneshot::Sender<serde_json::Value>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    cmd: String,
}

/// Serves the control socket until the task is aborted.
pub async fn serve(listener: std::os::unix::net::UnixListener, shared: Arc<Shared>, commands: mpsc::Sender<Command>) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            log::note("control_failed", &format!("control socket: {e}"));
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(client(stream, shared.clone(), commands.clone()));
            }
            Err(e) => {
                log::note("control_failed", &format!("control socket accept: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn client(stream: tokio::net::UnixStream, shared: Arc<Shared>, commands: mpsc::Sender<Command>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match (&mut read).take(MAX_REQUEST + 1).read_until(b'\n', &mut line).await {
            Ok(n) => n,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        let too_long = line.len() as u64 > MAX_REQUEST;
        let response = if too_long {
            error(format!("a request line longer than {MAX_REQUEST} bytes"))
        } else {
            answer(&line, &shared, &commands).await
        };
        let mut text = response.to_string();
        text.push('\n');
        if write.write_all(text.as_bytes()).await.is_err() || too_long {
            return;
        }
    }
}

fn error(message: String) -> serde_json::Value {
    serde_json::json!({"ok": false, "error": message})
}

async fn answer(line: &[u8], shared: &Shared, commands: &mpsc::Sender<Command>) -> serde_json::Value {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    let req: Request = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => return error(format!("request `{}`: {e}", text.escape_debug())),
    };
    match req.cmd.as_str() {
        "status" => shared.status_report(),
        "drain" => {
            if commands.send(Command::Drain).await.is_err() {
                return error("the service is stopping".into());
            }
            serde_json::json!({"ok": true, "state": "draining"})
        }
        "reload" => {
            let (tx, rx) = oneshot::channel();
            if commands.send(Command::Reload(tx)).await.is_err() {
                return error("the service is stopping".into());
            }
            rx.await
                .unwrap_or_else(|_| error("the service stopped before the reload ended".into()))
        }
        other => error(format!(
            "unknown command `{}`: status, drain or reload",
            other.escape_debug()
        )),
    }
}
