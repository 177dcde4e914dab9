//! The delivery message (docs/delivery.md): one committed segment as one CBOR map — header
//! fields and the files of its set — and the framing both socket ends use (`u32` big-endian length,
//! then one CBOR item, as in docs/stream-protocol.md). MQTT carries the same map without the
//! length.

use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::DeliveryError;
use super::queue::Entry;

/// The message format's version.
pub const VERSION: u64 = 1;

/// The longest frame a subscriber accepts (a segment's whole set).
pub const MAX_FRAME: usize = 1 << 30;

/// The longest acknowledgement frame the daemon accepts.
pub const MAX_ACK_FRAME: usize = 1024;

/// One file of a segment's set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetFile {
    /// Its name in the set (`class_map.img`, ...).
    pub name: String,
    /// Its bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A segment as delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Always `"segment"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// [`VERSION`].
    pub version: u64,
    /// The node that ran it (`delivery.node`).
    pub node: String,
    /// The sequence number; a resend carries the same one.
    pub sequence: u64,
    /// The scene id.
    pub scene_id: String,
    /// The segment's number in the scene, from 0.
    pub segment: u64,
    /// The segment's first scene line.
    pub first_line: u64,
    /// Lines in the segment.
    pub lines: u64,
    /// Pixels per line.
    pub samples: u64,
    /// Whether it is the scene's last segment.
    pub last: bool,
    /// The model.
    pub model: String,
    /// Class names, in class-id order.
    pub classes: Vec<String>,
    /// Class colours, RGB, in class-id order.
    pub colours: Vec<[u8; 3]>,
    /// The scene's ENVI `map info`.
    pub map_info: Option<String>,
    /// The scene's ENVI `coordinate system string`.
    pub coordinate_system: Option<String>,
    /// The files of the set, by name.
    pub files: Vec<SetFile>,
}

/// A subscriber's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Always `"ack"`.
    #[serde(rename = "type")]
    pub kind: AckKind,
    /// The sequence number acknowledged.
    pub sequence: u64,
}

/// The one value of [`Ack::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckKind {
    /// An acknowledgement.
    Ack,
}

impl Ack {
    /// The acknowledgement of `sequence`.
    pub fn of(sequence: u64) -> Self {
        Self {
            kind: AckKind::Ack,
            sequence,
        }
    }
}

/// The set in force of `entry`'s segment, read from disk: every regular file in its
/// `current` folder, sorted by name.
pub fn build(entry: &Entry, node: &str) -> Result<Segment, DeliveryError> {
    let set = entry.folder.join(crate::map::CURRENT);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DeliveryError::Io { path, source }
    };
    let mut files = Vec::new();
    for item in std::fs::read_dir(&set).map_err(io(&set))? {
        let item = item.map_err(io(&set))?;
        let path = item.path();
        if !item.file_type().map_err(io(&path))?.is_file() {
            continue;
        }
        let Some(name) = item.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let data = std::fs::read(&path).map_err(io(&path))?;
        files.push(SetFile { name, data });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Segment {
        kind: "segment".into(),
        version: VERSION,
        node: node.to_string(),
        sequence: entry.seq,
        scene_id: entry.scene_id.clone(),
        segment: entry.segment,
        first_line: entry.first_line,
        lines: entry.lines,
        samples: entry.samples,
        last: entry.last,
        model: entry.model.clone(),
        classes: entry.classes.clone(),
        colours: entry.colours.clone(),
        map_info: entry.map_info.clone(),
        coordinate_system: entry.coordinate_system.clone(),
        files,
    })
}

/// A digest of a segment's maps: FNV-1a (64 bits) over the names and bytes of the `.img` files of
/// the set in force in `folder`, in name order. Headers, summary and quick-look are left out: they
/// name the run. Two runs of one scene give the same maps, so the same digest.
pub fn digest(folder: &Path) -> Result<u64, DeliveryError> {
    let set = folder.join(crate::map::CURRENT);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DeliveryError::Io { path, source }
    };
    let mut names: Vec<String> = std::fs::read_dir(&set)
        .map_err(io(&set))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for n in &names {
        let path = set.join(n);
        feed(n.as_bytes());
        feed(&std::fs::read(&path).map_err(io(&path))?);
    }
    Ok(h)
}

/// The CBOR item of `value` (what MQTT carries).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut body = Vec::new();
    // Writing into a Vec cannot fail, and these types always serialise.
    let _ = ciborium::into_writer(value, &mut body);
    body
}

/// Decodes one CBOR item of `what` (named in the error).
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> Result<T, DeliveryError> {
    ciborium::from_reader(body).map_err(|e| DeliveryError::Protocol {
        what: what.to_string(),
        message: format!("not a valid message: {e}"),
    })
}

/// Writes `value` as one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, value: &T) -> std::io::Result<()> {
    let body = encode(value);
    let len = u32::try_from(body.len()).map_err(|_| std::io::Error::other("a frame over 4 GiB"))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    w.write_all(&out)?;
    w.flush()
}

/// Reads one frame's body, at most `max` bytes; `Ok(None)` at a clean end of stream.
pub fn read_frame(r: &mut impl Read, max: usize, what: &str) -> Result<Option<Vec<u8>>, DeliveryError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(DeliveryError::Protocol {
                    what: what.to_string(),
                    message: "the stream ended inside a frame's length".into(),
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(DeliveryError::Socket {
                    what: what.to_string(),
                    source,
                });
            }
        }
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(DeliveryError::Protocol {
            what: what.to_string(),
            message: format!("a frame of {n} bytes (at most {max})"),
        });
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).map_err(|source| DeliveryError::Socket {
        what: what.to_string(),
        source,
    })?;
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_frame_over_its_limit_is_refused_before_reading_it() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Ack::of(7)).unwrap();
        let mut r = buf.as_slice();
        let body = read_frame(&mut r, MAX_ACK_FRAME, "test").unwrap().unwrap();
        assert_eq!(decode::<Ack>(&body, "test").unwrap(), Ack::of(7));
        assert!(read_frame(&mut r, MAX_ACK_FRAME, "test").unwrap().is_none());

        let mut big = Vec::new();
        big.extend_from_slice(&5000u32.to_be_bytes());
        let err = read_frame(&mut big.as_slice(), MAX_ACK_FRAME, "sub")
            .unwrap_err()
            .to_string();
        assert!(err.contains("5000") && err.contains("sub"), "{err}");
        // A map that is not an ack is refused with the decoder's reason.
        let seg = encode(&serde_json::json!({"type": "nack"}));
        assert!(decode::<Ack>(&seg, "sub").is_err());
    }

    #[test]
    fn a_segment_message_carries_its_set_files_sorted_and_its_header() {
        let t = tempfile::tempdir().unwrap();
        let set = t.path().join(".set-1");
        std::fs::create_dir(&set).unwrap();
        std::fs::write(set.join("z.img"), b"zz").unwrap();
        std::fs::write(set.join("a.hdr"), b"aa").unwrap();
        std::os::unix::fs::symlink(".set-1", t.path().join("current")).unwrap();
        let entry = Entry {
            seq: 3,
            scene_id: "s".into(),
            scene_folder: t.path().into(),
            segment: 2,
            folder: t.path().into(),
            first_line: 16,
            lines: 8,
            samples: 4,
            last: true,
            model: "m".into(),
            classes: vec!["c".into()],
            colours: vec![[9, 9, 9]],
            map_info: Some("{UTM, 1}".into()),
            coordinate_system: None,
            digest: 0,
        };
        let m = build(&entry, "edge-1").unwrap();
        let names: Vec<_> = m.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.hdr", "z.img"]);
        assert_eq!((m.sequence, m.segment, m.node.as_str()), (3, 2, "edge-1"));
        let back: Segment = decode(&encode(&m), "t").unwrap();
        assert_eq!(back, m);
        // The digest covers the maps' names and bytes only.
        let d = digest(t.path()).unwrap();
        std::fs::write(set.join("a.hdr"), b"another run id").unwrap();
        assert_eq!(digest(t.path()).unwrap(), d);
        std::fs::write(set.join("z.img"), b"zy").unwrap();
        assert_ne!(digest(t.path()).unwrap(), d);
        // A segment whose set is gone names the folder.
        std::fs::remove_file(t.path().join("current")).unwrap();
        let err = build(&entry, "n").unwrap_err().to_string();
        assert!(err.contains("current"), "{err}");
    }
}
