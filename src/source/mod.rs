//! Where scene lines come from: an ENVI file, a spool folder of complete cubes, or a live line
//! stream from a pushbroom sensor.
//!
//! A [`LineSource`] hands out one scene's lines in order, each as raw sensor bytes in the layout
//! its [`SceneInfo`] describes, until it says the scene has ended; how many lines a scene has may
//! be unknown until then. The tiler keeps the lines it still needs in a ring
//! (`pipeline::ring`), so a source never has to hold more than the line it is reading.

mod file;
pub mod sensor;
pub mod spool;
pub mod stream;

use std::path::PathBuf;

use crate::cube::{ByteOrder, DataType, Header, Interleave};

pub use file::{FileSource, OpenError};
pub use stream::StreamSource;

/// The longest scene id accepted.
pub const MAX_SCENE_ID: usize = 128;

/// Errors of a line source, each naming the scene or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Reading the input failed.
    #[error("{what}")]
    Io {
        /// The file or connection.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A scene id that cannot name an output folder.
    #[error("scene id `{id}`: {message}")]
    SceneId {
        /// The id as given (escaped for printing).
        id: String,
        /// Why it is refused.
        message: &'static str,
    },
    /// A scene description that cannot be streamed.
    #[error("scene `{scene}`: field `{field}`: {message}")]
    Scene {
        /// The scene id.
        scene: String,
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The input broke its protocol (framing, sequence, sizes).
    #[error("{what}: {message}")]
    Protocol {
        /// The connection or file.
        what: String,
        /// What was wrong.
        message: String,
    },
}

/// One scene as a source describes it before its first line.
#[derive(Debug, Clone, PartialEq)]
pub struct SceneInfo {
    /// The scene's id: it names the scene's output folder ([`check_scene_id`]).
    pub id: String,
    /// Pixels per line.
    pub samples: usize,
    /// Bands per pixel.
    pub bands: usize,
    /// Sample type of the raw lines.
    pub data_type: DataType,
    /// Layout of one raw line: BIL (band by band) or BIP (pixel by pixel).
    pub interleave: Interleave,
    /// Byte order of the raw samples.
    pub byte_order: ByteOrder,
    /// Lines in the scene, when the source knows them up front.
    pub lines: Option<usize>,
    /// The model to run, when the source names one (the daemon's configured default otherwise).
    pub model: Option<String>,
    /// The scene's header fields worth carrying into its maps (map info, wavelengths, ...): a
    /// header of this scene with `lines` as known so far.
    pub header: Header,
    /// Where the scene came from, for messages.
    pub origin: PathBuf,
}

impl SceneInfo {
    /// Bytes of one raw line.
    pub fn line_bytes(&self) -> usize {
        self.samples * self.bands * self.data_type.size()
    }

    /// Checks what every consumer relies on: a usable id, at least one sample and band, a line
    /// layout (BSQ cannot arrive line by line), and a line size that fits in memory.
    pub fn validate(&self) -> Result<(), SourceError> {
        check_scene_id(&self.id)?;
        let bad = |field, message: String| SourceError::Scene {
            scene: self.id.clone(),
            field,
            message,
        };
        if self.samples == 0 {
            return Err(bad("samples", "must be at least 1".into()));
        }
        if self.bands == 0 {
            return Err(bad("bands", "must be at least 1".into()));
        }
        if self.interleave == Interleave::Bsq {
            return Err(bad(
                "interleave",
                "bsq cannot arrive line by line: send bil or bip".into(),
            ));
        }
        if self
            .samples
            .checked_mul(self.bands)
            .and_then(|n| n.checked_mul(self.data_type.size()))
            .is_none_or(|n| n > MAX_LINE_BYTES)
        {
            return Err(bad(
                "samples",
                format!(
                    "{} samples x {} bands is more than {MAX_LINE_BYTES} bytes a line",
                    self.samples, self.bands
                ),
            ));
        }
        Ok(())
    }
}

/// The largest raw line accepted (64 MiB: 8,192 samples x 2,048 bands of float32).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// What became of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineStatus {
    /// The line as the sensor sent it.
    Received,
    /// The line never arrived: its place is kept, its values are not a number, so every pixel
    /// whose patch reaches it is unclassified (and counted) rather than guessed.
    Missing,
}

/// What a source saw of its scene so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    /// Lines handed out (missing ones included).
    pub lines: u64,
    /// Lines that never arrived, as `[first, last]` ranges of line numbers.
    pub missing: Vec<[u64; 2]>,
    /// Lines that arrived twice (the repeat was dropped).
    pub duplicates: u64,
}

impl SourceStats {
    /// Records line `line` as missing.
    pub fn add_missing(&mut self, line: u64) {
        match self.missing.last_mut() {
            Some(r) if r[1] + 1 == line => r[1] = line,
            _ => self.missing.push([line, line]),
        }
    }

    /// How many lines never arrived.
    pub fn missing_lines(&self) -> u64 {
        self.missing.iter().map(|r| r[1] - r[0] + 1).sum()
    }
}

/// One scene's lines, in order.
pub trait LineSource: Send {
    /// The scene, known before the first line.
    fn info(&self) -> &SceneInfo;

    /// Reads the next line into `line` (exactly [`SceneInfo::line_bytes`] long) and says what it
    /// is; `Ok(None)` once the scene has ended (and from then on). A line reported
    /// [`LineStatus::Missing`] leaves `line` as it was.
    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError>;

    /// What the source saw so far.
    fn stats(&self) -> SourceStats;

    /// Tile rows of exactly this many lines from the source's first line, when the scene must
    /// keep the rows of an earlier run (a scene resumed mid-way); `None`: the pipeline's choice.
    fn tile_rows(&self) -> Option<usize> {
        None
    }
}

/// Checks that `id` can name a folder of its own: 1 to [`MAX_SCENE_ID`] characters of ASCII
/// letters, digits, `.`, `_` and `-`, not starting with `.` (so never `..` or a hidden name).
pub fn check_scene_id(id: &str) -> Result<(), SourceError> {
    let bad = |message| SourceError::SceneId {
        id: id.escape_debug().take(2 * MAX_SCENE_ID).collect(),
        message,
    };
    if id.is_empty() {
        return Err(bad("empty"));
    }
    if id.len() > MAX_SCENE_ID {
        return Err(bad("longer than 128 characters"));
    }
    if id.starts_with('.') {
        return Err(bad("starts with `.`"));
    }
    if id.contains('/') || id.contains('\\') {
        return Err(bad("holds a path separator"));
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(bad(
            "holds a character other than ASCII letters, digits, `.`, `_` and `-`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scene_ids_that_could_leave_their_folder_are_refused() {
        for ok in ["salinas_a", "pass-0042.v2", "A"] {
            check_scene_id(ok).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("..", "starts with"),
            (".hidden", "starts with"),
            ("a/b", "separator"),
            ("..\\x", "starts with"),
            ("a\\b", "separator"),
            ("a b", "character"),
            ("é", "character"),
            ("a\0b", "character"),
        ] {
            let e = check_scene_id(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(check_scene_id(&"x".repeat(129)).is_err());
    }

    #[test]
    fn missing_lines_are_kept_as_ranges() {
        let mut s = SourceStats::default();
        for l in [3, 4, 5, 9, 11, 12] {
            s.add_missing(l);
        }
        assert_eq!(s.missing, [[3, 5], [9, 9], [11, 12]]);
        assert_eq!(s.missing_lines(), 6);
    }
}
