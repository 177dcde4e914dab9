//! What the daemon tests share: a running `hsiedge serve` with its log collected, configurations,
//! the sensor, classify and raw stream frames.
#![allow(dead_code)]

use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

/// A running `hsiedge serve` whose log lines (JSON) are collected as they come.
pub struct Daemon {
    pub child: Child,
    pub log: Arc<Mutex<Vec<Value>>>,
    pub dir: PathBuf,
}

/// One model table of the configuration.
pub struct Model<'a> {
    pub name: &'a str,
    pub manifest: &'a Path,
    pub mode: &'a str,
    pub batch: usize,
}

pub fn write_config(dir: &Path, models: &[Model], extra_intake: &str) -> PathBuf {
    write_config_with(dir, models, extra_intake, "")
}

pub fn write_config_with(dir: &Path, models: &[Model], extra_intake: &str, tables: &str) -> PathBuf {
    let mut text = format!(
        "[listen]\ntcp = \"127.0.0.1:0\"\nunix = \"{d}/stream.sock\"\n\
         [paths]\noutbox = \"{d}/outbox\"\nstate = \"{d}/state\"\ncontrol = \"{d}/control.sock\"\n\
         [intake]\ndefault_model = \"{first}\"\n{extra_intake}\n{tables}\n",
        d = dir.display(),
        first = models[0].name
    );
    for m in models {
        text.push_str(&format!(
            "[models.{}]\nmanifest = \"{}\"\nmode = \"{}\"\nbatch = {}\ntile = 32\nthreads = 1\n",
            m.name,
            m.manifest.display(),
            m.mode,
            m.batch
        ));
    }
    let path = dir.join("hsiedge.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl Daemon {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(hsiedge(), dir)
    }

    pub fn start_with(mut command: std::process::Command, dir: &Path) -> Self {
        let mut child = command
            .args(["serve", "--config"])
            .arg(dir.join("hsiedge.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hsiedge serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, sink, pid) = (child.stderr.take().unwrap(), log.clone(), child.id());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                let mut v: Value = serde_json::from_str(&line).unwrap_or_else(|_| serde_json::json!({"raw": line}));
                // The daemon's resident memory when it reported the scene done.
                if v["event"] == "scene_done" {
                    v["vm_rss_kib"] = vm_rss_kib(pid).into();
                    v["threads"] = std::fs::read_dir(format!("/proc/{pid}/task"))
                        .map_or(0, |d| d.count())
                        .into();
                }
                sink.lock().unwrap().push(v);
            }
        });
        let d = Self {
            child,
            log,
            dir: dir.to_path_buf(),
        };
        d.wait_for("ready", |_| true, Duration::from_secs(60));
        d
    }

    /// The first log line of `event` that `pred` accepts, waiting up to `timeout`.
    pub fn wait_for(&self, event: &str, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.log.lock().unwrap().iter().find(|v| v["event"] == event && pred(v)) {
                return v.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "no `{event}` log line within {timeout:?}; log:\n{:#?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn events(&self, event: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["event"] == event)
            .cloned()
            .collect()
    }

    pub fn tcp(&self) -> String {
        let l = self.wait_for(
            "listening",
            |v| v["listener"].as_str().unwrap().starts_with("tcp "),
            Duration::ZERO,
        );
        format!("tcp:{}", &l["listener"].as_str().unwrap()[4..])
    }

    pub fn unix(&self) -> String {
        format!("unix:{}", self.dir.join("stream.sock").display())
    }

    pub fn control(&self, cmd: &str) -> Value {
        let mut s = UnixStream::connect(self.dir.join("control.sock")).expect("control socket");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to end; its exit code.
    pub fn wait(mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(start.elapsed() < timeout, "the daemon did not exit within {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `simulate-sensor` to completion.
pub fn sensor(scene: &Path, addr: &str, extra: &[&str]) -> std::process::Output {
    hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(scene)
        .args(["--rate", "0", "--connect", addr])
        .args(extra)
        .output()
        .expect("spawn simulate-sensor")
}

/// Runs `simulate-sensor` and checks that the daemon took every scene: it closed the connection.
/// The wait for that close is long: the daemon reads a scene's last lines only as its tiles need
/// them, minutes after a fast sensor has sent them when the model is slow (an emulated CPU).
pub fn sensor_ok(scene: &Path, addr: &str, extra: &[&str]) {
    let extra: Vec<&str> = ["--close-wait", "900"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let extra = extra.as_slice();
    let out = sensor(scene, addr, extra);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "simulate-sensor {extra:?}: {err}");
    assert!(!err.contains("not confirmed"), "{err}");
}

pub fn classify(scene: &Path, model: &Path, mode: &str, batch: usize, out: &Path) {
    ok(&[
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mode",
        mode,
        "--batch",
        &batch.to_string(),
        "--tile",
        "32",
        "--threads",
        "1",
    ]);
}

pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Asserts the maps of outbox folder `got` (one segment) equal those `classify` wrote in `want`.
pub fn same_maps(got: &Path, want: &Path) {
    for f in ["class_map.img", "confidence.img"] {
        let (g, w) = (read(&got.join("seg-000000").join(f)), read(&want.join(f)));
        assert!(g == w, "{f}: {} differs from {}", got.display(), want.display());
    }
}

pub fn tiny() -> PathBuf {
    root().join("models/fixtures/tiny/manifest.json")
}

/// A 4-band cube the tiny model runs on.
pub fn tiny_cube(dir: &Path, name: &str, lines: usize, samples: usize) -> PathBuf {
    write_cube(dir, name, lines, samples, 4, |l, b, s| {
        100.0 * (b + 1) as f32 + ((l * 7 + s * 3 + b) % 23) as f32
    })
}

/// A frame: a 4-byte big-endian length, then the CBOR of `v`.
pub fn frame(v: &ciborium::Value) -> Vec<u8> {
    let mut body = Vec::new();
    ciborium::into_writer(v, &mut body).unwrap();
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend(body);
    f
}

pub fn scene_msg(id: &str, bands: u64, model: Option<&str>) -> ciborium::Value {
    use ciborium::Value as V;
    let mut m = vec![
        (V::Text("type".into()), V::Text("scene".into())),
        (V::Text("scene_id".into()), V::Text(id.into())),
        (V::Text("samples".into()), V::Integer(8.into())),
        (V::Text("bands".into()), V::Integer(bands.into())),
        (V::Text("data_type".into()), V::Integer(4.into())),
        (V::Text("interleave".into()), V::Text("bil".into())),
        (V::Text("byte_order".into()), V::Integer(0.into())),
        (V::Text("version".into()), V::Integer(1.into())),
    ];
    if let Some(model) = model {
        m.push((V::Text("model".into()), V::Text(model.into())));
    }
    V::Map(m)
}

/// Sends `bytes` on a new connection and says whether the daemon closed it (end of stream or a
/// reset) within 10 s.
pub fn closed_after(addr: &Path, bytes: &[u8]) -> bool {
    let mut s = UnixStream::connect(addr).unwrap();
    // The daemon may close before everything is written: a broken pipe is a close too. The
    // writing side is closed after, so a frame cut short ends there.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
    }
}

/// Every path under `dir`, relative.
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out
}
