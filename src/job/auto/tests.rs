//! The auto batch's unit tests: probe sizes for the calibration and the device line.

use super::*;

const GIB: u64 = 1 << 30;

#[test]
fn a_small_arena_bound_still_gets_a_two_point_tile_line() {
    // Salinas-A's dense twin, 256-pixel tiles of a float32 scene: 69.8 MB a tile by the graph.
    let prior = 69_832_704u64;
    let fits = |room: u64| move |b: u64| prior * 8 * b <= room;
    assert_eq!(probe_sizes(Unit::Tile, vec![], 64, true, fits(8 * GIB)), vec![1, 4, 8]);
    // Under a 2 GiB bound 4 tiles do not fit eight times over; before, one size was left and
    // nothing was calibrated.
    assert_eq!(probe_sizes(Unit::Tile, vec![], 64, true, fits(2 * GIB)), vec![1, 2]);
    assert_eq!(
        probe_sizes(Unit::Tile, vec![], 64, true, fits(GIB / 2)),
        Vec::<u64>::new()
    );
    // The host keeps what it did: 1 tile alone, no calibration, the prior.
    assert_eq!(probe_sizes(Unit::Tile, vec![], 64, false, fits(2 * GIB)), vec![1]);
    assert_eq!(
        probe_sizes(Unit::Sample, vec![15, 61, 185], 7_138, false, |b| b < 100),
        vec![15, 61]
    );
    // A scene of 4 tiles runs "8" as 4, and a strip of 3 tiles "4" and "8" as 3: only the
    // sizes it can run are probed.
    assert_eq!(probe_sizes(Unit::Tile, vec![], 4, true, fits(8 * GIB)), vec![1, 4]);
    assert_eq!(probe_sizes(Unit::Tile, vec![], 3, false, fits(8 * GIB)), vec![1, 3]);
    assert_eq!(probe_sizes(Unit::Tile, vec![], 1, true, fits(8 * GIB)), vec![1]);
}

#[test]
fn device_probes_of_a_per_pixel_model_scale_with_the_device_room() {
    // The patch model: 108 KB a patch by the graph; the host's probes go to 185 patches.
    let prior = 108_376u64;
    assert_eq!(device_probe_sizes(2 * GIB, prior, 1 << 20, 185), vec![512, 2048]);
    assert_eq!(device_probe_sizes(8 * GIB, prior, 1 << 20, 185), vec![1024, 4096]);
    assert_eq!(device_probe_sizes(80 * GIB, prior, 1 << 20, 185), vec![1024, 4096]);
    // The scene bounds them (Salinas-A: 7,138 pixels; a 3,000-pixel scene: 2,048).
    assert_eq!(device_probe_sizes(80 * GIB, prior, 7_138, 185), vec![1024, 4096]);
    assert_eq!(device_probe_sizes(80 * GIB, prior, 3_000, 185), vec![512, 2048]);
    // No larger than the host's own probes: none.
    assert_eq!(device_probe_sizes(80 * GIB, prior, 1_000, 1_000), Vec::<u64>::new());
    assert_eq!(device_probe_sizes(0, prior, 1 << 20, 185), Vec::<u64>::new());
    assert_eq!(device_probe_sizes(GIB, 0, 0, 0), Vec::<u64>::new());
}
