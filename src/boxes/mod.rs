//! Detections back to source pixels, and source pixels to the network image: the
//! published geometry of a `Tensor`, or of one `BatchItem` of a `TensorBatch` or
//! `TensorRef`, applied to points and boxes (docs/HANDOFF.md, *Boxes back to source
//! pixels*; the Python twin is `vision_preproc_consumer.boxes`, the C/C++ one
//! `consumer_c/include/vision_preproc/boxes.h`).
//!
//! The convention, stated once (docs/SPEC.md, section 4): coordinates are continuous, 0.0
//! at the left/top edge of the first pixel (pixel i has its centre at i + 0.5), in source
//! pixels of the whole source image (before any `roi`) and in network pixels of the whole
//! network image (padding included). `x = u * scale_x + offset_x`, `y = v * scale_y +
//! offset_y`; back: `u = (x - offset_x) / scale_x`. Widths and heights scale without the
//! offset. The mapping is computed in f64 from the message's f32 fields.

use crate::error::{Error, Result};
use crate::pipeline::Geometry;

#[cfg(feature = "bench")]
pub mod cases;

/// How a detection's numbers are laid out. Each kind is a run of `arity()` numbers per
/// detection in a flat slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxFormat {
    /// `x0, y0, x1, y1`: two corners.
    Xyxy,
    /// `x, y, w, h`: a point of the box (its top-left corner, or its centre as YOLO
    /// writes it: both map the same way) and its size.
    Xywh,
    /// `x, y`: points (keypoints, polygon vertices).
    Points,
}

impl BoxFormat {
    /// Numbers per detection: 4 for boxes, 2 for points.
    pub fn arity(self) -> usize {
        match self {
            BoxFormat::Xyxy | BoxFormat::Xywh => 4,
            BoxFormat::Points => 2,
        }
    }

    /// Whether number `i` of a detection is a position (mapped with the offset) rather
    /// than a size, and whether it is an x (else a y).
    fn role(self, i: usize) -> (bool, bool) {
        let is_x = i.is_multiple_of(2);
        match self {
            BoxFormat::Xywh => (i < 2, is_x),
            BoxFormat::Xyxy | BoxFormat::Points => (true, is_x),
        }
    }
}

/// A coordinate type the slice functions take: `f32` (what networks output) or `f64`.
pub trait Coordinate: Copy {
    /// The value in f64.
    fn get(self) -> f64;
    /// The value from f64 (f32: rounded to nearest).
    fn put(v: f64) -> Self;
}

impl Coordinate for f32 {
    fn get(self) -> f64 {
        f64::from(self)
    }
    fn put(v: f64) -> Self {
        v as f32
    }
}

impl Coordinate for f64 {
    fn get(self) -> f64 {
        self
    }
    fn put(v: f64) -> Self {
        v
    }
}

/// The source -> network mapping of one image, as a message publishes it: `scale_x`,
/// `scale_y` (network pixels per source pixel), `offset_x`, `offset_y` (network position
/// of the source image's left and top edge).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceMapping {
    scale_x: f64,
    scale_y: f64,
    offset_x: f64,
    offset_y: f64,
}

impl SourceMapping {
    /// From a message's fields (`Tensor`, `BatchItem`). Refuses a scale that is not a
    /// positive finite number: a `BatchItem` with `valid: false` (a stale camera) has
    /// zeros there, and its slot's detections must be ignored.
    pub fn new(scale_x: f32, scale_y: f32, offset_x: f32, offset_y: f32) -> Result<Self> {
        let ok = |s: f32| s.is_finite() && s > 0.0;
        if !ok(scale_x) || !ok(scale_y) || !offset_x.is_finite() || !offset_y.is_finite() {
            return Err(Error::Misuse {
                call: "SourceMapping::new".into(),
                message: format!(
                    "scale ({scale_x}, {scale_y}), offset ({offset_x}, {offset_y}): the scales \
                     must be positive and all four finite; a BatchItem with valid: false (a \
                     stale camera) has no geometry, ignore its slot's detections"
                ),
            });
        }
        Ok(SourceMapping {
            scale_x: f64::from(scale_x),
            scale_y: f64::from(scale_y),
            offset_x: f64::from(offset_x),
            offset_y: f64::from(offset_y),
        })
    }

    /// The mapping the node publishes for `geometry`: its fields rounded to f32, as the
    /// messages carry them (what a consumer has).
    pub fn published(geometry: &Geometry) -> Result<Self> {
        let g = geometry;
        Self::new(g.scale_x as f32, g.scale_y as f32, g.offset_x as f32, g.offset_y as f32)
    }

    /// `(scale_x, scale_y, offset_x, offset_y)`.
    pub fn fields(&self) -> (f64, f64, f64, f64) {
        (self.scale_x, self.scale_y, self.offset_x, self.offset_y)
    }

    /// A network point to the source image: `((x - offset_x) / scale_x, ...)`.
    pub fn point_to_source(&self, x: f64, y: f64) -> (f64, f64) {
        ((x - self.offset_x) / self.scale_x, (y - self.offset_y) / self.scale_y)
    }

    /// A source point to the network image: `(u * scale_x + offset_x, ...)`.
    pub fn point_to_network(&self, u: f64, v: f64) -> (f64, f64) {
        (u * self.scale_x + self.offset_x, v * self.scale_y + self.offset_y)
    }

    /// Number `i` of a detection in `format`, to the source image.
    fn one_to_source(&self, format: BoxFormat, i: usize, v: f64) -> f64 {
        let (position, is_x) = format.role(i);
        let (s, o) =
            if is_x { (self.scale_x, self.offset_x) } else { (self.scale_y, self.offset_y) };
        if position {
            (v - o) / s
        } else {
            v / s
        }
    }

    /// Number `i` of a detection in `format`, to the network image.
    fn one_to_network(&self, format: BoxFormat, i: usize, v: f64) -> f64 {
        let (position, is_x) = format.role(i);
        let (s, o) =
            if is_x { (self.scale_x, self.offset_x) } else { (self.scale_y, self.offset_y) };
        if position {
            v * s + o
        } else {
            v * s
        }
    }
}

impl From<&Geometry> for SourceMapping {
    /// The node's own geometry in f64 (not rounded as published: see
    /// [`SourceMapping::published`]).
    fn from(g: &Geometry) -> Self {
        SourceMapping {
            scale_x: g.scale_x,
            scale_y: g.scale_y,
            offset_x: g.offset_x,
            offset_y: g.offset_y,
        }
    }
}

/// Check that `values` holds whole detections of `format`.
fn check_len(call: &str, len: usize, format: BoxFormat) -> Result<()> {
    if len.is_multiple_of(format.arity()) {
        return Ok(());
    }
    Err(Error::Misuse {
        call: call.into(),
        message: format!(
            "{len} numbers are not whole detections of {format:?} ({} numbers each)",
            format.arity()
        ),
    })
}

/// Map detections in network pixels (`values`: a flat run of `format`'s numbers, e.g.
/// `[x0, y0, x1, y1, x0, y0, ...]`) to source pixels, in place. Fails, changing nothing,
/// when `values` is not a whole number of detections.
pub fn to_source<T: Coordinate>(
    values: &mut [T],
    format: BoxFormat,
    m: &SourceMapping,
) -> Result<()> {
    check_len("boxes::to_source", values.len(), format)?;
    let n = format.arity();
    for (i, v) in values.iter_mut().enumerate() {
        *v = T::put(m.one_to_source(format, i % n, v.get()));
    }
    Ok(())
}

/// Map detections in source pixels to network pixels, in place (the inverse of
/// [`to_source`]).
pub fn to_network<T: Coordinate>(
    values: &mut [T],
    format: BoxFormat,
    m: &SourceMapping,
) -> Result<()> {
    check_len("boxes::to_network", values.len(), format)?;
    let n = format.arity();
    for (i, v) in values.iter_mut().enumerate() {
        *v = T::put(m.one_to_network(format, i % n, v.get()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letterbox_1080p_box_maps_back() {
        // 1920x1080 -> 640x640 letterbox: scale 1/3, offset (0, 140).
        let m = SourceMapping::new(1.0 / 3.0, 1.0 / 3.0, 0.0, 140.0).unwrap();
        let mut b = [10.0f64, 150.0, 640.0, 500.0];
        to_source(&mut b, BoxFormat::Xyxy, &m).unwrap();
        let want = [30.0, 30.0, 1920.0, 1080.0];
        assert!(b.iter().zip(want).all(|(a, w)| (a - w).abs() < 1e-4), "{b:?}");
        let mut c = [320.0f32, 320.0, 64.0, 32.0];
        to_source(&mut c, BoxFormat::Xywh, &m).unwrap();
        assert!((c[0] - 960.0).abs() < 1e-3 && (c[1] - 540.0).abs() < 1e-3, "{c:?}");
        assert!((c[2] - 192.0).abs() < 1e-3 && (c[3] - 96.0).abs() < 1e-3, "{c:?}");
        to_network(&mut c, BoxFormat::Xywh, &m).unwrap();
        assert!((c[0] - 320.0).abs() < 1e-3 && (c[3] - 32.0).abs() < 1e-4, "{c:?}");
    }

    #[test]
    fn refuses_partial_detections_and_stale_items() {
        let m = SourceMapping::new(0.5, 0.5, 0.0, 0.0).unwrap();
        let mut v = [1.0f32, 2.0, 3.0];
        let e = to_source(&mut v, BoxFormat::Xyxy, &m).unwrap_err().to_string();
        assert!(e.contains("3 numbers") && e.contains("4 numbers each"), "{e}");
        assert_eq!(v, [1.0, 2.0, 3.0]);
        let e = SourceMapping::new(0.0, 0.0, 0.0, 0.0).unwrap_err().to_string();
        assert!(e.contains("valid: false"), "{e}");
    }
}
