//! A pushbroom sensor's line stream over TCP or a Unix socket (docs/stream-protocol.md has the
//! same contract with a worked example).
//!
//! # Wire format (version 1)
//!
//! One connection carries scenes one after another, each as a scene message, its line messages
//! and an end message. Every message is a 4-byte big-endian unsigned length `N` followed by `N`
//! bytes holding exactly one CBOR item (RFC 8949): a map with text keys, in any order, whose
//! `type` says what it is. Unknown keys are refused.
//!
//! | `type` | key | CBOR type | meaning |
//! |---|---|---|---|
//! | `"scene"` | `scene_id` | text | 1-128 ASCII letters, digits, `.`, `_`, `-`; not starting with `.` |
//! | | `samples` | uint | pixels per line, at least 1 |
//! | | `bands` | uint | bands per pixel, at least 1 |
//! | | `data_type` | uint | ENVI code: 1 u8, 2 i16, 3 i32, 4 f32, 5 f64, 12 u16 |
//! | | `interleave` | text | `"bil"` (band by band) or `"bip"` (pixel by pixel) |
//! | | `byte_order` | uint | 0 little-endian, 1 big-endian |
//! | | `lines` | uint, optional | lines in the scene, when known up front |
//! | | `wavelengths` | array of numbers, optional | one centre wavelength per band |
//! | | `model` | text, optional | the model to run (same characters as `scene_id`) |
//! | | `version` | uint | 1 |
//! | `"line"` | `seq` | uint | line number, from 0 |
//! | | `data` | byte string | the raw line: `samples x bands x size(data_type)` bytes |
//! | `"end"` | `lines` | uint | lines in the scene |
//!
//! # Limits (defaults of [`Limits`])
//!
//! A scene message may be 64 KiB long; inside a scene a message may be the line's bytes plus 64,
//! or 64 KiB when that is more.
//! A longer length prefix is refused before anything is allocated for it. One line may be 64 MiB
//! ([`crate::source::MAX_LINE_BYTES`]).
//!
//! # Receiver's policy
//!
//! - `seq` equal to the next line number: the line is handed out as received.
//! - `seq` ahead of it: each skipped line is handed out as [`LineStatus::Missing`] (filled and
//!   flagged, recorded in [`SourceStats::missing`]), then the line; a gap over
//!   [`Limits::max_gap`] lines ends the connection.
//! - `seq` behind it (a repeat, or a line that came after its place was reported missing): dropped
//!   and counted in [`SourceStats::duplicates`].
//! - `end` with more lines than handed out: the trailing lines are missing; with fewer: refused.
//! - When the scene message gave `lines`, a line at or past it, or an end disagreeing, is refused.
//! - A connection closed inside a scene, or any refused message, ends that connection with a
//!   [`SourceError`] naming the peer, the scene and the last line received.
//!
//! [`LineStatus::Missing`]: crate::source::LineStatus::Missing
//! [`SourceStats::missing`]: crate::source::SourceStats::missing
//! [`SourceStats::duplicates`]: crate::source::SourceStats::duplicates
//! [`SourceError`]: crate::source::SourceError

mod receive;
mod scene;
mod send;
mod wire;

pub use receive::StreamSource;
pub use scene::SceneHeader;
pub use send::{Faults, SendStats, SensorStream};
pub use wire::{Limits, VERSION};

#[cfg(test)]
mod tests;
