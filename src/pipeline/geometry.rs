//! Geometry, pure and in one place: which source region is resampled, where it lands in
//! the network image, the published `network = source * scale + offset` mapping and its
//! inverse, the per-axis sampling tables both backends use, and `CameraInfo` scaling.
//!
//! Coordinates are continuous with 0.0 at the left/top edge of the first pixel (pixel i
//! has its centre at i + 0.5), which is OpenCV's resize convention. Everything is
//! resolved once per (configuration, source size) by [`Geometry::resolve`]; nothing
//! downstream recomputes a scale from raw parameters.

use crate::backend::AxisMap;
use crate::config::{Config, Interpolation, LetterboxAnchor, ResizeMode};
use crate::error::ImageError;

/// An axis-aligned rectangle in whole pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width in pixels (>= 1).
    pub w: u32,
    /// Height in pixels (>= 1).
    pub h: u32,
}

/// The resolved geometry of one frame size.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    /// Source image width.
    pub source_width: u32,
    /// Source image height.
    pub source_height: u32,
    /// Network image width.
    pub network_width: u32,
    /// Network image height.
    pub network_height: u32,
    /// Source pixels that are resampled: the `roi` (or the whole image), narrowed by
    /// `center_crop` to the network's aspect ratio.
    pub region: Rect,
    /// Where the resampled region lands in the network image. Outside it (letterbox
    /// only) the network image holds `pad_value`.
    pub content: Rect,
    /// Network pixels per source pixel, x.
    pub scale_x: f64,
    /// Network pixels per source pixel, y.
    pub scale_y: f64,
    /// Network x of the source image's left edge.
    pub offset_x: f64,
    /// Network y of the source image's top edge.
    pub offset_y: f64,
}

impl Geometry {
    /// Resolve the geometry for a `source_width` x `source_height` frame. Fails only when
    /// the configured `roi` does not lie inside the frame.
    pub fn resolve(
        cfg: &Config,
        source_width: u32,
        source_height: u32,
    ) -> Result<Self, ImageError> {
        let roi = if cfg.roi.is_empty() {
            Rect { x: 0, y: 0, w: source_width, h: source_height }
        } else {
            // Config::validate guarantees 4 values, x, y >= 0, w, h >= 1, all < 2^32.
            let [x, y, w, h] = [cfg.roi[0], cfg.roi[1], cfg.roi[2], cfg.roi[3]];
            if x + w > i64::from(source_width) || y + h > i64::from(source_height) {
                let c = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
                return Err(ImageError::RoiOutside {
                    x: c(x),
                    y: c(y),
                    w: c(w),
                    h: c(h),
                    width: source_width,
                    height: source_height,
                });
            }
            Rect { x: x as u32, y: y as u32, w: w as u32, h: h as u32 }
        };
        let (nw, nh) = (cfg.network_image_width, cfg.network_image_height);
        let full = Rect { x: 0, y: 0, w: nw, h: nh };
        let (region, content) = match cfg.resize_mode {
            ResizeMode::Stretch => (roi, full),
            ResizeMode::Letterbox => {
                let s = (f64::from(nw) / f64::from(roi.w)).min(f64::from(nh) / f64::from(roi.h));
                let cw = scaled_len(roi.w, s, nw);
                let ch = scaled_len(roi.h, s, nh);
                let (cx, cy) = match cfg.letterbox_anchor {
                    LetterboxAnchor::Center => ((nw - cw) / 2, (nh - ch) / 2),
                    LetterboxAnchor::TopLeft => (0, 0),
                };
                (roi, Rect { x: cx, y: cy, w: cw, h: ch })
            }
            ResizeMode::CenterCrop => {
                let s = (f64::from(nw) / f64::from(roi.w)).max(f64::from(nh) / f64::from(roi.h));
                let rw = scaled_len(nw, 1.0 / s, roi.w);
                let rh = scaled_len(nh, 1.0 / s, roi.h);
                let region =
                    Rect { x: roi.x + (roi.w - rw) / 2, y: roi.y + (roi.h - rh) / 2, w: rw, h: rh };
                (region, full)
            }
        };
        let scale_x = f64::from(content.w) / f64::from(region.w);
        let scale_y = f64::from(content.h) / f64::from(region.h);
        Ok(Geometry {
            source_width,
            source_height,
            network_width: nw,
            network_height: nh,
            region,
            content,
            scale_x,
            scale_y,
            offset_x: f64::from(content.x) - f64::from(region.x) * scale_x,
            offset_y: f64::from(content.y) - f64::from(region.y) * scale_y,
        })
    }

    /// Map a source point to the network image.
    pub fn source_to_network(&self, u: f64, v: f64) -> (f64, f64) {
        (u * self.scale_x + self.offset_x, v * self.scale_y + self.offset_y)
    }

    /// Map a network point (e.g. a detection) back to the source image.
    pub fn network_to_source(&self, x: f64, y: f64) -> (f64, f64) {
        ((x - self.offset_x) / self.scale_x, (y - self.offset_y) / self.scale_y)
    }

    /// Sampling table for the x axis (see [`AxisMap`]).
    pub fn x_map(&self, interpolation: Interpolation) -> AxisMap {
        AxisMap::new(self.region.x, self.region.w, self.content.w, interpolation)
    }

    /// Sampling table for the y axis (see [`AxisMap`]).
    pub fn y_map(&self, interpolation: Interpolation) -> AxisMap {
        AxisMap::new(self.region.y, self.region.h, self.content.h, interpolation)
    }

    /// Scale a camera's intrinsics to the network image: `K` (3x3) and `P` (3x4),
    /// row-major, as in `sensor_msgs/CameraInfo`. Like image_proc's resize (fx, cx, fy,
    /// cy, Tx scaled) and crop (principal point shifted), plus the half-pixel term that
    /// keeps camera_info consistent with the published `scale`/`offset`: ROS puts pixel
    /// centres at integers, so `cx' = cx * s + offset + (s - 1) / 2`.
    pub(crate) fn scale_intrinsics(&self, k: &mut [f64; 9], p: &mut [f64; 12]) {
        let (sx, sy) = (self.scale_x, self.scale_y);
        let shift_x = self.offset_x + 0.5 * (sx - 1.0);
        let shift_y = self.offset_y + 0.5 * (sy - 1.0);
        // K = [fx 0 cx; 0 fy cy; 0 0 1]; P = [fx' 0 cx' Tx; 0 fy' cy' Ty; 0 0 1 0].
        // x' = sx * x + shift_x applied to rows 0 and 1 of a homogeneous projection:
        // row0' = sx * row0 + shift_x * row2 (row2 is [0 0 1 (0)]).
        k[0] *= sx;
        k[1] *= sx;
        k[2] = k[2] * sx + shift_x * k[8];
        k[4] *= sy;
        k[5] = k[5] * sy + shift_y * k[8];
        for i in 0..4 {
            p[i] = p[i] * sx + shift_x * p[8 + i];
            p[4 + i] = p[4 + i] * sy + shift_y * p[8 + i];
        }
    }
}

/// `round(len * s)` kept within `1..=max` (the long side of a letterbox is exactly `max`).
fn scaled_len(len: u32, s: f64, max: u32) -> u32 {
    ((f64::from(len) * s).round() as u32).clamp(1, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(w: u32, h: u32, mode: ResizeMode) -> Config {
        Config {
            network_image_width: w,
            network_image_height: h,
            resize_mode: mode,
            ..Config::default()
        }
    }

    #[test]
    fn letterbox_1080p_to_640_square() {
        // s = min(640/1920, 640/1080) = 1/3; content 640 x round(1080/3 = 360); pad
        // (640 - 360) / 2 = 140 rows on top.
        let g = Geometry::resolve(&cfg(640, 640, ResizeMode::Letterbox), 1920, 1080).unwrap();
        assert_eq!(g.content, Rect { x: 0, y: 140, w: 640, h: 360 });
        assert_eq!(g.region, Rect { x: 0, y: 0, w: 1920, h: 1080 });
        assert_eq!((g.scale_x, g.scale_y), (1.0 / 3.0, 1.0 / 3.0));
        assert_eq!((g.offset_x, g.offset_y), (0.0, 140.0));
        // The bottom-right corner of the source lands on the content's corner.
        assert_eq!(g.source_to_network(1920.0, 1080.0), (640.0, 500.0));
    }

    #[test]
    fn letterbox_top_left_and_odd_padding() {
        // 100x50 -> 64x64: s = 0.64, content 64 x 32; centre pad (64-32)/2 = 16.
        let mut c = cfg(64, 64, ResizeMode::Letterbox);
        let g = Geometry::resolve(&c, 100, 50).unwrap();
        assert_eq!(g.content, Rect { x: 0, y: 16, w: 64, h: 32 });
        // 101x50 -> 64x63: s = min(0.6337, 1.26) ; content 64 x round(31.68) = 32;
        // pad (63 - 32) / 2 = 15 on top, 16 below.
        c.network_image_height = 63;
        let g = Geometry::resolve(&c, 101, 50).unwrap();
        assert_eq!(g.content, Rect { x: 0, y: 15, w: 64, h: 32 });
        c.letterbox_anchor = LetterboxAnchor::TopLeft;
        let g = Geometry::resolve(&c, 101, 50).unwrap();
        assert_eq!(g.content, Rect { x: 0, y: 0, w: 64, h: 32 });
    }

    #[test]
    fn center_crop_takes_the_middle() {
        // 1920x1080 -> 640x640: s = max(1/3, 0.5926) = 0.5926; region 1080 x 1080 starting
        // at (1920 - 1080) / 2 = 420.
        let g = Geometry::resolve(&cfg(640, 640, ResizeMode::CenterCrop), 1920, 1080).unwrap();
        assert_eq!(g.region, Rect { x: 420, y: 0, w: 1080, h: 1080 });
        assert_eq!(g.content, Rect { x: 0, y: 0, w: 640, h: 640 });
        let (x, _) = g.source_to_network(420.0, 0.0);
        assert!(x.abs() < 1e-12);
    }

    #[test]
    fn roi_applies_first_and_round_trips() {
        let mut c = cfg(320, 240, ResizeMode::Stretch);
        c.roi = vec![100, 50, 640, 480];
        let g = Geometry::resolve(&c, 1280, 720).unwrap();
        assert_eq!(g.region, Rect { x: 100, y: 50, w: 640, h: 480 });
        assert_eq!((g.scale_x, g.offset_x, g.offset_y), (0.5, -50.0, -25.0));
        let (u, v) = g.network_to_source(17.25, 33.5);
        let (x, y) = g.source_to_network(u, v);
        assert!((x - 17.25).abs() < 1e-12 && (y - 33.5).abs() < 1e-12);
        c.roi = vec![1000, 0, 281, 10];
        let e = Geometry::resolve(&c, 1280, 720).unwrap_err();
        assert!(matches!(e, ImageError::RoiOutside { x: 1000, w: 281, width: 1280, .. }), "{e:?}");
    }

    #[test]
    fn axis_map_matches_opencv_formula() {
        // 4 -> 8 (upscale 2x): f = (d + 0.5) * 0.5 - 0.5 = -0.25, 0.25, 0.75, 1.25, ...
        // d=0 clamps to s=0, f=0; d=7: f = 3.25 -> s=3 = last -> f=0.
        let m = AxisMap::new(10, 4, 8, Interpolation::Linear);
        assert_eq!(m.i0, vec![10, 10, 10, 11, 11, 12, 12, 13]);
        assert_eq!(m.i1, vec![11, 11, 11, 12, 12, 13, 13, 13]);
        assert_eq!(m.w1, vec![0.0, 0.25, 0.75, 0.25, 0.75, 0.25, 0.75, 0.0]);
        // Nearest 5 -> 2: floor(d * 2.5) = 0, 2.
        let m = AxisMap::new(0, 5, 2, Interpolation::Nearest);
        assert_eq!((m.i0, m.w1), (vec![0, 2], vec![0.0, 0.0]));
    }

    #[test]
    fn camera_info_follows_the_tensor_geometry() {
        // A pinhole camera: the pixel centre under a 3-D point must map like the geometry.
        let g = Geometry::resolve(&cfg(640, 640, ResizeMode::Letterbox), 1920, 1080).unwrap();
        let mut k = [1000.0, 0.0, 960.0, 0.0, 1000.0, 540.0, 0.0, 0.0, 1.0];
        let mut p = [1000.0, 0.0, 960.0, 0.0, 0.0, 1000.0, 540.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        let (xw, yw, zw) = (0.3, -0.2, 2.0);
        // Source pixel (ROS convention: centre of pixel i at i), then ours (+0.5).
        let (u, v) = (1000.0 * xw / zw + 960.0, 1000.0 * yw / zw + 540.0);
        let (x, y) = g.source_to_network(u + 0.5, v + 0.5);
        g.scale_intrinsics(&mut k, &mut p);
        let (u2, v2) = (k[0] * xw / zw + k[2], k[4] * yw / zw + k[5]);
        assert!((u2 + 0.5 - x).abs() < 1e-9 && (v2 + 0.5 - y).abs() < 1e-9, "{u2} {v2} vs {x} {y}");
        assert_eq!((p[0], p[2], p[5], p[6]), (k[0], k[2], k[4], k[5]));
    }
}
