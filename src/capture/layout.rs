//! A GStreamer buffer's plane layout against an `ImageView`'s (one step for every row, the
//! NV12/NV21 chroma plane right after `height` rows): borrow the buffer in place when they
//! agree, else copy it once into tight rows. Pure, unit-tested on made-up layouts.

use crate::image::Encoding;

/// Where a buffer's planes are: the stride and offset of each (1 plane, or 2 for
/// NV12/NV21), in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planes {
    stride: Vec<usize>,
    offset: Vec<usize>,
}

impl Planes {
    /// From `GstVideoInfo` or `GstVideoMeta` (strides and offsets per plane).
    pub(crate) fn new(stride: &[i32], offset: &[usize]) -> Result<Planes, String> {
        if stride.is_empty() || stride.len() != offset.len() {
            return Err(format!("{} strides for {} plane offsets", stride.len(), offset.len()));
        }
        let stride = stride
            .iter()
            .map(|&s| {
                usize::try_from(s).map_err(|_| {
                    format!("negative row stride {s} (a bottom-up image): flip it with `videoflip method=vertical-flip`")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Planes { stride, offset: offset.to_vec() })
    }

    /// A Bayer buffer (no `GstVideoInfo` for `video/x-bayer`): one plane whose step is the
    /// buffer's size over the height (`rgb2bayer` and `bayer2rgb` pad rows to 4 bytes).
    pub(crate) fn bayer(width: u32, height: u32, size: usize) -> Result<Planes, String> {
        let h = height as usize;
        if h == 0 || !size.is_multiple_of(h) || size / h < width as usize {
            return Err(format!(
                "a Bayer buffer of {size} bytes is not {height} rows of at least {width} bytes"
            ));
        }
        Ok(Planes { stride: vec![size / h], offset: vec![0] })
    }
}

/// How a frame gets its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// In place: `len` bytes of the buffer from `start`, rows `step` bytes apart.
    Borrow { start: usize, len: usize, step: usize },
    /// One copy into tight rows of `step` bytes (the layouts differ).
    Copy { step: usize },
}

/// The bytes of a row of `encoding` at `width` (of both planes for NV12/NV21) and the
/// rows of each plane.
fn rows(encoding: Encoding, width: u32, height: u32) -> (usize, Vec<usize>) {
    let row = width as usize * encoding.bytes_per_pixel() as usize;
    let h = height as usize;
    match encoding {
        Encoding::Nv12 | Encoding::Nv21 => (row, vec![h, h / 2]),
        _ => (row, vec![h]),
    }
}

/// Borrow when every plane has the same stride (at least a row) and each plane starts
/// right after the previous one's rows, within a buffer of `size` bytes; else copy.
pub(crate) fn plan(
    encoding: Encoding,
    width: u32,
    height: u32,
    planes: &Planes,
    size: usize,
) -> Result<Plan, String> {
    let (row, plane_rows) = rows(encoding, width, height);
    if planes.stride.len() != plane_rows.len() {
        return Err(format!(
            "{encoding} has {} planes, the buffer's layout {}",
            plane_rows.len(),
            planes.stride.len()
        ));
    }
    for (p, &n) in plane_rows.iter().enumerate() {
        let (stride, offset) = (planes.stride[p], planes.offset[p]);
        if stride < row {
            return Err(format!("plane {p}: row stride {stride} < {row} bytes of a row"));
        }
        let end = n.checked_sub(1).map(|last| offset + stride * last + row).unwrap_or(offset);
        if end > size {
            return Err(format!(
                "plane {p} ends at byte {end} (offset {offset}, stride {stride}, {n} rows) of a buffer of {size} bytes"
            ));
        }
    }
    let step = planes.stride[0];
    let start = planes.offset[0];
    let mut next = start;
    for (p, &n) in plane_rows.iter().enumerate() {
        if planes.stride[p] != step || planes.offset[p] != next {
            return Ok(Plan::Copy { step: row });
        }
        next += step * n;
    }
    if next > size {
        // The last row's padding is not in the buffer.
        return Ok(Plan::Copy { step: row });
    }
    Ok(Plan::Borrow { start, len: next - start, step })
}

/// The planes' rows copied into tight rows (what `Plan::Copy` asks for); `data` was
/// checked by [`plan`].
pub(crate) fn copy_tight(
    encoding: Encoding,
    width: u32,
    height: u32,
    planes: &Planes,
    data: &[u8],
) -> Vec<u8> {
    let (row, plane_rows) = rows(encoding, width, height);
    let mut out = Vec::with_capacity(row * plane_rows.iter().sum::<usize>());
    for (p, &n) in plane_rows.iter().enumerate() {
        for r in 0..n {
            let from = planes.offset[p] + planes.stride[p] * r;
            out.extend_from_slice(&data[from..from + row]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layouts_are_borrowed_with_their_padded_step() {
        // GStreamer's RGB at width 321: rows padded to 4 bytes, 963 -> 964.
        let rgb = Planes::new(&[964], &[0]).unwrap();
        assert_eq!(
            plan(Encoding::Rgb8, 321, 5, &rgb, 964 * 5).unwrap(),
            Plan::Borrow { start: 0, len: 964 * 5, step: 964 }
        );
        // NV12 at 322x4: both strides 324, chroma at 324 * 4.
        let nv12 = Planes::new(&[324, 324], &[0, 324 * 4]).unwrap();
        assert_eq!(
            plan(Encoding::Nv12, 322, 4, &nv12, 324 * 6).unwrap(),
            Plan::Borrow { start: 0, len: 324 * 6, step: 324 }
        );
        // A larger buffer: the view is its first rows.
        assert_eq!(
            plan(Encoding::Mono8, 8, 2, &Planes::new(&[8], &[0]).unwrap(), 100).unwrap(),
            Plan::Borrow { start: 0, len: 16, step: 8 }
        );
    }

    #[test]
    fn other_layouts_are_copied_into_tight_rows() {
        // Chroma plane after a gap of one row.
        let gap = Planes::new(&[4, 4], &[0, 4 * 3]).unwrap();
        let data: Vec<u8> = (0..20).collect();
        assert_eq!(plan(Encoding::Nv12, 4, 2, &gap, data.len()).unwrap(), Plan::Copy { step: 4 });
        assert_eq!(
            copy_tight(Encoding::Nv12, 4, 2, &gap, &data),
            [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
        );
        // Different strides per plane.
        let strides = Planes::new(&[6, 8], &[0, 12]).unwrap();
        assert_eq!(plan(Encoding::Nv21, 4, 2, &strides, 20).unwrap(), Plan::Copy { step: 4 });
        assert_eq!(
            copy_tight(Encoding::Nv21, 4, 2, &strides, &data),
            [0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15]
        );
        // The last row's padding missing from the buffer.
        let short = Planes::new(&[8], &[0]).unwrap();
        assert_eq!(plan(Encoding::Rgb8, 2, 2, &short, 14).unwrap(), Plan::Copy { step: 6 });
        assert_eq!(
            copy_tight(Encoding::Rgb8, 2, 2, &short, &data[..14]),
            [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]
        );
    }

    #[test]
    fn impossible_layouts_are_refused_with_the_numbers() {
        let e = plan(Encoding::Rgb8, 4, 2, &Planes::new(&[12], &[0]).unwrap(), 20).unwrap_err();
        assert_eq!(
            e,
            "plane 0 ends at byte 24 (offset 0, stride 12, 2 rows) of a buffer of 20 bytes"
        );
        let e = plan(Encoding::Rgb8, 4, 2, &Planes::new(&[10], &[0]).unwrap(), 40).unwrap_err();
        assert_eq!(e, "plane 0: row stride 10 < 12 bytes of a row");
        assert!(Planes::new(&[-8], &[0]).unwrap_err().contains("videoflip"));
        assert!(plan(Encoding::Nv12, 4, 2, &Planes::new(&[4], &[0]).unwrap(), 12).is_err());
        assert_eq!(Planes::bayer(5, 2, 16).unwrap(), Planes { stride: vec![8], offset: vec![0] });
        assert!(Planes::bayer(5, 2, 9).is_err());
    }
}
