//! The scene message: what a scene's lines hold, checked into a [`SceneInfo`].

use serde::{Deserialize, Serialize};

use super::wire::VERSION;
use crate::cube::{ByteOrder, DataType, Header, Interleave};
use crate::source::{SceneInfo, SourceError, check_scene_id};

/// The first message of a scene: what its lines hold, as the wire spells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SceneHeader {
    /// The scene's id ([`check_scene_id`]).
    pub scene_id: String,
    /// Pixels per line.
    pub samples: u64,
    /// Bands per pixel.
    pub bands: u64,
    /// ENVI data type code: 1, 2, 3, 4, 5 or 12.
    pub data_type: u32,
    /// `bil` or `bip`.
    pub interleave: String,
    /// ENVI byte order: 0 little-endian, 1 big-endian.
    pub byte_order: u8,
    /// Lines in the scene, when known up front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// Band centre wavelengths, one per band (integers or floats of any width).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wavelengths: Option<Vec<f64>>,
    /// The model to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Protocol version: 1.
    pub version: u32,
}

impl SceneHeader {
    /// The wire header describing `info` (its wavelengths from `info.header`, when every band has one).
    pub fn from_info(info: &SceneInfo) -> Self {
        let w = &info.header.wavelength;
        Self {
            scene_id: info.id.clone(),
            samples: info.samples as u64,
            bands: info.bands as u64,
            data_type: info.data_type.code(),
            interleave: match info.interleave {
                Interleave::Bip => "bip",
                Interleave::Bil => "bil",
                Interleave::Bsq => "bsq",
            }
            .into(),
            byte_order: match info.byte_order {
                ByteOrder::Little => 0,
                ByteOrder::Big => 1,
            },
            lines: info.lines.map(|l| l as u64),
            wavelengths: (!w.is_empty() && w.len() == info.bands).then(|| w.clone()),
            model: info.model.clone(),
            version: VERSION,
        }
    }

    /// The scene this header describes, as received from `peer`; refused when any field is out
    /// of range or [`SceneInfo::validate`] fails.
    pub fn into_info(self, peer: &str) -> Result<SceneInfo, SourceError> {
        check_scene_id(&self.scene_id)?;
        let id = self.scene_id;
        let bad = |field, message: String| SourceError::Scene {
            scene: id.clone(),
            field,
            message,
        };
        if self.version != VERSION {
            return Err(bad(
                "version",
                format!("{}: this receiver speaks version {VERSION}", self.version),
            ));
        }
        let size = |field, v: u64| usize::try_from(v).map_err(|_| bad(field, format!("{v} is too large")));
        let samples = size("samples", self.samples)?;
        let bands = size("bands", self.bands)?;
        let lines = self.lines.map(|l| size("lines", l)).transpose()?;
        let data_type = DataType::from_code(self.data_type).ok_or_else(|| {
            bad(
                "data_type",
                format!("{} is not one of 1, 2, 3, 4, 5, 12", self.data_type),
            )
        })?;
        let interleave = match self.interleave.as_str() {
            "bil" => Interleave::Bil,
            "bip" => Interleave::Bip,
            // Named so that validate() gives its reason.
            "bsq" => Interleave::Bsq,
            other => {
                return Err(bad(
                    "interleave",
                    format!("`{}` is not `bil` or `bip`", other.escape_debug()),
                ));
            }
        };
        let byte_order = match self.byte_order {
            0 => ByteOrder::Little,
            1 => ByteOrder::Big,
            other => return Err(bad("byte_order", format!("{other} is not 0 (little) or 1 (big)"))),
        };
        let wavelength = self.wavelengths.unwrap_or_default();
        if !wavelength.is_empty() && wavelength.len() != bands {
            return Err(bad(
                "wavelengths",
                format!("{} values for {bands} bands", wavelength.len()),
            ));
        }
        if let Some((i, w)) = wavelength.iter().enumerate().find(|(_, w)| !w.is_finite()) {
            return Err(bad("wavelengths", format!("value {i} is {w}")));
        }
        if let Some(m) = &self.model {
            check_model_name(m).map_err(|message| bad("model", message))?;
        }
        let mut header = Header::new(samples, lines.unwrap_or(0), bands, data_type, interleave);
        header.byte_order = byte_order;
        header.wavelength = wavelength;
        let info = SceneInfo {
            id: id.clone(),
            samples,
            bands,
            data_type,
            interleave,
            byte_order,
            lines,
            model: self.model,
            header,
            origin: peer.into(),
        };
        info.validate()?;
        Ok(info)
    }
}

/// A model name may pick a model from a folder, so it follows the scene id's rule: 1 to 128 ASCII
/// letters, digits, `.`, `_` and `-`, not starting with `.`.
fn check_model_name(name: &str) -> Result<(), String> {
    check_scene_id(name).map_err(|e| match e {
        SourceError::SceneId { id, message } => format!("`{id}`: {message}"),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn scene_fields_out_of_range_are_refused_naming_the_field() {
        type Edit = fn(&mut SceneHeader);
        let cases: [(Edit, &str); 12] = [
            (|h| h.scene_id = "../x".into(), "starts with `.`"),
            (|h| h.scene_id = "a/b".into(), "path separator"),
            (|h| h.scene_id = "..".into(), "starts with `.`"),
            (|h| h.version = 2, "field `version`: 2"),
            (|h| h.samples = 0, "field `samples`: must be at least 1"),
            (|h| (h.bands, h.wavelengths) = (0, None), "field `bands`"),
            (|h| h.data_type = 6, "field `data_type`: 6 is not one of"),
            (|h| h.interleave = "bsq".into(), "bsq cannot arrive line by line"),
            (|h| h.interleave = "BIL".into(), "field `interleave`: `BIL` is not"),
            (|h| h.byte_order = 2, "field `byte_order`"),
            (
                |h| h.wavelengths = Some(vec![1.0]),
                "field `wavelengths`: 1 values for 2 bands",
            ),
            (
                |h| h.model = Some("../m".into()),
                "field `model`: `../m`: starts with `.`",
            ),
        ];
        for (edit, want) in cases {
            let mut h = header();
            edit(&mut h);
            let e = h.into_info("peer").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let mut h = header();
        h.samples = u64::MAX;
        let e = h.into_info("peer").unwrap_err().to_string();
        assert!(e.contains("samples"), "{e}");
        let mut h = header();
        h.wavelengths = Some(vec![1.0, f64::NAN]);
        assert!(h.into_info("peer").unwrap_err().to_string().contains("value 1 is NaN"));
    }
}
