//! Reading ONNX models for memory planning.
//!
//! This module decodes the subset of `onnx.proto` that memory planning needs (graph, nodes,
//! initializers, value infos and tensor shapes) with hand-written [`prost`] messages, and
//! walks the graph to estimate what one sample (or one tile in dense mode) costs:
//!
//! * parameter bytes: the sum of all initializers (and `Constant` node values);
//! * the peak of live activation bytes per unit, walking nodes in file order (ONNX requires a
//!   topological order), where a tensor lives from its producer until its last consumer and graph
//!   outputs live to the end;
//! * the sum of all activation bytes per unit, which is what training retains for backward.
//!
//! Shapes come from `graph.input`, `graph.output` and `graph.value_info`. Symbolic dimensions are
//! bound through [`ShapeBindings`]: a name the caller bound takes that value, otherwise a symbolic
//! (or unknown) leading dimension is the batch and takes `batch` (1 for per-unit cost). Any other
//! unbound symbolic dimension is an error naming the tensor and the parameter, because guessing
//! a spatial size would make the estimate silently wrong (the dense twin's H/W come from the
//! tile size and must be bound by the caller).
//!
//! Tensors without any shape information (a model exported without shape inference) are not
//! guessed either: [`GraphCost::unsized_tensors`] lists them, so the estimate is known to be a
//! lower bound, and [`ShapeBindings::require_all_shapes`] turns them into errors.
//!
//! Subgraphs of control-flow nodes (`If`, `Loop`, `Scan`) are not walked; their outputs count
//! only if the outer graph declares their shapes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod onnx;

/// What can go wrong reading or sizing a model. Each variant names the file, node or tensor.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The model file could not be read.
    #[error("reading ONNX model {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a protobuf `ModelProto`.
    #[error("decoding ONNX model {path}")]
    Decode {
        /// The file (or `<memory>`).
        path: PathBuf,
        /// The protobuf error.
        source: prost::DecodeError,
    },
    /// `ModelProto.graph` is absent.
    #[error("ONNX model has no graph (ModelProto.graph is empty)")]
    NoGraph,
    /// A symbolic dimension that is not the leading (batch) one has no binding.
    #[error("tensor '{tensor}' dimension {axis} is symbolic '{param}' and no value was bound for it")]
    UnboundDim {
        /// The tensor.
        tensor: String,
        /// The axis.
        axis: usize,
        /// The `dim_param` (empty when the dimension had neither value nor param).
        param: String,
    },
    /// A dimension is negative.
    #[error("tensor '{tensor}' dimension {axis} is negative ({value})")]
    NegativeDim {
        /// The tensor.
        tensor: String,
        /// The axis.
        axis: usize,
        /// The value.
        value: i64,
    },
    /// The element type has no fixed size (STRING, UNDEFINED or an unknown code).
    #[error("tensor '{tensor}' has element type {elem_type} whose size is not fixed")]
    UnsizedType {
        /// The tensor.
        tensor: String,
        /// The `TensorProto.DataType` code.
        elem_type: i32,
    },
    /// A size does not fit in 64 bits.
    #[error("tensor '{tensor}' size overflows 64 bits")]
    Overflow {
        /// The tensor.
        tensor: String,
    },
    /// An initializer's stored data length disagrees with its dims.
    #[error("initializer '{tensor}' raw_data holds {found} bytes but its dims need {expected}")]
    InitializerSize {
        /// The initializer.
        tensor: String,
        /// Bytes its dims and type need.
        expected: u64,
        /// Bytes found in `raw_data`.
        found: u64,
    },
    /// An external-data entry is malformed.
    #[error("initializer '{tensor}' external_data field '{field}' is invalid: '{value}'")]
    ExternalData {
        /// The initializer.
        tensor: String,
        /// The key.
        field: String,
        /// The value.
        value: String,
    },
    /// A node reads a tensor that nothing produced before it (not topologically sorted, or a
    /// dangling name).
    #[error("node '{node}' input '{tensor}' is not produced by an earlier node, an initializer or a graph input")]
    UndefinedInput {
        /// The node (name, or `op_type#index` when unnamed).
        node: String,
        /// The tensor.
        tensor: String,
    },
    /// A tensor has no shape information and [`ShapeBindings::require_all_shapes`] is set.
    #[error("tensor '{tensor}' (from node '{node}') has no shape in graph inputs, outputs or value_info")]
    MissingShape {
        /// The tensor.
        tensor: String,
        /// The producing node, or `<graph input>`.
        node: String,
    },
}

/// How symbolic dimensions are resolved when sizing tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeBindings {
    /// The value of a symbolic or unknown leading dimension (the batch). 1 gives per-unit cost.
    pub batch: u64,
    /// Values for named `dim_param`s at any axis (e.g. the dense twin's `height`/`width` bound
    /// to the tile size plus halo). A bound name wins over the batch rule.
    pub named: BTreeMap<String, u64>,
    /// The value of any other unbound symbolic dimension, when set. For a fully convolutional
    /// dense twin, the padded tile side bounds every spatial dimension from above, so it gives
    /// a safe estimate where shape inference left symbols such as `unk__3`. `None`: such a
    /// dimension is [`GraphError::UnboundDim`].
    pub other_dims: Option<u64>,
    /// When true, a tensor without shape information is an error instead of being listed in
    /// [`GraphCost::unsized_tensors`].
    pub require_all_shapes: bool,
}

impl Default for ShapeBindings {
    fn default() -> Self {
        Self {
            batch: 1,
            named: BTreeMap::new(),
            other_dims: None,
            require_all_shapes: false,
        }
    }
}

impl ShapeBindings {
    /// Per-sample bindings (batch 1) with the given named dimensions bound.
    pub fn per_unit<I, S>(named: I) -> Self
    where
        I: IntoIterator<Item = (S, u64)>,
        S: Into<String>,
    {
        Self {
            named: named.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            ..Self::default()
        }
    }

    /// Per-tile bindings for a dense twin: the symbolic last two axes of every graph input
    /// (rank >= 3) are bound to the padded tile (`tile + 2*halo`), those of every graph output
    /// to the tile, and any other unbound symbol to the larger padded side (an upper bound for a
    /// fully convolutional net). Named bindings already in the model's inputs win in file order.
    pub fn dense_tile(model: &onnx::ModelProto, tile_h: u64, tile_w: u64, halo: u64) -> Self {
        let pad_h = tile_h.saturating_add(halo.saturating_mul(2));
        let pad_w = tile_w.saturating_add(halo.saturating_mul(2));
        let mut named = BTreeMap::new();
        if let Some(g) = model.graph.as_ref() {
            let sides = g
                .input
                .iter()
                .map(|v| (v, pad_h, pad_w))
                .chain(g.output.iter().map(|v| (v, tile_h, tile_w)));
            for (vi, h, w) in sides {
                let Some(shape) = vi
                    .r#type
                    .as_ref()
                    .and_then(|t| t.tensor_type.as_ref())
                    .and_then(|t| t.shape.as_ref())
                else {
                    continue;
                };
                let rank = shape.dim.len();
                if rank < 3 {
                    continue;
                }
                for (axis, value) in [(rank - 2, h), (rank - 1, w)] {
                    if let Some(onnx::DimValue::DimParam(p)) = &shape.dim[axis].value {
                        named.entry(p.clone()).or_insert(value);
                    }
                }
            }
        }
        Self {
            named,
            other_dims: Some(pad_h.max(pad_w)),
            ..Self::default()
        }
    }
}

/// What a model costs per unit (sample or tile), from its graph alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphCost {
    /// Bytes of all initializers plus `Constant` node values (weights stay resident).
    pub parameter_bytes: u64,
    /// Number of parameter tensors counted.
    pub parameter_tensors: usize,
    /// Peak of live activation bytes for one unit over the node walk (graph inputs included).
    pub activation_peak_bytes: u64,
    /// The node at which the peak is reached (name or `op_type#index`), if any node ran.
    pub peak_node: Option<String>,
    /// Sum of all activation bytes for one unit (inputs and every node output): what training
    /// keeps for the backward pass.
    pub activation_total_bytes: u64,
    /// Bytes of the non-initializer graph inputs for one unit.
    pub input_bytes: u64,
    /// Bytes of the graph outputs for one unit.
    pub output_bytes: u64,
    /// Number of nodes walked.
    pub node_count: usize,
    /// Activation tensors without shape information (not counted: the estimate is a lower bound).
    pub unsized_tensors: Vec<String>,
}

/// Bits per element of a `TensorProto.DataType`, `None` for types without a fixed size.
pub fn elem_bits(data_type: i32) -> Option<u64> {
    Some(match data_type {
        1 | 6 | 12 => 32,       // FLOAT, INT32, UINT32
        2 | 3 | 9 => 8,         // UINT8, INT8, BOOL
        4 | 5 | 10 | 16 => 16,  // UINT16, INT16, FLOAT16, BFLOAT16
        7 | 11 | 13 | 14 => 64, // INT64, DOUBLE, UINT64, COMPLEX64
        15 => 128,              // COMPLEX128
        17..=20 => 8,           // FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ
        21..=23 => 4,           // UINT4, INT4, FLOAT4E2M1
        _ => return None,       // UNDEFINED, STRING, unknown
    })
}

/// Reads and decodes an ONNX model file.
pub fn load_model(path: &Path) -> Result<onnx::ModelProto, GraphError> {
    let bytes = std::fs::read(path).map_err(|source| GraphError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    decode_model(&bytes, path)
}

/// Decodes ONNX model bytes; `origin` only labels errors.
pub fn decode_model(bytes: &[u8], origin: &Path) -> Result<onnx::ModelProto, GraphError> {
    prost::Message::decode(bytes).map_err(|source| GraphError::Decode {
        path: origin.to_path_buf(),
        source,
    })
}

/// Reads a model file and sizes it with [`analyse`].
pub fn analyse_file(path: &Path, bindings: &ShapeBindings) -> Result<GraphCost, GraphError> {
    analyse(&load_model(path)?, bindings)
}

/// Byte size of a tensor with `dims` and `data_type`, named `tensor` in errors.
fn tensor_bytes(tensor: &str, dims: &[u64], data_type: i32) -> Result<u64, GraphError> {
    let bits = elem_bits(data_type).ok_or_else(|| GraphError::UnsizedType {
        tensor: tensor.to_string(),
        elem_type: data_type,
    })?;
    let overflow = || GraphError::Overflow {
        tensor: tensor.to_string(),
    };
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    // Sub-byte types pack two elements per byte, rounded up.
    let total_bits = elems.checked_mul(bits).ok_or_else(overflow)?;
    Ok(total_bits.div_ceil(8))
}

/// Bytes an initializer (or constant) holds in memory once loaded.
fn initializer_bytes(t: &onnx::TensorProto) -> Result<u64, GraphError> {
    let mut dims = Vec::with_capacity(t.dims.len());
    for (axis, &d) in t.dims.iter().enumerate() {
        let d = u64::try_from(d).map_err(|_| GraphError::NegativeDim {
            tensor: t.name.clone(),
            axis,
            value: d,
        })?;
        dims.push(d);
    }
    if t.data_type == 8 {
        // STRING initializers have no fixed element size; count what is stored.
        return Ok(t.raw_data.len() as u64);
    }
    let expected = tensor_bytes(&t.name, &dims, t.data_type)?;
    if t.data_location == 1 || !t.external_data.is_empty() {
        // External data: the `length` key, when given, must be a number; the loaded size is
        // what the dims say (ORT materialises the whole tensor).
        for entry in &t.external_data {
            if entry.key == "length" || entry.key == "offset" {
                entry
                    .value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| GraphError::ExternalData {
                        tensor: t.name.clone(),
                        field: entry.key.clone(),
                        value: entry.value.clone(),
                    })?;
            }
        }
        return Ok(expected);
    }
    if !t.raw_data.is_empty() && t.raw_data.len() as u64 != expected {
        return Err(GraphError::InitializerSize {
            tensor: t.name.clone(),
            expected,
            found: t.raw_data.len() as u64,
        });
    }
    Ok(expected)
}

/// Resolves a value info's shape to concrete dims; `Ok(None)` when it has no tensor shape.
fn resolve_shape(vi: &onnx::ValueInfoProto, bindings: &ShapeBindings) -> Result<Option<(Vec<u64>, i32)>, GraphError> {
    let Some(tt) = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) else {
        return Ok(None);
    };
    let Some(shape) = tt.shape.as_ref() else {
        return Ok(None);
    };
    let mut dims = Vec::with_capacity(shape.dim.len());
    for (axis, d) in shape.dim.iter().enumerate() {
        let v = match &d.value {
            Some(onnx::DimValue::DimValue(v)) => u64::try_from(*v).map_err(|_| GraphError::NegativeDim {
                tensor: vi.name.clone(),
                axis,
                value: *v,
            })?,
            Some(onnx::DimValue::DimParam(p)) => match (bindings.named.get(p), bindings.other_dims) {
                (Some(&v), _) => v,
                (None, _) if axis == 0 => bindings.batch,
                (None, Some(v)) => v,
                (None, None) => {
                    return Err(GraphError::UnboundDim {
                        tensor: vi.name.clone(),
                        axis,
                        param: p.clone(),
                    });
                }
            },
            None if axis == 0 => bindings.batch,
            None => match bindings.other_dims {
                Some(v) => v,
                None => {
                    return Err(GraphError::UnboundDim {
                        tensor: vi.name.clone(),
                        axis,
                        param: String::new(),
                    });
                }
            },
        };
        dims.push(v);
    }
    Ok(Some((dims, tt.elem_type)))
}

fn node_label(node: &onnx::NodeProto, index: usize) -> String {
    if node.name.is_empty() {
        format!("{}#{index}", node.op_type)
    } else {
        node.name.clone()
    }
}

/// Sizes a decoded model: parameters, peak live activations and total activations per unit.
///
/// Contract: nodes must be in topological order (as ONNX requires); a node input that no
/// earlier node, initializer or graph input provides is [`GraphError::UndefinedInput`].
pub fn analyse(model: &onnx::ModelProto, bindings: &ShapeBindings) -> Result<GraphCost, GraphError> {
    let graph = model.graph.as_ref().ok_or(GraphError::NoGraph)?;

    let mut parameter_bytes = 0u64;
    let mut parameter_tensors = 0usize;
    let mut params: HashSet<&str> = HashSet::new();
    for t in &graph.initializer {
        parameter_bytes = parameter_bytes
            .checked_add(initializer_bytes(t)?)
            .ok_or_else(|| GraphError::Overflow { tensor: t.name.clone() })?;
        parameter_tensors += 1;
        params.insert(t.name.as_str());
    }

    // Sizes of every tensor with declared shape info (value_info, then inputs/outputs, which
    // are authoritative for the graph boundary).
    let mut sizes: HashMap<&str, u64> = HashMap::new();
    for vi in graph
        .value_info
        .iter()
        .chain(graph.input.iter())
        .chain(graph.output.iter())
    {
        if params.contains(vi.name.as_str()) {
            continue;
        }
        if let Some((dims, elem)) = resolve_shape(vi, bindings)? {
            sizes.insert(vi.name.as_str(), tensor_bytes(&vi.name, &dims, elem)?);
        }
    }

    let n = graph.node.len();
    // Interval [birth, death] in node steps for every activation tensor.
    let mut birth: HashMap<&str, usize> = HashMap::new();
    let mut death: HashMap<&str, usize> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut producer: HashMap<&str, String> = HashMap::new();
    let mut input_bytes = 0u64;
    for vi in &graph.input {
        if params.contains(vi.name.as_str()) {
            continue; // IR < 4 lists initializers among inputs
        }
        birth.insert(vi.name.as_str(), 0);
        death.insert(vi.name.as_str(), 0);
        order.push(vi.name.as_str());
        producer.insert(vi.name.as_str(), "<graph input>".to_string());
        input_bytes = input_bytes.saturating_add(sizes.get(vi.name.as_str()).copied().unwrap_or(0));
    }
    for (i, node) in graph.node.iter().enumerate() {
        let label = node_label(node, i);
        for input in &node.input {
            if input.is_empty() || params.contains(input.as_str()) {
                continue;
            }
            match death.get_mut(input.as_str()) {
                Some(d) => *d = (*d).max(i),
                None => {
                    return Err(GraphError::UndefinedInput {
                        node: label,
                        tensor: input.clone(),
                    });
                }
            }
        }
        if node.op_type == "Constant" && node.domain.is_empty() {
            // A Constant's value is a weight, resident like an initializer.
            if let Some(t) = node.attribute.iter().find_map(|a| a.t.as_ref()) {
                parameter_bytes = parameter_bytes.saturating_add(initializer_bytes(t)?);
                parameter_tensors += 1;
                for out in &node.output {
                    params.insert(out.as_str());
                }
                continue;
            }
        }
        for out in &node.output {
            if out.is_empty() {
                continue;
            }
            birth.insert(out.as_str(), i);
            death.insert(out.as_str(), i);
            order.push(out.as_str());
            producer.insert(out.as_str(), label.clone());
        }
    }
    let mut output_bytes = 0u64;
    for vi in &graph.output {
        if let Some(d) = death.get_mut(vi.name.as_str()) {
            *d = n.saturating_sub(1); // outputs are held until the run returns
        }
        output_bytes = output_bytes.saturating_add(sizes.get(vi.name.as_str()).copied().unwrap_or(0));
    }

    let mut unsized_tensors = Vec::new();
    let mut activation_total_bytes = 0u64;
    // Difference array over steps: +size at birth, -size after death.
    let mut delta = vec![0i128; n.max(1) + 1];
    for name in &order {
        let Some(&size) = sizes.get(name) else {
            if bindings.require_all_shapes {
                return Err(GraphError::MissingShape {
                    tensor: (*name).to_string(),
                    node: producer.get(name).cloned().unwrap_or_default(),
                });
            }
            unsized_tensors.push((*name).to_string());
            continue;
        };
        let b = birth.get(name).copied().unwrap_or(0);
        let d = death.get(name).copied().unwrap_or(b).max(b);
        activation_total_bytes = activation_total_bytes.saturating_add(size);
        delta[b] += i128::from(size);
        delta[d + 1] -= i128::from(size);
    }
    let mut live = 0i128;
    let mut peak = 0i128;
    let mut peak_step = None;
    for (step, dv) in delta.iter().take(n.max(1)).enumerate() {
        live += dv;
        if live > peak {
            peak = live;
            peak_step = Some(step);
        }
    }
    let peak_node = peak_step.and_then(|s| graph.node.get(s).map(|node| node_label(node, s)));

    Ok(GraphCost {
        parameter_bytes,
        parameter_tensors,
        activation_peak_bytes: u64::try_from(peak).unwrap_or(u64::MAX),
        peak_node,
        activation_total_bytes,
        input_bytes,
        output_bytes,
        node_count: n,
        unsized_tensors,
    })
}

#[cfg(test)]
mod tests;
