use super::onnx::*;
use super::*;
use prost::Message;

fn dim_v(v: i64) -> Dimension {
    Dimension {
        value: Some(DimValue::DimValue(v)),
    }
}
fn dim_p(p: &str) -> Dimension {
    Dimension {
        value: Some(DimValue::DimParam(p.to_string())),
    }
}
fn vi(name: &str, dims: Vec<Dimension>) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: 1,
                shape: Some(TensorShapeProto { dim: dims }),
            }),
        }),
    }
}
fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.to_string(),
        op_type: op.to_string(),
        ..Default::default()
    }
}
fn init(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.to_string(),
        dims: dims.to_vec(),
        data_type: 1,
        raw_data: vec![0u8; (n * 4) as usize],
        ..Default::default()
    }
}

/// x[N,1,8,8] -> conv(w) -> a[N,4,8,8] -> relu -> b[N,4,8,8] -> add(a,b) -> c[N,4,8,8]
///            -> pool -> y[N,4]. The skip connection keeps `a` alive across relu.
fn small_model() -> ModelProto {
    ModelProto {
        ir_version: 9,
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("Conv", "conv", &["x", "w", ""], &["a"]),
                node("Relu", "relu", &["a"], &["b"]),
                node("Add", "add", &["a", "b"], &["c"]),
                node("GlobalAveragePool", "pool", &["c"], &["y"]),
            ],
            initializer: vec![init("w", &[4, 1, 3, 3])],
            input: vec![vi("x", vec![dim_p("N"), dim_v(1), dim_p("H"), dim_p("W")])],
            output: vec![vi("y", vec![dim_p("N"), dim_v(4)])],
            value_info: vec![
                vi("a", vec![dim_p("N"), dim_v(4), dim_p("H"), dim_p("W")]),
                vi("b", vec![dim_p("N"), dim_v(4), dim_p("H"), dim_p("W")]),
                vi("c", vec![dim_p("N"), dim_v(4), dim_p("H"), dim_p("W")]),
            ],
        }),
        ..Default::default()
    }
}

fn hw(h: u64, w: u64) -> ShapeBindings {
    ShapeBindings::per_unit([("H", h), ("W", w)])
}

#[test]
fn activation_walk_on_serialised_model() {
    let bytes = small_model().encode_to_vec();
    let model = decode_model(&bytes, Path::new("<memory>")).unwrap();
    let cost = analyse(&model, &hw(8, 8)).unwrap();
    assert_eq!(cost.parameter_bytes, 4 * 9 * 4);
    assert_eq!(cost.parameter_tensors, 1);
    // x=256 B, a=b=c=1024 B, y=16 B. Step 0: x+a; step 1: a+b; step 2: a+b+c = 3072; step 3: c+y.
    assert_eq!(cost.activation_peak_bytes, 3072);
    assert_eq!(cost.peak_node.as_deref(), Some("add"));
    assert_eq!(cost.activation_total_bytes, 256 + 3 * 1024 + 16);
    assert_eq!(cost.input_bytes, 256);
    assert_eq!(cost.output_bytes, 16);
    assert!(cost.unsized_tensors.is_empty());
    // Dense twin: bigger tile, linear in pixels.
    let big = analyse(&model, &hw(16, 16)).unwrap();
    assert_eq!(big.activation_peak_bytes, 4 * 3072);
}

#[test]
fn dense_tile_bindings_and_other_dims() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        // Shape inference left an anonymous symbol on an intermediate tensor.
        g.value_info[1] = vi("b", vec![dim_p("N"), dim_v(4), dim_p("unk__0"), dim_p("W")]);
        g.output[0] = vi("y", vec![dim_p("N"), dim_v(4), dim_p("Ho"), dim_p("Wo")]);
    }
    let b = ShapeBindings::dense_tile(&m, 6, 6, 1);
    assert_eq!(b.named.get("H"), Some(&8));
    assert_eq!(b.named.get("Ho"), Some(&6));
    assert_eq!(b.other_dims, Some(8));
    let cost = analyse(&m, &b).unwrap();
    // x 8x8, a/b/c 4x8x8 (unk__0 -> 8), y 4x6x6: peak at add = 3 * 1024.
    assert_eq!(cost.activation_peak_bytes, 3072);
    assert_eq!(cost.output_bytes, 4 * 36 * 4);
}

#[test]
fn batch_binding_scales_linearly() {
    let model = small_model();
    let mut b = hw(8, 8);
    b.batch = 3;
    assert_eq!(analyse(&model, &b).unwrap().activation_peak_bytes, 3 * 3072);
}

#[test]
fn unbound_spatial_dim_names_tensor() {
    let err = analyse(&small_model(), &ShapeBindings::default()).unwrap_err();
    match err {
        GraphError::UnboundDim { tensor, axis, param } => {
            assert_eq!(axis, 2);
            assert_eq!(param, "H");
            assert!(!tensor.is_empty());
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn missing_value_info_is_listed_or_error() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        g.value_info.retain(|v| v.name != "b");
    }
    let cost = analyse(&m, &hw(8, 8)).unwrap();
    assert_eq!(cost.unsized_tensors, vec!["b".to_string()]);
    let mut strict = hw(8, 8);
    strict.require_all_shapes = true;
    let err = analyse(&m, &strict).unwrap_err();
    assert!(matches!(err, GraphError::MissingShape { ref tensor, ref node } if tensor == "b" && node == "relu"));
}

#[test]
fn undefined_input_names_node() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        g.node.swap(0, 1); // relu before conv: not topological
    }
    let err = analyse(&m, &hw(8, 8)).unwrap_err();
    assert!(matches!(err, GraphError::UndefinedInput { ref node, ref tensor } if node == "relu" && tensor == "a"));
}

#[test]
fn initializer_size_mismatch_is_error() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        g.initializer[0].raw_data.pop();
    }
    let err = analyse(&m, &hw(8, 8)).unwrap_err();
    assert!(matches!(
        err,
        GraphError::InitializerSize {
            expected: 144,
            found: 143,
            ..
        }
    ));
}

#[test]
fn external_and_float_data_initializers() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        let mut ext = init("e", &[10, 10]);
        ext.raw_data.clear();
        ext.data_location = 1;
        ext.external_data = vec![StringStringEntryProto {
            key: "length".into(),
            value: "400".into(),
        }];
        let mut fl = init("f", &[3]);
        fl.raw_data.clear();
        fl.float_data = vec![1.0, 2.0, 3.0];
        let mut half = init("h", &[5]);
        half.data_type = 10;
        half.raw_data = vec![0; 10];
        g.initializer.extend([ext, fl, half]);
    }
    let cost = analyse(&m, &hw(8, 8)).unwrap();
    assert_eq!(cost.parameter_bytes, 144 + 400 + 12 + 10);
    if let Some(g) = m.graph.as_mut() {
        g.initializer[1].external_data[0].value = "lots".into();
    }
    assert!(matches!(
        analyse(&m, &hw(8, 8)).unwrap_err(),
        GraphError::ExternalData { ref field, .. } if field == "length"
    ));
}

#[test]
fn constant_nodes_count_as_parameters() {
    let mut m = small_model();
    if let Some(g) = m.graph.as_mut() {
        let mut k = node("Constant", "k", &[], &["kv"]);
        k.attribute = vec![AttributeProto {
            name: "value".into(),
            t: Some(init("", &[4])),
            r#type: 4,
        }];
        g.node.insert(0, k);
        g.node[3].input[1] = "kv".into(); // add(a, kv) no longer reads b
    }
    let cost = analyse(&m, &hw(8, 8)).unwrap();
    assert_eq!(cost.parameter_bytes, 144 + 16);
    assert!(cost.unsized_tensors.is_empty());
}

#[test]
fn garbage_bytes_are_decode_error() {
    let err = decode_model(&[0xff, 0xff, 0xff], Path::new("bad.onnx")).unwrap_err();
    assert!(err.to_string().contains("bad.onnx"));
    assert!(matches!(
        analyse(&ModelProto::default(), &ShapeBindings::default()),
        Err(GraphError::NoGraph)
    ));
}

#[test]
fn element_sizes() {
    assert_eq!(tensor_bytes("t", &[3], 22).unwrap(), 2); // INT4 packs two per byte
    assert_eq!(tensor_bytes("t", &[2, 2], 7).unwrap(), 32);
    assert!(matches!(
        tensor_bytes("t", &[1], 8),
        Err(GraphError::UnsizedType { .. })
    ));
    assert!(matches!(
        tensor_bytes("t", &[u64::MAX, 2], 1),
        Err(GraphError::Overflow { .. })
    ));
}
