//! The stream's messages and their framing: a 4-byte big-endian length, then one CBOR item.

use std::io::{ErrorKind, Read};

use serde::{Deserialize, Serialize};

use super::scene::SceneHeader;

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;

/// Bytes of the length prefix before every message.
pub const PREFIX_BYTES: usize = 4;

/// Bounds a receiver enforces before it allocates or waits for anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest scene message (the first of a scene), in bytes after the prefix.
    pub max_header_bytes: usize,
    /// Bytes a line message may take beyond its raw line: the map, keys, sequence number and byte
    /// string header (34 bytes at most when encoded minimally); an `end` message must fit in it too.
    pub line_overhead: usize,
    /// The most lines one message may skip (a gap, or trailing lines an `end` declares missing).
    pub max_gap: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_header_bytes: 64 << 10,
            line_overhead: 64,
            max_gap: 1_000_000,
        }
    }
}

impl Limits {
    /// The longest message accepted inside a scene whose lines are `line_bytes` long: a line
    /// message, or at least a scene message, so that a scene sent before the last one's end is
    /// named as such rather than as an oversized message.
    pub fn max_scene_frame(&self, line_bytes: usize) -> usize {
        line_bytes.saturating_add(self.line_overhead).max(self.max_header_bytes)
    }
}

/// One message (a line is sent without copying it by [`encode_line`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Message {
    /// A scene begins.
    Scene(SceneHeader),
    /// One raw line.
    Line {
        /// Its line number, from 0.
        seq: u64,
        /// The raw line: exactly the scene's line bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The scene ended after `lines` lines.
    End {
        /// Lines in the scene.
        lines: u64,
    },
}

impl Message {
    /// The message's `type`, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Scene(_) => "scene",
            Self::Line { .. } => "line",
            Self::End { .. } => "end",
        }
    }
}

/// A line message as sent, borrowing its line.
#[derive(Serialize)]
struct LineOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    data: &'a serde_bytes::Bytes,
}

/// Encodes the scene message for `header` into `buf` (replacing its contents), prefix included.
pub fn encode_scene(header: &SceneHeader, buf: &mut Vec<u8>) {
    encode(&Message::Scene(header.clone()), buf);
}

/// Encodes a line message into `buf` (replacing its contents), prefix included.
pub fn encode_line(seq: u64, data: &[u8], buf: &mut Vec<u8>) {
    encode(
        &LineOut {
            kind: "line",
            seq,
            data: serde_bytes::Bytes::new(data),
        },
        buf,
    );
}

/// Encodes an end message into `buf` (replacing its contents), prefix included.
pub fn encode_end(lines: u64, buf: &mut Vec<u8>) {
    encode(&Message::End { lines }, buf);
}

fn encode<T: Serialize>(msg: &T, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(&[0; PREFIX_BYTES]);
    // Serialising these plain structs into a Vec cannot fail: the only errors are the writer's
    // (a Vec never fails) and unsupported values (these hold none).
    if let Err(e) = ciborium::into_writer(msg, &mut *buf) {
        unreachable!("encoding a stream message into memory: {e}");
    }
    let len = (buf.len() - PREFIX_BYTES) as u32;
    buf[..PREFIX_BYTES].copy_from_slice(&len.to_be_bytes());
}

/// What reading one frame gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole message is in the buffer.
    Message,
    /// The peer closed the connection before the first byte of a prefix.
    Eof,
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The length is over the limit (nothing was allocated for it).
    TooLong {
        /// The length as sent.
        len: u64,
        /// The limit in force.
        max: usize,
    },
    /// The connection ended inside a frame.
    Truncated {
        /// Bytes of the frame (prefix included) that arrived.
        got: usize,
        /// Bytes the frame should have had (prefix included), when its prefix arrived.
        want: Option<usize>,
    },
    /// Reading failed.
    Io(std::io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong { len, max } => write!(f, "a message of {len} bytes, more than the {max} allowed here"),
            Self::Truncated { got, want: Some(want) } => {
                write!(
                    f,
                    "connection closed inside a message ({got} of its {want} bytes arrived)"
                )
            }
            Self::Truncated { got, want: None } => {
                write!(f, "connection closed inside a length prefix ({got} of 4 bytes arrived)")
            }
            Self::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Reads one frame's message into `buf` (resized to it), refusing a length above `max` before
/// allocating anything for it.
pub fn read_frame<R: Read>(r: &mut R, max: usize, buf: &mut Vec<u8>) -> Result<Frame, FrameError> {
    let mut prefix = [0u8; PREFIX_BYTES];
    let got = read_full(r, &mut prefix).map_err(FrameError::Io)?;
    if got == 0 {
        return Ok(Frame::Eof);
    }
    if got < PREFIX_BYTES {
        return Err(FrameError::Truncated { got, want: None });
    }
    let len = u32::from_be_bytes(prefix);
    let n = usize::try_from(len).unwrap_or(usize::MAX);
    if n > max {
        return Err(FrameError::TooLong { len: len.into(), max });
    }
    // The buffer is overwritten whole, so only a change of length costs a fill.
    if buf.len() != n {
        buf.resize(n, 0);
    }
    let body = read_full(r, buf).map_err(FrameError::Io)?;
    if body < n {
        return Err(FrameError::Truncated {
            got: PREFIX_BYTES + body,
            want: Some(PREFIX_BYTES + n),
        });
    }
    Ok(Frame::Message)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Decodes one message, refusing bytes after its CBOR item.
pub fn decode(frame: &[u8]) -> Result<Message, String> {
    let mut rest = frame;
    match ciborium::from_reader::<Message, _>(&mut rest) {
        Ok(m) if rest.is_empty() => Ok(m),
        Ok(m) => Err(format!(
            "{} bytes after the {} message's CBOR item",
            rest.len(),
            m.kind()
        )),
        Err(e) => Err(explain(frame, e)),
    }
}

/// What a message that did not decode was, as far as can be told: its `type` and `version`
/// name the problem better than the decoder's first complaint.
fn explain(frame: &[u8], e: ciborium::de::Error<std::io::Error>) -> String {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "type")]
        kind: Option<ciborium::Value>,
        version: Option<ciborium::Value>,
    }
    let detail = match e {
        ciborium::de::Error::Semantic(_, m) => m,
        ciborium::de::Error::Syntax(at) => format!("not valid CBOR at byte {at}"),
        ciborium::de::Error::Io(e) if e.kind() == ErrorKind::UnexpectedEof => "the CBOR item is cut short".into(),
        ciborium::de::Error::Io(e) => e.to_string(),
        ciborium::de::Error::RecursionLimitExceeded => "nested too deeply".into(),
    };
    let probe = ciborium::from_reader::<Probe, _>(frame).ok();
    let kind = probe.as_ref().and_then(|p| p.kind.as_ref());
    match (kind, probe.as_ref().and_then(|p| p.version.as_ref())) {
        (Some(ciborium::Value::Text(t)), Some(ciborium::Value::Integer(v)))
            if t == "scene" && i128::from(*v) != i128::from(VERSION) =>
        {
            format!(
                "a scene message of protocol version {}: this receiver speaks version {VERSION}",
                i128::from(*v)
            )
        }
        (Some(ciborium::Value::Text(t)), _) if ["scene", "line", "end"].contains(&t.as_str()) => {
            format!("a malformed {t} message: {detail}")
        }
        (Some(ciborium::Value::Text(t)), _) => format!(
            "a message of unknown type `{}` (expected scene, line or end)",
            t.escape_debug()
        ),
        _ => format!("not a stream message (a CBOR map with a text `type`): {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, DataType};

    fn header() -> SceneHeader {
        SceneHeader {
            scene_id: "pass-7".into(),
            samples: 3,
            bands: 2,
            data_type: 12,
            interleave: "bil".into(),
            byte_order: 1,
            lines: Some(4),
            wavelengths: Some(vec![450.0, 460.5]),
            model: Some("cnn3d_salinas_a".into()),
            version: 1,
        }
    }

    fn body(frame: &[u8]) -> &[u8] {
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - PREFIX_BYTES);
        &frame[PREFIX_BYTES..]
    }

    /// CBOR of a map from text keys, for hand-made messages.
    fn cbor(pairs: Vec<(&str, ciborium::Value)>) -> Vec<u8> {
        let map = ciborium::Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect());
        let mut out = Vec::new();
        ciborium::into_writer(&map, &mut out).unwrap();
        out
    }

    #[test]
    fn every_message_round_trips() {
        let mut buf = Vec::new();
        encode_scene(&header(), &mut buf);
        assert_eq!(decode(body(&buf)).unwrap(), Message::Scene(header()));
        let mut bare = header();
        (bare.lines, bare.wavelengths, bare.model) = (None, None, None);
        encode_scene(&bare, &mut buf);
        assert_eq!(decode(body(&buf)).unwrap(), Message::Scene(bare));

        let line: Vec<u8> = (0..12).collect();
        encode_line(u64::MAX, &line, &mut buf);
        assert_eq!(
            decode(body(&buf)).unwrap(),
            Message::Line {
                seq: u64::MAX,
                data: line
            }
        );
        // The overhead bound holds for the largest sequence number and a long line.
        let long = vec![7u8; 1 << 20];
        encode_line(u64::MAX, &long, &mut buf);
        assert!(buf.len() - PREFIX_BYTES <= Limits::default().max_scene_frame(long.len()));

        encode_end(83, &mut buf);
        assert_eq!(decode(body(&buf)).unwrap(), Message::End { lines: 83 });
        assert!(buf.len() - PREFIX_BYTES <= Limits::default().line_overhead);
    }

    #[test]
    fn the_documented_example_is_what_is_sent() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ");
        let mut buf = Vec::new();
        encode_line(2, &[1, 0, 2, 0], &mut buf);
        assert_eq!(
            hex(&buf),
            "00 00 00 1a a3 64 74 79 70 65 64 6c 69 6e 65 63 73 65 71 02 64 64 61 74 61 44 01 00 02 00"
        );
        encode_end(83, &mut buf);
        assert_eq!(
            hex(&buf),
            "00 00 00 12 a2 64 74 79 70 65 63 65 6e 64 65 6c 69 6e 65 73 18 53"
        );
        let doc = include_str!("../../../docs/stream-protocol.md");
        assert!(
            doc.contains(&hex(&buf)),
            "docs/stream-protocol.md shows another end message"
        );
    }

    #[test]
    fn wavelengths_may_be_integers_and_keys_come_in_any_order() {
        use ciborium::Value as V;
        let msg = cbor(vec![
            ("version", V::Integer(1.into())),
            ("wavelengths", V::Array(vec![V::Integer(450.into()), V::Float(460.5)])),
            ("scene_id", V::Text("pass-7".into())),
            ("samples", V::Integer(3.into())),
            ("bands", V::Integer(2.into())),
            ("data_type", V::Integer(12.into())),
            ("interleave", V::Text("bil".into())),
            ("byte_order", V::Integer(1.into())),
            ("type", V::Text("scene".into())),
        ]);
        let Message::Scene(h) = decode(&msg).unwrap() else {
            panic!("not a scene")
        };
        assert_eq!(h.wavelengths, Some(vec![450.0, 460.5]));
        let info = h.into_info("tcp 127.0.0.1:1").unwrap();
        assert_eq!((info.samples, info.bands, info.lines), (3, 2, None));
        assert_eq!((info.data_type, info.byte_order), (DataType::U16, ByteOrder::Big));
        assert_eq!(info.line_bytes(), 12);
        assert_eq!(info.origin, std::path::Path::new("tcp 127.0.0.1:1"));
    }

    #[test]
    fn malformed_messages_are_refused_with_their_reason() {
        use ciborium::Value as V;
        let int = |i: u64| V::Integer(i.into());
        let mut scene = Vec::new();
        encode_scene(&header(), &mut scene);
        let mut trailing = body(&scene).to_vec();
        trailing.push(0);
        let mut cut = body(&scene).to_vec();
        cut.pop();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("trailing bytes", trailing, "1 bytes after the scene message"),
            ("cut short", cut, "cut short"),
            ("empty", vec![], "not a stream message"),
            ("not CBOR", vec![0xff, 0x00], "not a stream message"),
            ("not a map", cbor_value(int(5)), "not a stream message"),
            (
                "unknown type",
                cbor(vec![("type", V::Text("hello".into()))]),
                "unknown type `hello`",
            ),
            ("no type", cbor(vec![("seq", int(1))]), "not a stream message"),
            (
                "unknown field",
                cbor(vec![("type", V::Text("end".into())), ("lines", int(1)), ("x", int(1))]),
                "unknown field `x`",
            ),
            (
                "line without data",
                cbor(vec![("type", V::Text("line".into())), ("seq", int(1))]),
                "malformed line message: missing field `data`",
            ),
            (
                "negative seq",
                cbor(vec![
                    ("type", V::Text("line".into())),
                    ("seq", V::Integer((-1).into())),
                    ("data", V::Bytes(vec![1])),
                ]),
                "malformed line message",
            ),
            (
                "future version",
                cbor(vec![
                    ("type", V::Text("scene".into())),
                    ("version", int(2)),
                    ("colour", int(1)),
                ]),
                "protocol version 2: this receiver speaks version 1",
            ),
        ];
        for (what, bytes, want) in cases {
            let e = decode(&bytes).unwrap_err();
            assert!(e.contains(want), "{what}: {e}");
        }
    }

    fn cbor_value(v: ciborium::Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(&v, &mut out).unwrap();
        out
    }

    #[test]
    fn frames_over_the_limit_are_refused_before_reading_them() {
        let mut buf = Vec::new();
        // A prefix announcing 4 GiB followed by nothing: refused on the prefix alone.
        let mut input: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        match read_frame(&mut input, 1024, &mut buf) {
            Err(FrameError::TooLong { len, max }) => assert_eq!((len, max), (u32::MAX as u64, 1024)),
            other => panic!("{other:?}"),
        }
        assert_eq!(buf.capacity(), 0);
        let mut input: &[u8] = &[];
        assert_eq!(read_frame(&mut input, 1024, &mut buf).unwrap(), Frame::Eof);
        let mut input: &[u8] = &[0, 0];
        assert!(matches!(
            read_frame(&mut input, 1024, &mut buf),
            Err(FrameError::Truncated { got: 2, want: None })
        ));
        let mut input: &[u8] = &[0, 0, 0, 3, 1];
        assert!(matches!(
            read_frame(&mut input, 1024, &mut buf),
            Err(FrameError::Truncated { got: 5, want: Some(7) })
        ));
        let mut input: &[u8] = &[0, 0, 0, 2, 1, 2, 0, 0, 0, 0];
        assert_eq!(read_frame(&mut input, 2, &mut buf).unwrap(), Frame::Message);
        assert_eq!(buf, [1, 2]);
        assert_eq!(read_frame(&mut input, 2, &mut buf).unwrap(), Frame::Message);
        assert!(buf.is_empty());
        assert_eq!(read_frame(&mut input, 2, &mut buf).unwrap(), Frame::Eof);
    }
}
