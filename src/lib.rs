//! hsiedge: hyperspectral cube inference on Jetson-class edge devices.
//!
//! The pipeline runs sensor cube -> tiles -> engine -> stitched maps -> sinks; see `ARCHITECTURE.md`.

// Errors carry the paths, fields and values they name; they are built once, on the failure path.
#![allow(clippy::result_large_err)]

pub mod bench;
pub mod budget;
pub mod config;
pub mod cube;
pub mod daemon;
pub mod delivery;
pub mod doctor;
pub mod engine;
pub mod ffi;
pub mod gpu;
pub mod graph;
pub mod job;
pub mod map;
pub mod model;
pub mod pipeline;
pub mod platform;
pub mod simulate;
pub mod source;
pub mod telemetry;
pub mod tile;
