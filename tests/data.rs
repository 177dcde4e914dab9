//! Every ENVI scene in the shared benchmark data opens, maps and decodes.

mod common;

use hsiedge::cube::{Cube, DataType, Interleave};

#[test]
fn every_shared_scene_loads() {
    let Some(data) = common::data() else { return };
    let mut headers = Vec::new();
    for dir in std::fs::read_dir(&data).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "hdr") {
                headers.push(f);
            }
        }
    }
    headers.sort();
    assert!(
        headers.len() >= 17,
        "expected the full set of scenes, found {headers:?}"
    );
    for h in &headers {
        let cube = Cube::open(h).unwrap_or_else(|e| panic!("{e}"));
        let all = cube.read_all();
        assert_eq!(all.len(), cube.lines() * cube.samples() * cube.bands());
        assert!(
            all.iter().all(|v| v.is_finite()),
            "{} has non-finite samples",
            h.display()
        );
        let out = common::ok(&["inspect", h.to_str().unwrap()]);
        assert!(out.contains("\"samples\""), "{out}");
    }
}

#[test]
fn salinas_a_geometry_and_labels() {
    let Some(data) = common::data() else { return };
    let cube = Cube::open(&data.join("salinas_a/salinas_a.hdr")).unwrap();
    let h = cube.header();
    assert_eq!((h.lines, h.samples, h.bands), (83, 86, 204));
    assert_eq!((h.data_type, h.interleave), (DataType::I16, Interleave::Bil));
    let gt = Cube::open(&data.join("salinas_a/salinas_a_gt.hdr")).unwrap();
    assert_eq!(gt.header().class_names.len(), 17);
    let labels = gt.read_all();
    let labelled = labels.iter().filter(|v| **v > 0.0).count();
    assert_eq!(labelled, 5348, "data README: 5,348 labelled pixels");
    // BIP (Samson) and BSQ (Jasper Ridge) decode to the same pixel as their own layout implies.
    let samson = Cube::open(&data.join("samson/samson.hdr")).unwrap();
    assert_eq!(samson.header().interleave, Interleave::Bip);
    let mut line = vec![0f32; samson.bands() * samson.samples()];
    samson.read_line(10, &mut line);
    assert!(
        line.iter().all(|v| (0.0..=1.0).contains(v)),
        "Samson reflectance lies in [0, 1]"
    );
}
