//! CBOR records for the delivery sinks: each snapshot one self-delimiting CBOR item, so a stream
//! of them needs no framing ([`Snapshot::to_cbor`] for a single record).

use std::io::Write;

use super::{Sink, Snapshot, TelemetryError};

/// Writes each snapshot as one CBOR item to a writer (a file, a socket, a message buffer).
pub struct CborRecords<W: Write + Send> {
    out: W,
    name: String,
}

impl<W: Write + Send> CborRecords<W> {
    /// Writes to `out`; `name` names it in errors.
    pub fn new(out: W, name: impl Into<String>) -> Self {
        Self { out, name: name.into() }
    }

    /// The writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write + Send> Sink for CborRecords<W> {
    fn name(&self) -> String {
        format!("CBOR {}", self.name)
    }

    fn emit(&mut self, snapshot: &Snapshot) -> Result<(), TelemetryError> {
        ciborium::into_writer(snapshot, &mut self.out).map_err(|e| TelemetryError::Cbor(e.to_string()))?;
        self.out.flush().map_err(|source| TelemetryError::Io {
            what: "writing",
            path: self.name.clone().into(),
            source,
        })
    }
}

/// Reads back every record of a stream written by [`CborRecords`].
pub fn read_records(mut bytes: &[u8]) -> Result<Vec<Snapshot>, TelemetryError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        out.push(ciborium::from_reader(&mut bytes).map_err(|e| TelemetryError::Cbor(e.to_string()))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::snapshot::{Quantiles, RailPower};

    fn sample(seq: u64) -> Snapshot {
        Snapshot {
            seq,
            t_s: seq as f64,
            pixels_done: 100 * seq,
            batch_latency_s: Some(Quantiles {
                count: 3,
                p50: 0.01,
                p95: 0.02,
                p99: 0.03,
                max: 0.03,
            }),
            power_w: Some(6.5),
            rails: vec![RailPower {
                label: "VDD_IN".into(),
                volts: 5.0,
                amps: 1.3,
                watts: 6.5,
            }],
            batch_reason: "auto: memory".into(),
            ..Default::default()
        }
    }

    #[test]
    fn snapshots_round_trip_one_and_many() {
        let one = sample(1);
        let bytes = one.to_cbor().unwrap_or_default();
        assert_eq!(Snapshot::from_cbor(&bytes).ok(), Some(one.clone()));
        let mut sink = CborRecords::new(Vec::new(), "memory");
        for s in 0..4 {
            assert!(sink.emit(&sample(s)).is_ok());
        }
        let back = read_records(&sink.into_inner()).map_err(|e| e.to_string());
        assert_eq!(back, Ok((0..4).map(sample).collect::<Vec<_>>()));
        assert!(read_records(&bytes[..bytes.len() - 1]).is_err());
    }
}
