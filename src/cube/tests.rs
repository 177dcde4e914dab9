//! The cube module's unit tests: opening, layouts, byte orders, sizes and warnings.

use super::*;
use std::io::Write;

/// Writes a cube whose value at (line, band, sample) is `100*line + 10*band + sample`.
fn write_cube(dir: &Path, interleave: Interleave, dt: DataType, order: ByteOrder) -> PathBuf {
    let (s, l, b) = (4usize, 3usize, 2usize);
    let mut h = Header::new(s, l, b, dt, interleave);
    h.byte_order = order;
    h.header_offset = 7;
    let value = |line: usize, band: usize, sample: usize| (100 * line + 10 * band + sample) as f64;
    let mut idx = Vec::new();
    for a in 0..l * b * s {
        let (line, band, sample) = match interleave {
            Interleave::Bsq => ((a / s) % l, a / (s * l), a % s),
            Interleave::Bil => (a / (s * b), (a / s) % b, a % s),
            Interleave::Bip => (a / (s * b), a % b, (a / b) % s),
        };
        idx.push(value(line, band, sample));
    }
    let mut bytes = vec![0xAAu8; 7];
    for v in idx {
        let le = order == ByteOrder::Little;
        let mut push = |x: Vec<u8>| bytes.extend(if le { x } else { x.into_iter().rev().collect() });
        match dt {
            DataType::U8 => push(vec![v as u8]),
            DataType::I16 => push((v as i16).to_le_bytes().to_vec()),
            DataType::U16 => push((v as u16).to_le_bytes().to_vec()),
            DataType::I32 => push((v as i32).to_le_bytes().to_vec()),
            DataType::F32 => push((v as f32).to_le_bytes().to_vec()),
            DataType::F64 => push(v.to_le_bytes().to_vec()),
        }
    }
    let name = format!("c_{:?}_{:?}_{:?}", interleave, dt, order);
    let hdr = dir.join(format!("{name}.hdr"));
    std::fs::write(&hdr, h.to_text()).unwrap();
    std::fs::File::create(dir.join(format!("{name}.img")))
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    hdr
}

#[test]
fn every_layout_decodes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for il in [Interleave::Bsq, Interleave::Bil, Interleave::Bip] {
        for dt in [
            DataType::U8,
            DataType::I16,
            DataType::U16,
            DataType::I32,
            DataType::F32,
            DataType::F64,
        ] {
            for order in [ByteOrder::Little, ByteOrder::Big] {
                let cube = Cube::open(&write_cube(dir.path(), il, dt, order)).unwrap();
                let mut line = vec![0f32; 8];
                cube.read_line(2, &mut line);
                assert_eq!(
                    line,
                    vec![200., 201., 202., 203., 210., 211., 212., 213.],
                    "{il:?} {dt:?} {order:?}"
                );
                // Window rows: lines 2, 0 and 1, samples 1 (reflected), 0..3, 2, normalised
                // per band.
                let mut win = Vec::new();
                let runs = [(1, 1), (0, 3), (2, 1)];
                cube.append_runs(&[2, 0, 1], 0, &runs, &[1.0, -2.0], &[0.5, 2.0], &mut win);
                let mut want = Vec::new();
                for (band, (m, k)) in [(1.0f32, 0.5f32), (-2.0, 2.0)].into_iter().enumerate() {
                    for y in [2, 0, 1] {
                        for x in [1, 0, 1, 2, 2] {
                            want.push(((100 * y + 10 * band + x) as f32 - m) * k);
                        }
                    }
                }
                assert_eq!(win, want, "{il:?} {dt:?} {order:?}");
            }
        }
    }
}

#[test]
fn size_mismatch_is_an_error_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write_cube(dir.path(), Interleave::Bil, DataType::I16, ByteOrder::Little);
    let img = hdr.with_extension("img");
    let bytes = std::fs::read(&img).unwrap();
    std::fs::write(&img, &bytes[..bytes.len() - 3]).unwrap();
    let err = Cube::open(&hdr).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, CubeError::Size { expected, actual, .. } if expected == actual + 3),
        "{text}"
    );
    assert!(text.contains(".img") && text.contains(".hdr"), "{text}");
}

#[test]
fn a_longer_data_file_is_read_with_a_warning_naming_it_and_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write_cube(dir.path(), Interleave::Bsq, DataType::I16, ByteOrder::Big);
    let clean = Cube::open(&hdr).unwrap();
    assert!(clean.warnings().is_empty(), "{:?}", clean.warnings());
    let want = clean.read_all();
    let img = hdr.with_extension("img");
    let mut bytes = std::fs::read(&img).unwrap();
    let described = bytes.len();
    bytes.extend([0x55u8; 100]);
    std::fs::write(&img, &bytes).unwrap();
    let cube = Cube::open(&hdr).unwrap();
    assert_eq!(cube.read_all(), want);
    assert_eq!(
        cube.warnings(),
        [format!(
            "{}: file is {} bytes but the header ({}) describes {described} bytes; the 100 bytes \
             after them are ignored",
            img.display(),
            described + 100,
            hdr.display()
        )]
    );
}

#[test]
fn fields_that_scale_the_values_are_named_in_a_warning_as_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write_cube(dir.path(), Interleave::Bil, DataType::I16, ByteOrder::Little);
    let text = std::fs::read_to_string(&hdr).unwrap();
    std::fs::write(
        &hdr,
        format!("{text}Data  Gain Values = {{2, 2}}\nreflectance scale factor = 10000\n"),
    )
    .unwrap();
    let cube = Cube::open(&hdr).unwrap();
    let w = cube.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("field `data gain values` is not applied"), "{w:?}");
    assert!(
        w[1].contains("field `reflectance scale factor` is not applied"),
        "{w:?}"
    );
}

#[test]
fn missing_data_file_lists_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("lonely.hdr");
    std::fs::write(&hdr, Header::new(1, 1, 1, DataType::U8, Interleave::Bsq).to_text()).unwrap();
    let err = Cube::open(&hdr).unwrap_err();
    assert!(matches!(err, CubeError::MissingData { .. }));
    assert!(err.to_string().contains("lonely.img"));
}
