//! Graph sizing on the committed ONNX fixtures and the trained models in `models/`. All of them are
//! committed, so a missing one fails rather than skips.

use std::path::{Path, PathBuf};

use hsiedge::budget::{self, ChooseConfig, CostModel, Plan, Unit};
use hsiedge::graph::{self, ShapeBindings};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sysroot(name: &str) -> PathBuf {
    repo().join("tests/fixtures/sysroots").join(name)
}

#[test]
fn tiny_patch_model_sizes() {
    let path = repo().join("models/fixtures/tiny/patch.onnx");
    let g = graph::analyse_file(&path, &ShapeBindings::default()).unwrap();
    // w: 2x4x3x3 f32 = 288 B, b: 2 f32 = 8 B.
    assert_eq!(g.parameter_bytes, 296);
    // input 4x3x3 f32 = 144 B and conv_out 2x1x1 = 8 B are live together at the conv.
    assert_eq!(g.activation_peak_bytes, 152);
    assert_eq!(g.peak_node.as_deref(), Some("conv"));
    assert_eq!(g.activation_total_bytes, 144 + 8 + 8);
    assert!(g.unsized_tensors.is_empty(), "{:?}", g.unsized_tensors);
}

#[test]
fn tiny_dense_model_needs_tile_bindings() {
    let path = repo().join("models/fixtures/tiny/dense.onnx");
    let err = graph::analyse_file(&path, &ShapeBindings::default()).unwrap_err();
    assert!(err.to_string().contains("h_padded"), "{err}");
    let tile = 16u64;
    let halo = 1u64;
    let b = ShapeBindings::per_unit([
        ("h", tile),
        ("w", tile),
        ("h_padded", tile + 2 * halo),
        ("w_padded", tile + 2 * halo),
    ]);
    let g = graph::analyse_file(&path, &b).unwrap();
    assert_eq!(g.activation_peak_bytes, 4 * 18 * 18 * 4 + 2 * 16 * 16 * 4);
    // The automatic dense bindings find the same names from the model's inputs and outputs.
    let model = graph::load_model(&path).unwrap();
    let auto = graph::analyse(&model, &ShapeBindings::dense_tile(&model, tile, tile, halo)).unwrap();
    assert_eq!(auto.activation_peak_bytes, g.activation_peak_bytes);

    // Dense planning on the Orin Nano root: tiles are the unit.
    let system = budget::read_system_budget(&sysroot("orin_nano_8gb"), &budget::BudgetConfig::default()).unwrap();
    let cost = CostModel::from_graph(&g, Unit::Tile, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
    let plan = Plan::build(&system, &cost, Some(&g), &ChooseConfig::default()).unwrap();
    assert_eq!(plan.tiles_safe, Some(plan.batch_safe));
    assert_eq!(plan.mode, "dense");
}

#[test]
fn every_trained_patch_model_sizes() {
    let dirs = std::fs::read_dir(repo().join("models")).unwrap();
    let mut seen = 0;
    for d in dirs.flatten() {
        let p = d.path().join("patch.onnx");
        if !p.is_file() || d.file_name() == "fixtures" {
            continue;
        }
        seen += 1;
        match graph::analyse_file(&p, &ShapeBindings::default()) {
            Ok(g) => {
                eprintln!(
                    "{}: params {} B, activation peak {} B/sample at {:?}, total {} B/sample, {} unsized",
                    rel(&p),
                    g.parameter_bytes,
                    g.activation_peak_bytes,
                    g.peak_node,
                    g.activation_total_bytes,
                    g.unsized_tensors.len()
                );
                assert!(g.parameter_bytes > 0);
                assert!(g.activation_peak_bytes >= g.input_bytes);
            }
            // A model with a symbolic non-batch dim is legitimate; say so rather than fail.
            Err(e @ graph::GraphError::UnboundDim { .. }) => eprintln!("{}: needs bindings: {e}", rel(&p)),
            Err(e) => panic!("{}: {e}", rel(&p)),
        }
    }
    assert!(seen >= 3, "only {seen} trained patch models under models/");
}

#[test]
fn every_dense_twin_costs_more_per_larger_tile() {
    let dirs = std::fs::read_dir(repo().join("models")).unwrap();
    let mut seen = 0;
    for d in dirs.flatten() {
        let p = d.path().join("dense.onnx");
        if !p.is_file() || d.file_name() == "fixtures" {
            continue;
        }
        let halo = std::fs::read_to_string(d.path().join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["halo"].as_u64())
            .unwrap_or(0);
        seen += 1;
        let model = graph::load_model(&p).unwrap();
        let small = graph::analyse(&model, &ShapeBindings::dense_tile(&model, 32, 32, halo)).unwrap();
        let large = graph::analyse(&model, &ShapeBindings::dense_tile(&model, 64, 64, halo)).unwrap();
        eprintln!(
            "{} (halo {halo}): activation peak {} B per 32x32 tile, {} B per 64x64 tile, {} unsized",
            rel(&p),
            small.activation_peak_bytes,
            large.activation_peak_bytes,
            large.unsized_tensors.len()
        );
        // Per-tile cost grows with the tile. Every spatial dim lies between the tile and the padded
        // tile, and (64 + x) / (32 + x) <= 2 for x >= 0, so a 2x2-larger tile costs at most 4x.
        assert!(large.activation_peak_bytes > small.activation_peak_bytes);
        assert!(large.activation_peak_bytes <= 4 * small.activation_peak_bytes);
        assert_eq!(large.parameter_bytes, small.parameter_bytes);
    }
    assert!(seen >= 1, "no trained dense twin under models/");
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}
