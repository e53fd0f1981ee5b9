//! The output messages of a processed frame, without ROS: the CDR of a
//! `vision_preproc_msgs/Tensor` laid out around its data (so that a backend writes the
//! tensor in place, between the two parts), and the `FrameTiming` of the frame. The
//! node publishes these bytes as they are (`publish_raw`) and `replay` writes them into
//! bags: one mapping from a frame to its messages, for both.
//!
//! The bytes are what rmw_fastrtps serializes for the typed message (XCDR1
//! little-endian, encapsulation `00 01 00 00`, alignment counted from the byte after the
//! encapsulation, no trailing padding); `test/ros/test_transport.py` checks them against
//! rclpy's serialization of the same message, byte for byte.

use super::Geometry;
use crate::backend::{StageTimes, TensorDesc};
use crate::wire::cdr::Writer;
use crate::wire::msgs::{FrameTiming, Header, OUTPUT_TENSOR};

/// What a `Tensor` message holds besides its data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorFields<'a> {
    /// Stamp and frame_id of the source image.
    pub header: &'a Header,
    /// `Tensor.name` (the `tensor_name` parameter).
    pub name: &'a str,
    /// Shape, layout and dtype (the data is `desc.byte_len()` bytes).
    pub desc: TensorDesc,
    /// Scale, offset and source size.
    pub geometry: &'a Geometry,
    /// The source image's encoding as it arrived (`yuv422_yuy2`, not its alias).
    pub source_encoding: &'a str,
}

/// The CDR of one `Tensor` around its data: the message is `prefix`, then the
/// `data_len` bytes of the tensor, then `suffix`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TensorCdr {
    /// Encapsulation, header, name, layout, dtype, shape and the length of `data`.
    pub prefix: Vec<u8>,
    /// Bytes of `data`, written by the backend between the two parts.
    pub data_len: usize,
    /// `scale_x` ... `source_encoding` (alignment depends on where `data` ends).
    pub suffix: Vec<u8>,
}

impl TensorCdr {
    /// The layout of the message `f` describes.
    pub(crate) fn new(f: &TensorFields<'_>) -> Self {
        let data_len = f.desc.byte_len();
        let mut w = Writer::new();
        f.header.write(&mut w);
        w.string(f.name);
        w.string(f.desc.layout.name());
        w.string(f.desc.dtype.name());
        w.u32_seq(&f.desc.shape());
        w.bytes_len(data_len);
        let mut rest = Writer::continuing(w.body_len() + data_len);
        let g = f.geometry;
        for v in [g.scale_x, g.scale_y, g.offset_x, g.offset_y] {
            rest.f32(v as f32);
        }
        rest.u32(g.source_width);
        rest.u32(g.source_height);
        rest.string(f.source_encoding);
        TensorCdr { prefix: w.finish(), data_len, suffix: rest.finish() }
    }

    /// Bytes of the whole message.
    pub(crate) fn len(&self) -> usize {
        self.prefix.len() + self.data_len + self.suffix.len()
    }

    /// Where the data lies in the message.
    pub(crate) fn data_range(&self) -> std::ops::Range<usize> {
        self.prefix.len()..self.prefix.len() + self.data_len
    }

    /// Write everything but the data into `message` (exactly [`TensorCdr::len`] bytes).
    pub(crate) fn write_around(&self, message: &mut [u8]) {
        let end = self.prefix.len() + self.data_len;
        message[..self.prefix.len()].copy_from_slice(&self.prefix);
        message[end..end + self.suffix.len()].copy_from_slice(&self.suffix);
    }

    /// The whole message with `data` (the tests).
    #[cfg(test)]
    pub(crate) fn with_data(&self, data: &[u8]) -> Vec<u8> {
        debug_assert_eq!(data.len(), self.data_len);
        [self.prefix.as_slice(), data, self.suffix.as_slice()].concat()
    }
}

/// One item of a `vision_preproc_msgs/TensorBatch` (`BatchItem.msg`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchItemFields<'a> {
    /// The input topic of this slot, fully resolved.
    pub topic: &'a str,
    /// The slot holds this camera's frame (false: padded, camera stale or frame rejected).
    pub valid: bool,
    /// The frame was already in an earlier batch.
    pub repeated: bool,
    /// Header of the source image (empty when not valid).
    pub header: &'a Header,
    /// Encoding as it arrived ("" when not valid).
    pub source_encoding: &'a str,
    /// Scale, offset and source size (`None` when not valid: zeros).
    pub geometry: Option<&'a Geometry>,
    /// Publish time minus the header stamp, µs (0 when not valid).
    pub age_us: f32,
}

/// What a `TensorBatch` holds besides its data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorBatchFields<'a> {
    /// Stamp of the newest valid item, empty frame_id.
    pub header: &'a Header,
    /// `tensor_name`.
    pub name: &'a str,
    /// Shape, layout and dtype of ONE item (the data is `items.len()` of them).
    pub desc: TensorDesc,
    /// One per slot, in batch order.
    pub items: &'a [BatchItemFields<'a>],
}

impl TensorCdr {
    /// The layout of the `TensorBatch` message `f` describes: the same three parts as a
    /// `Tensor` (prefix, data written in place, suffix = the items).
    pub(crate) fn batch(f: &TensorBatchFields<'_>) -> Self {
        let n = f.items.len();
        let data_len = n * f.desc.byte_len();
        let mut w = Writer::new();
        f.header.write(&mut w);
        w.string(f.name);
        w.string(f.desc.layout.name());
        w.string(f.desc.dtype.name());
        let mut shape = f.desc.shape();
        shape[0] = n as u32;
        w.u32_seq(&shape);
        w.bytes_len(data_len);
        TensorCdr {
            suffix: batch_items_cdr(w.body_len() + data_len, f.items),
            prefix: w.finish(),
            data_len,
        }
    }
}

/// The `items` sequence of a `TensorBatch`, continuing at `body_offset` (its length
/// depends only on the strings, so ages can be rewritten in place of an earlier suffix).
pub(crate) fn batch_items_cdr(body_offset: usize, items: &[BatchItemFields<'_>]) -> Vec<u8> {
    let mut w = Writer::continuing(body_offset);
    w.u32(items.len() as u32);
    for it in items {
        w.string(it.topic);
        w.u8(u8::from(it.valid));
        w.u8(u8::from(it.repeated));
        it.header.write(&mut w);
        w.string(it.source_encoding);
        let (sw, sh, g) = match it.geometry {
            Some(g) => (
                g.source_width,
                g.source_height,
                [g.scale_x as f32, g.scale_y as f32, g.offset_x as f32, g.offset_y as f32],
            ),
            None => (0, 0, [0.0; 4]),
        };
        w.u32(sw);
        w.u32(sh);
        for v in g {
            w.f32(v);
        }
        w.f32(it.age_us);
    }
    w.finish()
}

/// Where a `TensorRef`'s tensor lies: the shared block (docs/HANDOFF.md).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockFields<'a> {
    /// `pool_id`, `socket_path`.
    pub pool_id: &'a str,
    pub socket_path: &'a str,
    /// `block_index`, `block_size`, `generation`.
    pub index: u32,
    pub size: u64,
    pub generation: u64,
    /// `memory_kind` (`TensorRef.MEMORY_HOST` = 0, `MEMORY_CUDA` = 1).
    pub memory_kind: u8,
    /// `device_id`, `device_uuid` (-1 and zeros for host memory).
    pub device_id: i32,
    pub device_uuid: [u8; 16],
    /// `ipc_event_handle` (empty: the set's work is done).
    pub ipc_event_handle: &'a [u8],
}

/// The CDR of a `vision_preproc_msgs/TensorRef`: the descriptor of the tensors of one
/// set (`items.len()` of them with 2+ inputs, else one) written at offset 0 of `block`.
/// `desc` is one item's; a batch's shape leads with the number of items, a single
/// camera's with 1, as `Tensor` and `TensorBatch`.
pub(crate) fn tensor_ref_cdr(
    header: &Header,
    name: &str,
    desc: TensorDesc,
    batch: bool,
    block: &BlockFields<'_>,
    items: &[BatchItemFields<'_>],
) -> Vec<u8> {
    let mut shape = desc.shape();
    if batch {
        shape[0] = items.len() as u32;
    }
    // Dense C order, in elements.
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * i64::from(shape[i + 1]);
    }
    let bytes = shape.iter().map(|&d| d as u64).product::<u64>() * desc.dtype.size() as u64;
    let mut w = Writer::new();
    header.write(&mut w);
    w.string(name);
    w.string(desc.layout.name());
    w.string(desc.dtype.name());
    w.u32_seq(&shape);
    w.u8(desc.dtype.dlpack_code());
    w.u8((desc.dtype.size() * 8) as u8);
    w.u16(1);
    w.i64_seq(&strides);
    w.u64(0);
    w.u64(bytes);
    w.string(block.pool_id);
    w.string(block.socket_path);
    w.u32(block.index);
    w.u64(block.size);
    w.u64(block.generation);
    w.u8(block.memory_kind);
    w.i32(block.device_id);
    w.u8_array(&block.device_uuid);
    w.bytes(block.ipc_event_handle);
    let items_cdr = batch_items_cdr(w.body_len(), items);
    let mut out = w.finish();
    out.extend_from_slice(&items_cdr);
    out
}

/// The `FrameTiming` of a processed frame: the stage times of the backend, `total_us`
/// (receive -> publish, measured by the caller), `age_us` (0 offline) and the frames
/// replaced since the previous one; `outputs` says the `tensor` message (the node sets
/// what it published).
pub fn frame_timing(
    header: &Header,
    sequence: u64,
    backend: &str,
    times: &StageTimes,
    total_us: f32,
    age_us: f32,
    dropped_since_last: u32,
) -> FrameTiming {
    FrameTiming {
        header: header.clone(),
        sequence,
        backend: backend.to_string(),
        stages_us: [
            times.upload_us,
            times.preprocess_us,
            times.conv_us,
            times.download_us,
            total_us,
            age_us,
        ],
        dropped_since_last,
        outputs: OUTPUT_TENSOR,
        decode_us: times.decode_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DType, Layout};
    use crate::wire::msgs::Tensor;

    fn geometry() -> Geometry {
        let cfg =
            crate::Config { network_image_width: 5, network_image_height: 3, ..Default::default() };
        Geometry::resolve(&cfg, 10, 4).unwrap()
    }

    #[test]
    fn tensor_bytes_decode_to_the_fields_for_every_alignment() {
        let g = geometry();
        // frame_id lengths 0..4 move every later field through all four alignments;
        // float16 with an odd element count makes the data end off a 4-byte boundary.
        for (frame_id, dtype) in [
            ("", DType::Float32),
            ("a", DType::Float16),
            ("ab", DType::Float16),
            ("abc", DType::Float32),
        ] {
            let header = Header { sec: -3, nanosec: 999_999_999, frame_id: frame_id.into() };
            let desc = TensorDesc { channels: 3, height: 3, width: 5, layout: Layout::Nhwc, dtype };
            let f = TensorFields {
                header: &header,
                name: "images",
                desc,
                geometry: &g,
                source_encoding: "yuv422_yuy2",
            };
            let cdr = TensorCdr::new(&f);
            let data: Vec<u8> = (0..desc.byte_len()).map(|i| (i * 7) as u8).collect();
            let msg = cdr.with_data(&data);
            assert_eq!(msg.len(), cdr.len());
            assert_eq!(&msg[cdr.data_range()], &data[..]);
            let t = Tensor::decode(&msg).unwrap();
            assert_eq!(t.header, header);
            assert_eq!((t.name, t.layout, t.dtype), ("images", "NHWC", dtype.name()));
            assert_eq!(t.shape, vec![1, 3, 5, 3]);
            assert_eq!(t.data, &data[..]);
            let want = [g.scale_x as f32, g.scale_y as f32, g.offset_x as f32, g.offset_y as f32];
            assert_eq!(t.geometry, want);
            assert_eq!((t.source_width, t.source_height), (10, 4));
            assert_eq!(t.source_encoding, "yuv422_yuy2");
            // write_around fills exactly the bytes outside the data.
            let mut buf = vec![0xEE; cdr.len()];
            cdr.write_around(&mut buf);
            buf[cdr.data_range()].copy_from_slice(&data);
            assert_eq!(buf, msg);
        }
    }

    #[test]
    fn the_prefix_is_the_cdr_of_the_leading_fields() {
        // Hand-written XCDR1 LE for header {1, 2, "c"}, name "n", layout "NCHW", dtype
        // "float32", shape [1, 1, 1, 1], data length 4: each string is a u32 length
        // (with the NUL) + bytes + NUL, aligned to 4 before each u32.
        let header = Header { sec: 1, nanosec: 2, frame_id: "c".into() };
        let g = geometry();
        let desc = TensorDesc {
            channels: 1,
            height: 1,
            width: 1,
            layout: Layout::Nchw,
            dtype: DType::Float32,
        };
        let f =
            TensorFields { header: &header, name: "n", desc, geometry: &g, source_encoding: "m" };
        let cdr = TensorCdr::new(&f);
        let mut want = vec![0, 1, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, b'c', 0, 0, 0];
        want.extend([2, 0, 0, 0, b'n', 0, 0, 0]);
        want.extend([5, 0, 0, 0, b'N', b'C', b'H', b'W', 0, 0, 0, 0]);
        want.extend([8, 0, 0, 0, b'f', b'l', b'o', b'a', b't', b'3', b'2', 0]);
        want.extend([4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        want.extend([4, 0, 0, 0]);
        assert_eq!(cdr.prefix, want);
        // After 4 data bytes the body is at a multiple of 4: no padding before scale_x;
        // 4 floats, 2 u32, then "m": 2, 0, 0, 0, 'm', 0.
        assert_eq!(cdr.suffix.len(), 16 + 8 + 6);
        assert_eq!(&cdr.suffix[24..], &[2, 0, 0, 0, b'm', 0]);
    }

    #[test]
    fn tensor_batch_decodes_to_its_fields_and_ages_rewrite_in_place() {
        use crate::wire::msgs::TensorBatch;
        let g = geometry();
        let h0 = Header { sec: 7, nanosec: 8, frame_id: "cam0".into() };
        let empty = Header::default();
        let desc = TensorDesc {
            channels: 3,
            height: 3,
            width: 5,
            layout: Layout::Nchw,
            dtype: DType::Float16,
        };
        let items = [
            BatchItemFields {
                topic: "/a/image",
                valid: true,
                repeated: true,
                header: &h0,
                source_encoding: "bgr8",
                geometry: Some(&g),
                age_us: 0.0,
            },
            BatchItemFields {
                topic: "/b/image",
                valid: false,
                repeated: false,
                header: &empty,
                source_encoding: "",
                geometry: None,
                age_us: 0.0,
            },
        ];
        let header = Header { sec: 7, nanosec: 8, frame_id: String::new() };
        let f = TensorBatchFields { header: &header, name: "images", desc, items: &items };
        let cdr = TensorCdr::batch(&f);
        assert_eq!(cdr.data_len, 2 * desc.byte_len());
        let data: Vec<u8> = (0..cdr.data_len).map(|i| (i * 3) as u8).collect();
        let mut msg = cdr.with_data(&data);
        let t = TensorBatch::decode(&msg).unwrap();
        assert_eq!(
            (t.name, t.layout, t.dtype, t.shape.as_slice()),
            ("images", "NCHW", "float16", &[2, 3, 3, 5][..])
        );
        assert_eq!((t.header, t.data), (header.clone(), &data[..]));
        assert_eq!(t.items.len(), 2);
        let a = &t.items[0];
        assert_eq!((a.topic, a.valid, a.repeated, &a.header), ("/a/image", true, true, &h0));
        assert_eq!((a.source_encoding, a.source_width, a.source_height), ("bgr8", 10, 4));
        assert_eq!(
            a.geometry,
            [g.scale_x as f32, g.scale_y as f32, g.offset_x as f32, g.offset_y as f32]
        );
        let b = &t.items[1];
        assert_eq!((b.valid, b.source_width, b.geometry, b.age_us), (false, 0, [0.0; 4], 0.0));
        // New ages: the suffix keeps its length, so it is rewritten in place.
        let mut aged = items;
        aged[0].age_us = 1234.5;
        let body_offset = cdr.prefix.len() - 4 + cdr.data_len;
        let suffix = batch_items_cdr(body_offset, &aged);
        assert_eq!(suffix.len(), cdr.suffix.len());
        let at = cdr.prefix.len() + cdr.data_len;
        msg[at..].copy_from_slice(&suffix);
        assert_eq!(TensorBatch::decode(&msg).unwrap().items[0].age_us, 1234.5);
    }

    #[test]
    fn a_tensor_ref_carries_its_event_handle_after_the_device_uuid() {
        let g = geometry();
        let header = Header { sec: 1, nanosec: 2, frame_id: "cam".into() };
        let desc = TensorDesc {
            channels: 3,
            height: 3,
            width: 5,
            layout: Layout::Nchw,
            dtype: DType::Float32,
        };
        let item = BatchItemFields {
            topic: "/image",
            valid: true,
            repeated: false,
            header: &header,
            source_encoding: "bgr8",
            geometry: Some(&g),
            age_us: 5.0,
        };
        let handle: Vec<u8> = (1..=64).collect();
        let cdr = |h: &[u8]| {
            let block = BlockFields {
                pool_id: "00ab",
                socket_path: "/tmp/x.sock",
                index: 1,
                size: 4096,
                generation: 9,
                memory_kind: 1,
                device_id: 0,
                device_uuid: [0xEE; 16],
                ipc_event_handle: h,
            };
            tensor_ref_cdr(&header, "images", desc, false, &block, std::slice::from_ref(&item))
        };
        let (without, with) = (cdr(&[]), cdr(&handle));
        // The uuid, then the sequence: its u32 length (aligned: the uuid ends on a 4-byte
        // boundary after the i32 device_id) and its bytes; the items follow unchanged
        // (they re-align from a 4-byte boundary, and 64 keeps it).
        let uuid_at = without.windows(16).position(|w| w == [0xEE; 16]).unwrap();
        let seq_at = uuid_at + 16;
        assert_eq!(&without[seq_at..seq_at + 4], &0u32.to_le_bytes());
        assert_eq!(&with[seq_at..seq_at + 4], &64u32.to_le_bytes());
        assert_eq!(&with[seq_at + 4..seq_at + 68], &handle[..]);
        assert_eq!(with.len(), without.len() + 64);
        assert_eq!(&with[..seq_at], &without[..seq_at]);
        assert_eq!(&with[seq_at + 68..], &without[seq_at + 4..]);
    }

    #[test]
    fn frame_timing_maps_the_stages_in_message_order() {
        let times = StageTimes {
            upload_us: 1.0,
            preprocess_us: 2.0,
            conv_us: 3.0,
            download_us: 4.0,
            ..Default::default()
        };
        let h = Header { sec: 5, nanosec: 6, frame_id: "f".into() };
        let t = frame_timing(&h, 9, "cuda", &times, 10.0, 11.0, 12);
        assert_eq!(t.stages_us, [1.0, 2.0, 3.0, 4.0, 10.0, 11.0]);
        assert_eq!((t.sequence, t.backend.as_str(), t.dropped_since_last), (9, "cuda", 12));
        assert_eq!(t.header, h);
    }
}
