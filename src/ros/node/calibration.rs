//! A pipeline input's calibration (`camera_info_urls`): the calibration YAML of ROS
//! camera drivers (camera_calibration_parsers), read into the `CameraInfo` the input
//! publishes.

use r2r::sensor_msgs::msg::{CameraInfo, RegionOfInterest};

/// A matrix of the calibration YAML: `rows`, `cols`, `data`.
#[derive(serde::Deserialize)]
struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

/// The calibration YAML of ROS camera drivers (camera_calibration_parsers).
#[derive(serde::Deserialize)]
struct CalibrationFile {
    image_width: u32,
    image_height: u32,
    camera_matrix: Matrix,
    distortion_model: String,
    distortion_coefficients: Matrix,
    rectification_matrix: Matrix,
    projection_matrix: Matrix,
}

impl Matrix {
    fn exactly<const N: usize>(
        self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<[f64; N], String> {
        if (self.rows, self.cols) != (rows, cols) || self.data.len() != N {
            return Err(format!(
                "`{name}` is {}x{} with {} values; it must be {rows}x{cols}",
                self.rows,
                self.cols,
                self.data.len()
            ));
        }
        let mut out = [0.0; N];
        out.copy_from_slice(&self.data);
        Ok(out)
    }
}

/// Read a calibration file given as a `file://` URL into a `CameraInfo` (no header).
pub(super) fn read_calibration(url: &str) -> Result<CameraInfo, String> {
    let path = url.strip_prefix("file://").ok_or_else(|| {
        "only file:// URLs are read (e.g. file:///home/me/front.yaml)".to_string()
    })?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {path}: {e}; give the path of a calibration YAML"))?;
    parse_calibration(&text).map_err(|e| format!("{path}: {e}"))
}

/// A calibration YAML (as `camera_calibration` writes it) as a `CameraInfo`.
fn parse_calibration(text: &str) -> Result<CameraInfo, String> {
    let f: CalibrationFile = serde_yaml::from_str(text).map_err(|e| {
        format!(
            "not a camera calibration file ({e}); it needs image_width, image_height, \
             camera_matrix, distortion_model, distortion_coefficients, \
             rectification_matrix and projection_matrix, as camera_calibration writes them"
        )
    })?;
    let d = f.distortion_coefficients;
    if d.rows * d.cols != d.data.len() {
        return Err(format!(
            "`distortion_coefficients` is {}x{} but has {} values",
            d.rows,
            d.cols,
            d.data.len()
        ));
    }
    Ok(CameraInfo {
        header: Default::default(),
        height: f.image_height,
        width: f.image_width,
        distortion_model: f.distortion_model,
        d: d.data,
        k: f.camera_matrix.exactly::<9>("camera_matrix", 3, 3)?.to_vec(),
        r: f.rectification_matrix.exactly::<9>("rectification_matrix", 3, 3)?.to_vec(),
        p: f.projection_matrix.exactly::<12>("projection_matrix", 3, 4)?.to_vec(),
        binning_x: 0,
        binning_y: 0,
        roi: RegionOfInterest::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A calibration as `camera_calibration` writes it (test/data/README.md).
    const CALIBRATION: &str = include_str!("../../../test/data/calibration_1080p.yaml");

    #[test]
    fn a_calibration_file_as_camera_calibration_writes_it() {
        let info = parse_calibration(CALIBRATION).unwrap();
        assert_eq!((info.width, info.height), (1920, 1080));
        assert_eq!(info.k[2], 959.5);
        assert_eq!(info.p[5], 1401.0);
        assert_eq!(info.d, vec![-0.12, 0.03, 0.0, 0.0, 0.0]);
        assert_eq!(info.distortion_model, "plumb_bob");
        let dir = std::env::temp_dir().join(format!("vp_cal_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("front.yaml");
        std::fs::write(&path, CALIBRATION).unwrap();
        let read = read_calibration(&format!("file://{}", path.display())).unwrap();
        assert_eq!(read, info);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_calibration_says_what_is_wrong() {
        let e = parse_calibration("image_width: 640\n").unwrap_err();
        assert!(e.contains("camera_matrix") && e.contains("camera_calibration"), "{e}");
        let short = CALIBRATION.replace("data: [1400.0, 0.0, 959.5, 0.0, 0.0", "data: [0.0");
        let e = parse_calibration(&short).unwrap_err();
        assert!(e.contains("projection_matrix") && e.contains("3x4"), "{e}");
        let e = read_calibration("file:///nonexistent/cal.yaml").unwrap_err();
        assert!(e.contains("cannot read /nonexistent/cal.yaml"), "{e}");
        assert!(read_calibration("package://cam/cal.yaml").unwrap_err().contains("file://"));
    }
}
