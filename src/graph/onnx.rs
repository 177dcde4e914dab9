//! The subset of `onnx.proto` (IR version 10) that memory planning reads. Field numbers follow
//! `onnx/onnx.proto3`; unknown fields are skipped by prost, so full models decode.

/// `onnx.ModelProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// `ir_version = 1`.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// `producer_name = 2`.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// `opset_import = 8`.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// `graph = 7`.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// `onnx.OperatorSetIdProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// `domain = 1`.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// `version = 2`.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `onnx.GraphProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// `node = 1`, topologically sorted.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// `name = 2`.
    #[prost(string, tag = "2")]
    pub name: String,
    /// `initializer = 5`.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// `input = 11`.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// `output = 12`.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// `value_info = 13`.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// `onnx.NodeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// `input = 1`; an empty name is an omitted optional input.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// `output = 2`.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// `name = 3`.
    #[prost(string, tag = "3")]
    pub name: String,
    /// `op_type = 4`.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// `attribute = 5`.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// `domain = 7`.
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// `onnx.AttributeProto`, only what a `Constant` node's value needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// `name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `t = 5`: a tensor value.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// `type = 20`.
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

/// `onnx.StringStringEntryProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// `key = 1`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `value = 2`.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `onnx.TensorProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `dims = 1`.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// `data_type = 2` (`TensorProto.DataType`).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// `float_data = 4`.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// `int32_data = 5`.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// `int64_data = 7`.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// `name = 8`.
    #[prost(string, tag = "8")]
    pub name: String,
    /// `raw_data = 9`.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// `double_data = 10`.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// `external_data = 13` (`location`, `offset`, `length`, `checksum`).
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// `data_location = 14`: 0 DEFAULT, 1 EXTERNAL.
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `onnx.ValueInfoProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// `name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `type = 2`.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `onnx.TypeProto`; only the tensor alternative of its `value` oneof.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// `tensor_type = 1`.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
}

/// `onnx.TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoTensor {
    /// `elem_type = 1` (`TensorProto.DataType`).
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// `shape = 2`.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `onnx.TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// `dim = 1`.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `onnx.TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// `oneof value { int64 dim_value = 1; string dim_param = 2; }`
    #[prost(oneof = "DimValue", tags = "1, 2")]
    pub value: Option<DimValue>,
}

/// The `value` oneof of a dimension.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimValue {
    /// `dim_value = 1`.
    #[prost(int64, tag = "1")]
    DimValue(i64),
    /// `dim_param = 2`.
    #[prost(string, tag = "2")]
    DimParam(String),
}
