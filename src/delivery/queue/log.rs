//! The queue log's framing: each record as CBOR behind its length (4 bytes, big-endian), and the
//! reading back of whole records (a cut-short last one is left out).

use std::path::Path;

use super::{DeliveryError, MAX_RECORD, Record};

/// `record`, framed.
pub(super) fn frame(record: &Record) -> Vec<u8> {
    let mut body = Vec::new();
    // Writing into a Vec cannot fail and every record serialises.
    let _ = ciborium::into_writer(record, &mut body);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The records of `data` and the length of the part that holds whole records.
pub(super) fn parse_log(data: &[u8], path: &Path) -> Result<(Vec<Record>, u64), DeliveryError> {
    let mut records = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let Some(len) = data.get(at..at + 4) else { break };
        let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if n > MAX_RECORD {
            return Err(DeliveryError::Corrupt {
                path: path.to_path_buf(),
                offset: at as u64,
                message: format!("a record of {n} bytes (at most {MAX_RECORD})"),
            });
        }
        let Some(body) = data.get(at + 4..at + 4 + n) else {
            break;
        };
        match ciborium::from_reader::<Record, _>(body) {
            Ok(r) => records.push(r),
            // The last record may be cut short; one before it never is.
            Err(_) if at + 4 + n == data.len() => break,
            Err(e) => {
                return Err(DeliveryError::Corrupt {
                    path: path.to_path_buf(),
                    offset: at as u64,
                    message: e.to_string(),
                });
            }
        }
        at += 4 + n;
    }
    Ok((records, at as u64))
}
