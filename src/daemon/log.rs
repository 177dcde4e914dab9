//! The daemon's log: one JSON object per line on standard error (journald keeps each as one
//! entry), always with `ts` (Unix seconds), `event` and a human-readable `msg`.

use std::io::Write;

/// Writes one log line: `fields` (an object) merged after `ts`, `event` and `msg`.
pub fn event(event: &str, msg: &str, fields: serde_json::Value) {
    let mut line = serde_json::Map::new();
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    line.insert("ts".into(), serde_json::json!((ts * 1000.0).round() / 1000.0));
    line.insert("event".into(), event.into());
    line.insert("msg".into(), msg.into());
    if let serde_json::Value::Object(extra) = fields {
        line.extend(extra);
    }
    let text = serde_json::Value::Object(line).to_string();
    // One write of the whole line, so lines from several threads never interleave; a log that
    // cannot be written (stderr closed) must not stop the service.
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// [`event`] without fields.
pub fn note(event_name: &str, msg: &str) {
    event(event_name, msg, serde_json::Value::Null);
}
