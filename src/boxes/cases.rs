//! (feature `bench`: a test hook) Seeded random geometry cases for the box mapping: source
//! sizes, network sizes, resize modes, letterbox anchors, interpolations and rois, each
//! resolved by the node's own [`Geometry`] and checked three ways (network -> source ->
//! network; source points through the node's geometry and back; the kernel's sampling
//! tables, [`AxisMap`], against the mapped pixel centres). `vision_preproc
//! geometry-cases` prints the same cases with this crate's results, which
//! `test/python/test_boxes.py` checks the Python and C++ mappings against.

use super::{to_network, to_source, BoxFormat, SourceMapping};
use crate::backend::AxisMap;
use crate::config::{Config, Interpolation, LetterboxAnchor, ResizeMode};
use crate::error::Result;
use crate::pipeline::Geometry;
use crate::rng::SplitMix64;

/// One random case: the configuration's geometry and a source size, resolved.
#[derive(Debug, Clone)]
pub struct Case {
    /// `network_image_width`, `network_image_height`, `resize_mode`, `letterbox_anchor`,
    /// `interpolation`, `roi`; the rest default.
    pub config: Config,
    /// The node's geometry of the source size.
    pub geometry: Geometry,
    /// What a consumer has: the published (f32) fields.
    pub published: SourceMapping,
}

/// The largest errors of a set of cases, in source pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Errors {
    /// network -> source -> network, the difference divided by the scale.
    pub round_trip: f64,
    /// source point -> the node's geometry (f64) -> the published mapping back.
    pub source_points: f64,
    /// a network pixel centre mapped back against where the bilinear kernel samples it
    /// (every unclamped pixel of the content, both axes).
    pub kernel_linear: f64,
    /// nearest: how far the mapped left/top edge of a network pixel lies outside the
    /// source pixel the kernel takes (0 when inside).
    pub kernel_nearest: f64,
}

impl Errors {
    fn max(self, o: Errors) -> Errors {
        Errors {
            round_trip: self.round_trip.max(o.round_trip),
            source_points: self.source_points.max(o.source_points),
            kernel_linear: self.kernel_linear.max(o.kernel_linear),
            kernel_nearest: self.kernel_nearest.max(o.kernel_nearest),
        }
    }
}

/// A size in 1..=max, small (up to 64) half of the time.
fn size(rng: &mut SplitMix64, max: u64) -> u32 {
    let top = if rng.below(2) == 0 { 64 } else { max };
    1 + rng.below(top) as u32
}

/// A random roi of a `w` x `h` source (`[]` half of the time).
fn roi(rng: &mut SplitMix64, w: u32, h: u32) -> Vec<i64> {
    if rng.below(2) == 0 {
        return Vec::new();
    }
    let (x, y) = (rng.below(u64::from(w)), rng.below(u64::from(h)));
    let rw = 1 + rng.below(u64::from(w) - x);
    let rh = 1 + rng.below(u64::from(h) - y);
    [x, y, rw, rh].iter().map(|&v| v as i64).collect()
}

/// `count` cases from `seed`.
pub fn generate(seed: u64, count: usize) -> Result<Vec<Case>> {
    let mut rng = SplitMix64::new(seed);
    let mut cases = Vec::with_capacity(count);
    for _ in 0..count {
        let (sw, sh) = (size(&mut rng, 4096), size(&mut rng, 4096));
        let modes = [ResizeMode::Stretch, ResizeMode::Letterbox, ResizeMode::CenterCrop];
        let config = Config {
            network_image_width: size(&mut rng, 1024),
            network_image_height: size(&mut rng, 1024),
            resize_mode: modes[rng.below(3) as usize],
            letterbox_anchor: [LetterboxAnchor::Center, LetterboxAnchor::TopLeft]
                [rng.below(2) as usize],
            interpolation: [Interpolation::Linear, Interpolation::Nearest][rng.below(2) as usize],
            roi: roi(&mut rng, sw, sh),
            ..Config::default()
        };
        let geometry = Geometry::resolve(&config, sw, sh)?;
        let published = SourceMapping::published(&geometry)?;
        cases.push(Case { config, geometry, published });
    }
    Ok(cases)
}

/// A random coordinate in `[-len / 4, len * 5 / 4]` (inside and outside the image).
fn coordinate(rng: &mut SplitMix64, len: u32) -> f64 {
    let unit = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    (unit * 1.5 - 0.25) * f64::from(len)
}

impl Case {
    /// `n` random network points (x, y, x, y, ...), 8 per case in the checks.
    pub fn network_points(&self, rng: &mut SplitMix64, n: usize) -> Vec<f64> {
        let g = &self.geometry;
        (0..n)
            .flat_map(|_| [coordinate(rng, g.network_width), coordinate(rng, g.network_height)])
            .collect()
    }

    /// The largest errors of this case, in source pixels (`rng` picks the points).
    pub fn check(&self, rng: &mut SplitMix64) -> Result<Errors> {
        let (g, m) = (&self.geometry, &self.published);
        let (sx, sy, _, _) = m.fields();
        let mut e = Errors::default();
        let points = self.network_points(rng, 8);
        let mut back = points.clone();
        to_source(&mut back, BoxFormat::Points, m)?;
        to_network(&mut back, BoxFormat::Points, m)?;
        for (i, (a, b)) in points.iter().zip(&back).enumerate() {
            e.round_trip =
                e.round_trip.max((a - b).abs() / if i.is_multiple_of(2) { sx } else { sy });
        }
        for _ in 0..8 {
            let (u, v) = (coordinate(rng, g.source_width), coordinate(rng, g.source_height));
            let (x, y) = g.source_to_network(u, v);
            let (u2, v2) = m.point_to_source(x, y);
            e.source_points = e.source_points.max((u2 - u).abs()).max((v2 - v).abs());
        }
        let interpolation = self.config.interpolation;
        for (map, x_axis) in [(g.x_map(interpolation), true), (g.y_map(interpolation), false)] {
            let k = kernel_errors(&map, m, g, x_axis, interpolation);
            e.kernel_linear = e.kernel_linear.max(k.0);
            e.kernel_nearest = e.kernel_nearest.max(k.1);
        }
        Ok(e)
    }
}

/// (linear, nearest) errors of one axis's sampling table against the mapping.
fn kernel_errors(
    map: &AxisMap,
    m: &SourceMapping,
    g: &Geometry,
    x_axis: bool,
    interpolation: Interpolation,
) -> (f64, f64) {
    let content_start = f64::from(if x_axis { g.content.x } else { g.content.y });
    let region_start = (if x_axis { g.region.x } else { g.region.y }) as i32;
    let to_source =
        |x: f64| if x_axis { m.point_to_source(x, 0.0).0 } else { m.point_to_source(0.0, x).1 };
    let (mut linear, mut nearest) = (0.0f64, 0.0f64);
    for (d, (&i0, (&i1, &w1))) in map.i0.iter().zip(map.i1.iter().zip(&map.w1)).enumerate() {
        let network = content_start + d as f64;
        match interpolation {
            // Unclamped taps: the kernel samples at i0 + w1 in OpenCV's pixel-index
            // coordinates, i0 + w1 + 0.5 in ours. Clamped ones have i1 = i0 (the last
            // pixel) or i0 = the first pixel with weight 0 (before it).
            Interpolation::Linear if i1 == i0 + 1 && (w1 != 0.0 || i0 > region_start) => {
                let sampled = f64::from(i0) + f64::from(w1) + 0.5;
                linear = linear.max((to_source(network + 0.5) - sampled).abs());
            }
            Interpolation::Linear => {}
            // INTER_NEAREST takes the source pixel under the network pixel's left/top edge.
            Interpolation::Nearest => {
                let u = to_source(network);
                let outside = (f64::from(i0) - u).max(u - f64::from(i0 + 1)).max(0.0);
                nearest = nearest.max(outside);
            }
        }
    }
    (linear, nearest)
}

/// Check `count` cases from `seed`: the largest errors over all of them.
pub fn check_all(seed: u64, count: usize) -> Result<Errors> {
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut worst = Errors::default();
    for case in generate(seed, count)? {
        worst = worst.max(case.check(&mut rng)?);
    }
    Ok(worst)
}

/// Format a case's mapping checks as the lines `vision_preproc geometry-cases` prints:
/// `<format> <scale_x> <scale_y> <offset_x> <offset_y> <k> <k inputs> <k to_source> <k
/// to_network>`, one for points, one xyxy box and one xywh box; every number is an f64
/// printed shortest round-trip (the fields are the published f32 values, exactly).
pub fn lines(case: &Case, rng: &mut SplitMix64) -> Result<Vec<String>> {
    let (sx, sy, ox, oy) = case.published.fields();
    let mut out = Vec::new();
    let points = case.network_points(rng, 4);
    let boxes = case.network_points(rng, 2);
    // xywh: a width and height (non-negative) in place of the second point.
    let mut sizes = case.network_points(rng, 2);
    sizes[2] = sizes[2].abs();
    sizes[3] = sizes[3].abs();
    for (format, name, values) in [
        (BoxFormat::Points, "points", points),
        (BoxFormat::Xyxy, "xyxy", boxes),
        (BoxFormat::Xywh, "xywh", sizes),
    ] {
        let mut source = values.clone();
        to_source(&mut source, format, &case.published)?;
        let mut network = values.clone();
        to_network(&mut network, format, &case.published)?;
        let join = |v: &[f64]| v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(" ");
        out.push(format!(
            "{name} {sx:?} {sy:?} {ox:?} {oy:?} {} {} {} {}",
            values.len(),
            join(&values),
            join(&source),
            join(&network)
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tolerance of the box mapping (test/tolerances.json `boxes_source_px`).
    fn tolerance() -> f64 {
        let t: serde_yaml::Value =
            serde_yaml::from_str(include_str!("../../test/tolerances.json")).unwrap();
        t["boxes_source_px"].as_f64().unwrap()
    }

    #[test]
    fn ten_thousand_random_geometries_map_back_within_the_tolerance() {
        let worst = check_all(46, 10_000).unwrap();
        let tol = tolerance();
        println!("10,000 cases, largest errors in source pixels: {worst:?} (tolerance {tol})");
        assert!(worst.round_trip <= tol, "{worst:?}");
        assert!(worst.source_points <= tol, "{worst:?}");
        assert!(worst.kernel_linear <= tol, "{worst:?}");
        assert!(worst.kernel_nearest <= tol, "{worst:?}");
        // The checks see something: the cases reach every mode and a kernel table.
        let cases = generate(46, 10_000).unwrap();
        for mode in [ResizeMode::Stretch, ResizeMode::Letterbox, ResizeMode::CenterCrop] {
            assert!(cases.iter().filter(|c| c.config.resize_mode == mode).count() > 3000);
        }
        assert!(cases.iter().filter(|c| !c.config.roi.is_empty()).count() > 4000);
    }

    #[test]
    fn a_shifted_mapping_is_caught() {
        // The check is not blind: half a network pixel of offset error shows in every
        // measure that the kernel tables give.
        // 1920x1080 -> 640x640 letterbox (scale 1/3): 0.5 network pixel is 1.5 source pixels.
        let config =
            Config { network_image_width: 640, network_image_height: 640, ..Config::default() };
        let geometry = Geometry::resolve(&config, 1920, 1080).unwrap();
        let (sx, sy, ox, oy) = SourceMapping::published(&geometry).unwrap().fields();
        let published =
            SourceMapping::new(sx as f32, sy as f32, (ox + 0.5) as f32, oy as f32).unwrap();
        let e = Case { config, geometry, published }.check(&mut SplitMix64::new(1)).unwrap();
        assert!(e.source_points > 1.4 && e.kernel_linear > 1.4 && e.round_trip < 1e-9, "{e:?}");
    }

    #[test]
    fn lines_hold_the_inputs_and_both_directions() {
        let case = generate(3, 1).unwrap().remove(0);
        let lines = lines(&case, &mut SplitMix64::new(5)).unwrap();
        assert_eq!(lines.len(), 3);
        let f: Vec<&str> = lines[1].split(' ').collect();
        assert_eq!((f[0], f[5]), ("xyxy", "4"));
        assert_eq!(f.len(), 6 + 3 * 4);
    }
}
