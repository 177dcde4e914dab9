use super::*;

pub(crate) fn sample_json(bands: usize) -> String {
    let v = |x: f32| serde_json::to_string(&vec![x; bands]).unwrap();
    format!(
        r#"{{"name":"t","task":"classification","input":{{"bands":{bands},"layout":"n1chw","mean":{},"std":{}}},
        "patch":3,"halo":1,"outputs":[{{"id":1,"name":"a"}},{{"id":7,"name":"b","color":[1,2,3]}}],
        "files":{{"patch":"p.onnx","dense":"d.onnx"}},"output_kind":"logits"}}"#,
        v(0.0),
        v(1.0)
    )
}

#[test]
fn parses_and_resolves() {
    let m = Manifest::parse(&sample_json(4), Path::new("/m/x/manifest.json")).unwrap();
    assert_eq!(m.classes(), 2);
    assert_eq!(m.patch_path(), Path::new("/m/x/p.onnx"));
    assert_eq!(m.color(1), [1, 2, 3]);
}

fn field_of(text: &str) -> String {
    match Manifest::parse(text, Path::new("m.json")) {
        Err(ModelError::Field { field, .. }) => field,
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn errors_name_the_field() {
    let good = sample_json(4);
    assert_eq!(field_of(&good.replace("\"halo\":1", "\"halo\":2")), "halo");
    assert_eq!(field_of(&good.replace("\"patch\":3", "\"patch\":4")), "patch");
    assert_eq!(field_of(&good.replace("\"id\":7", "\"id\":1")), "outputs[1].id");
    assert_eq!(field_of(&good.replace("\"id\":7", "\"id\":0")), "outputs[1].id");
    assert_eq!(field_of(&good.replace("\"bands\":4", "\"bands\":5")), "input.mean");
    assert_eq!(
        field_of(&good.replace("\"std\":[1.0,", "\"std\":[0.0,")),
        "input.std[0]"
    );
    assert!(matches!(
        Manifest::parse("{", Path::new("m.json")),
        Err(ModelError::Json { .. })
    ));
}

#[test]
fn io_check_names_both_sides() {
    let m = Manifest::parse(&sample_json(4), Path::new("m.json")).unwrap();
    let sig = |dims: Vec<Option<usize>>| TensorSig { name: "x".into(), dims };
    let out = sig(vec![None, Some(2)]);
    let good = sig(vec![None, Some(1), Some(4), Some(3), Some(3)]);
    check_io(&m, Role::Patch, Path::new("p.onnx"), &good, &out).unwrap();
    let err = check_io(
        &m,
        Role::Patch,
        Path::new("p.onnx"),
        &sig(vec![None, Some(4), Some(3)]),
        &out,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("p.onnx") && text.contains("m.json") && text.contains("rank 3"),
        "{text}"
    );
    let err = check_io(
        &m,
        Role::Patch,
        Path::new("p.onnx"),
        &sig(vec![None, Some(1), Some(5), None, None]),
        &out,
    )
    .unwrap_err();
    assert!(err.to_string().contains("5 bands"));
    let err = check_io(&m, Role::Patch, Path::new("p.onnx"), &good, &sig(vec![None, Some(3)])).unwrap_err();
    assert!(err.to_string().contains("3 channels"));
    let dense_out = sig(vec![None, Some(2), None, None]);
    check_io(
        &m,
        Role::Dense,
        Path::new("d.onnx"),
        &sig(vec![None, Some(1), Some(4), None, None]),
        &dense_out,
    )
    .unwrap();
    let err = check_io(
        &m,
        Role::Patch,
        Path::new("p.onnx"),
        &sig(vec![Some(1), Some(1), Some(4), Some(3), Some(3)]),
        &out,
    )
    .unwrap_err();
    assert!(err.to_string().contains("batch axis fixed at 1") && err.to_string().contains("files.patch"));
    let err = check_io(
        &m,
        Role::Dense,
        Path::new("d.onnx"),
        &sig(vec![None, Some(1), Some(4), Some(64), None]),
        &dense_out,
    )
    .unwrap_err();
    assert!(err.to_string().contains("fixed at 64") && err.to_string().contains("files.dense"));
}
