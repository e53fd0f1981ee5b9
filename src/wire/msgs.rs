//! The messages of the live path and of bags, without ROS: decoded from and encoded to
//! CDR with `super::cdr`, their ROS type names, and their `ros2msg` definitions for
//! MCAP schemas.

use super::cdr::{CdrError, Reader, Writer};

/// `std_msgs/Header`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// `stamp.sec`.
    pub sec: i32,
    /// `stamp.nanosec`.
    pub nanosec: u32,
    /// `frame_id`.
    pub frame_id: String,
}

impl Header {
    /// The stamp in ns since the epoch (negative before it).
    pub fn stamp_ns(&self) -> i64 {
        i64::from(self.sec) * 1_000_000_000 + i64::from(self.nanosec)
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, CdrError> {
        Ok(Header {
            sec: r.i32("header.stamp.sec")?,
            nanosec: r.u32("header.stamp.nanosec")?,
            frame_id: r.string("header.frame_id")?,
        })
    }
    /// Write as the first field of a message.
    pub fn write(&self, w: &mut Writer) {
        w.i32(self.sec);
        w.u32(self.nanosec);
        w.string(&self.frame_id);
    }
}

/// `sensor_msgs/Image`, with `data` borrowed from the bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image<'a> {
    /// `header`.
    pub header: Header,
    /// `height`.
    pub height: u32,
    /// `width`.
    pub width: u32,
    /// `encoding`.
    pub encoding: String,
    /// `is_bigendian`.
    pub is_bigendian: u8,
    /// `step`.
    pub step: u32,
    /// `data`.
    pub data: &'a [u8],
}

impl<'a> Image<'a> {
    /// A little-endian image of `height` rows of `data.len() / height` bytes each (the
    /// fixture of the tests and the fuzz seeds).
    pub fn packed(header: Header, encoding: &str, width: u32, height: u32, data: &'a [u8]) -> Self {
        let step = u32::try_from(data.len() / height.max(1) as usize).unwrap_or(u32::MAX);
        Image { header, height, width, encoding: encoding.into(), is_bigendian: 0, step, data }
    }

    /// Decode a CDR `sensor_msgs/Image`.
    pub fn decode(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        Ok(Image {
            header: Header::read(&mut r)?,
            height: r.u32("height")?,
            width: r.u32("width")?,
            encoding: r.string("encoding")?,
            is_bigendian: r.u8("is_bigendian")?,
            step: r.u32("step")?,
            data: r.bytes("data")?,
        })
    }

    /// Encode as CDR (used by tests and the sample-bag tools).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.header.write(&mut w);
        w.u32(self.height);
        w.u32(self.width);
        w.string(&self.encoding);
        w.u8(self.is_bigendian);
        w.u32(self.step);
        w.bytes(self.data);
        w.finish()
    }
}

/// `sensor_msgs/CompressedImage` (what image_transport's `compressed` publisher and
/// MJPEG camera drivers send: JPEG or PNG), with `data` borrowed from the bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressedImage<'a> {
    /// `header`.
    pub header: Header,
    /// `format` (`jpeg`, `bgr8; jpeg compressed bgr8`, `16UC1; png compressed`, ...).
    pub format: String,
    /// `data`: the compressed payload.
    pub data: &'a [u8],
}

impl<'a> CompressedImage<'a> {
    /// Decode a CDR `sensor_msgs/CompressedImage`.
    pub fn decode(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        Ok(CompressedImage {
            header: Header::read(&mut r)?,
            format: r.string("format")?,
            data: r.bytes("data")?,
        })
    }

    /// Encode as CDR (used by tests).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.header.write(&mut w);
        w.string(&self.format);
        w.bytes(self.data);
        w.finish()
    }
}

/// A video packet of a bag: `foxglove_msgs/CompressedVideo` or
/// `ffmpeg_image_transport_msgs/FFMPEGPacket` (whose `width`, `height`, `flags` and
/// `is_bigendian` are read and not used: the packet's own bytes say what it is), with
/// `data` borrowed from the bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoPacket<'a> {
    /// FFMPEGPacket's `header`; CompressedVideo's `timestamp` and `frame_id`.
    pub header: Header,
    /// CompressedVideo's `format` (`h264`, ...), FFMPEGPacket's `encoding`
    /// (`hevc;yuv420p;bgr8;bgr8`, ...).
    pub format: String,
    /// FFMPEGPacket's `pts` (`None` for CompressedVideo).
    pub pts: Option<u64>,
    /// `data`: the packet.
    pub data: &'a [u8],
}

impl<'a> VideoPacket<'a> {
    /// Decode a CDR `foxglove_msgs/CompressedVideo`.
    pub fn decode_foxglove(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        let (sec, nanosec) = (r.i32("timestamp.sec")?, r.u32("timestamp.nanosec")?);
        let frame_id = r.string("frame_id")?;
        let data = r.bytes("data")?;
        let format = r.string("format")?;
        Ok(VideoPacket { header: Header { sec, nanosec, frame_id }, format, pts: None, data })
    }

    /// Decode a CDR `ffmpeg_image_transport_msgs/FFMPEGPacket`.
    pub fn decode_ffmpeg(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        let header = Header::read(&mut r)?;
        let (_width, _height) = (r.i32("width")?, r.i32("height")?);
        let format = r.string("encoding")?;
        let pts = r.u64("pts")?;
        let (_flags, _big_endian) = (r.u8("flags")?, r.u8("is_bigendian")?);
        let data = r.bytes("data")?;
        Ok(VideoPacket { header, format, pts: Some(pts), data })
    }
}

/// `sensor_msgs/CameraInfo` (the fields the node and the CLI use are all kept).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CameraInfo {
    /// `header`.
    pub header: Header,
    /// `height`.
    pub height: u32,
    /// `width`.
    pub width: u32,
    /// `distortion_model`.
    pub distortion_model: String,
    /// `d`.
    pub d: Vec<f64>,
    /// `k`.
    pub k: [f64; 9],
    /// `r`.
    pub r: [f64; 9],
    /// `p`.
    pub p: [f64; 12],
}

impl CameraInfo {
    /// Decode a CDR `sensor_msgs/CameraInfo` (binning and roi are read and ignored).
    pub(crate) fn decode(cdr: &[u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        Ok(CameraInfo {
            header: Header::read(&mut r)?,
            height: r.u32("height")?,
            width: r.u32("width")?,
            distortion_model: r.string("distortion_model")?,
            d: r.f64_seq("d")?,
            k: r.f64_array("k")?,
            r: r.f64_array("r")?,
            p: r.f64_array("p")?,
        })
    }
}

/// The fields `Tensor` and `TensorBatch` begin with: header, name, layout, dtype, shape,
/// data.
type TensorHead<'a> = (Header, &'a str, &'a str, &'a str, Vec<u32>, &'a [u8]);

fn tensor_head<'a>(r: &mut Reader<'a>) -> Result<TensorHead<'a>, CdrError> {
    let header = Header::read(r)?;
    Ok((
        header,
        r.str("name")?,
        r.str("layout")?,
        r.str("dtype")?,
        r.u32_seq("shape")?,
        r.bytes("data")?,
    ))
}

/// `vision_preproc_msgs/Tensor`, decoded with `data` borrowed from the message. (The
/// node and `replay` write it with `crate::pipeline::TensorCdr`.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tensor<'a> {
    /// `header`.
    pub header: Header,
    /// `name`.
    pub name: &'a str,
    /// `layout`.
    pub layout: &'a str,
    /// `dtype`.
    pub dtype: &'a str,
    /// `shape`.
    pub shape: Vec<u32>,
    /// `data`.
    pub data: &'a [u8],
    /// `scale_x`, `scale_y`, `offset_x`, `offset_y`.
    pub geometry: [f32; 4],
    /// `source_width`.
    pub source_width: u32,
    /// `source_height`.
    pub source_height: u32,
    /// `source_encoding`.
    pub source_encoding: &'a str,
}

impl<'a> Tensor<'a> {
    /// Decode a CDR `vision_preproc_msgs/Tensor`.
    pub fn decode(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        let (header, name, layout, dtype, shape, data) = tensor_head(&mut r)?;
        let mut geometry = [0f32; 4];
        for (g, field) in geometry.iter_mut().zip(["scale_x", "scale_y", "offset_x", "offset_y"]) {
            *g = r.f32(field)?;
        }
        Ok(Tensor {
            header,
            name,
            layout,
            dtype,
            shape,
            data,
            geometry,
            source_width: r.u32("source_width")?,
            source_height: r.u32("source_height")?,
            source_encoding: r.str("source_encoding")?,
        })
    }
}

/// One `vision_preproc_msgs/BatchItem`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchItem<'a> {
    /// `topic`.
    pub topic: &'a str,
    /// `valid`.
    pub valid: bool,
    /// `repeated`.
    pub repeated: bool,
    /// `header`.
    pub header: Header,
    /// `source_encoding`.
    pub source_encoding: &'a str,
    /// `source_width`.
    pub source_width: u32,
    /// `source_height`.
    pub source_height: u32,
    /// `scale_x`, `scale_y`, `offset_x`, `offset_y`.
    pub geometry: [f32; 4],
    /// `age_us`.
    pub age_us: f32,
}

/// `vision_preproc_msgs/TensorBatch`, decoded with `data` borrowed from the message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TensorBatch<'a> {
    /// `header`.
    pub header: Header,
    /// `name`.
    pub name: &'a str,
    /// `layout`.
    pub layout: &'a str,
    /// `dtype`.
    pub dtype: &'a str,
    /// `shape`.
    pub shape: Vec<u32>,
    /// `data`.
    pub data: &'a [u8],
    /// `items`.
    pub items: Vec<BatchItem<'a>>,
}

impl<'a> TensorBatch<'a> {
    /// Decode a CDR `vision_preproc_msgs/TensorBatch`.
    pub fn decode(cdr: &'a [u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        let (header, name, layout, dtype, shape, data) = tensor_head(&mut r)?;
        let n = r.u32("items")?;
        let mut items = Vec::new();
        for _ in 0..n {
            let topic = r.str("items.topic")?;
            let valid = r.u8("items.valid")? != 0;
            let repeated = r.u8("items.repeated")? != 0;
            let header = Header::read(&mut r)?;
            let source_encoding = r.str("items.source_encoding")?;
            let source_width = r.u32("items.source_width")?;
            let source_height = r.u32("items.source_height")?;
            let mut geometry = [0f32; 4];
            for g in geometry.iter_mut() {
                *g = r.f32("items.geometry")?;
            }
            let age_us = r.f32("items.age_us")?;
            items.push(BatchItem {
                topic,
                valid,
                repeated,
                header,
                source_encoding,
                source_width,
                source_height,
                geometry,
                age_us,
            });
        }
        Ok(TensorBatch { header, name, layout, dtype, shape, data, items })
    }
}

/// The header stamp (ns since the epoch) of any message that starts with a
/// `std_msgs/Header` (Image, Tensor, FrameTiming, ...), without decoding the rest.
pub fn header_stamp_ns(cdr: &[u8]) -> Result<i64, CdrError> {
    let mut r = Reader::new(cdr)?;
    Ok(Header::read(&mut r)?.stamp_ns())
}

/// `vision_preproc_msgs/FrameTiming`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameTiming {
    /// `header`.
    pub header: Header,
    /// `sequence`.
    pub sequence: u64,
    /// `backend`.
    pub backend: String,
    /// `upload_us`, `preprocess_us`, `conv_us`, `download_us`, `total_us`, `age_us`.
    pub stages_us: [f32; 6],
    /// `dropped_since_last`.
    pub dropped_since_last: u32,
    /// `outputs`: `OUTPUT_TENSOR` | `OUTPUT_TENSOR_REF`.
    pub outputs: u8,
    /// `decode_us` (the last field; 0 in recordings made before it existed).
    pub decode_us: f32,
}

/// `FrameTiming.OUTPUT_TENSOR`: the `tensor` message was published.
pub(crate) const OUTPUT_TENSOR: u8 = 1;
/// `FrameTiming.OUTPUT_TENSOR_REF`: a `tensor_ref` descriptor was published.
pub(crate) const OUTPUT_TENSOR_REF: u8 = 2;

impl FrameTiming {
    /// Decode CDR (e.g. a recorded `timing` message).
    pub fn decode(cdr: &[u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(cdr)?;
        let header = Header::read(&mut r)?;
        let sequence = r.u64("sequence")?;
        let backend = r.string("backend")?;
        let mut stages_us = [0f32; 6];
        for (s, name) in stages_us.iter_mut().zip([
            "upload_us",
            "preprocess_us",
            "conv_us",
            "download_us",
            "total_us",
            "age_us",
        ]) {
            *s = r.f32(name)?;
        }
        let dropped_since_last = r.u32("dropped_since_last")?;
        let outputs = r.u8("outputs")?;
        // Recordings made before `decode_us` was added end here.
        let decode_us = r.f32("decode_us").unwrap_or(0.0);
        Ok(FrameTiming {
            header,
            sequence,
            backend,
            stages_us,
            dropped_since_last,
            outputs,
            decode_us,
        })
    }

    /// Encode as CDR.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.header.write(&mut w);
        w.u64(self.sequence);
        w.string(&self.backend);
        for s in self.stages_us {
            w.f32(s);
        }
        w.u32(self.dropped_since_last);
        w.u8(self.outputs);
        w.f32(self.decode_us);
        w.finish()
    }
}

/// The ROS type name of images.
pub(crate) const IMAGE_TYPE: &str = "sensor_msgs/msg/Image";
/// The ROS type name of compressed images (image_transport's `compressed` transport).
pub(crate) const COMPRESSED_IMAGE_TYPE: &str = "sensor_msgs/msg/CompressedImage";
/// The ROS type name of foxglove's video packets (transport `foxglove`).
pub(crate) const FOXGLOVE_VIDEO_TYPE: &str = "foxglove_msgs/msg/CompressedVideo";
/// The ROS type name of ffmpeg_image_transport's packets (transport `ffmpeg`).
pub(crate) const FFMPEG_PACKET_TYPE: &str = "ffmpeg_image_transport_msgs/msg/FFMPEGPacket";
/// The ROS type name of camera infos.
pub(crate) const CAMERA_INFO_TYPE: &str = "sensor_msgs/msg/CameraInfo";
/// The ROS type name of a single camera's output (`vision_preproc_msgs/Tensor`).
pub(crate) const TENSOR_TYPE: &str = "vision_preproc_msgs/msg/Tensor";
/// The ROS type name of a batched node's output (`vision_preproc_msgs/TensorBatch`).
pub(crate) const TENSOR_BATCH_TYPE: &str = "vision_preproc_msgs/msg/TensorBatch";
/// The ROS type name of the per-frame timing (`vision_preproc_msgs/FrameTiming`).
pub const FRAME_TIMING_TYPE: &str = "vision_preproc_msgs/msg/FrameTiming";
/// The ROS type name of `tensor_ref`.
pub(crate) const TENSOR_REF_TYPE: &str = "vision_preproc_msgs/msg/TensorRef";

/// The type name of the `tensor` topic: `TENSOR_BATCH_TYPE` with 2+ inputs, else
/// `TENSOR_TYPE`.
pub fn tensor_type(batch: bool) -> &'static str {
    if batch {
        TENSOR_BATCH_TYPE
    } else {
        TENSOR_TYPE
    }
}

const SEPARATOR: &str =
    "================================================================================";
const HEADER_MSG: &str = "builtin_interfaces/Time stamp\nstring frame_id\n";
const TIME_MSG: &str = "int32 sec\nuint32 nanosec\n";

/// The `ros2msg` schema text of a message type with its dependencies, as rosbag2 writes
/// it into MCAP files.
pub(crate) fn schema(type_name: &str) -> Option<String> {
    let main = match type_name {
        TENSOR_TYPE => {
            include_str!("../../msgs/vision_preproc_msgs/msg/Tensor.msg")
        }
        FRAME_TIMING_TYPE => {
            include_str!("../../msgs/vision_preproc_msgs/msg/FrameTiming.msg")
        }
        TENSOR_BATCH_TYPE => {
            // Dependencies in the order rosbag2 writes them: BatchItem, then Header.
            let item = include_str!("../../msgs/vision_preproc_msgs/msg/BatchItem.msg");
            let batch = include_str!("../../msgs/vision_preproc_msgs/msg/TensorBatch.msg");
            return Some(format!(
                "{batch}\n{SEPARATOR}\nMSG: vision_preproc_msgs/BatchItem\n{item}\n{SEPARATOR}\nMSG: std_msgs/Header\n{HEADER_MSG}\n{SEPARATOR}\nMSG: builtin_interfaces/Time\n{TIME_MSG}"
            ));
        }
        _ => return None,
    };
    Some(format!(
        "{main}\n{SEPARATOR}\nMSG: std_msgs/Header\n{HEADER_MSG}\n{SEPARATOR}\nMSG: builtin_interfaces/Time\n{TIME_MSG}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_timing_round_trip_and_truncation() {
        let t = FrameTiming {
            header: Header { sec: 1_700_000_000, nanosec: 33, frame_id: "camera".into() },
            sequence: 1 << 40,
            backend: "cuda".into(),
            stages_us: [1.5, 20.25, 3.0, 4.0, 29.0, 31.5],
            dropped_since_last: 7,
            outputs: OUTPUT_TENSOR | OUTPUT_TENSOR_REF,
            decode_us: 1320.5,
        };
        let cdr = t.encode();
        assert_eq!(FrameTiming::decode(&cdr).expect("decodes"), t);
        // A message of before `decode_us` ends after `outputs` (3 padding bytes and the
        // f32 less): it decodes, with 0.
        let old = FrameTiming::decode(&cdr[..cdr.len() - 7]).expect("an older message");
        assert_eq!(old, FrameTiming { decode_us: 0.0, ..t });
        let err = FrameTiming::decode(&cdr[..cdr.len() - 10]).expect_err("truncated");
        assert_eq!(err.field, "dropped_since_last");
    }

    #[test]
    fn video_packets_decode_and_truncation_names_the_field() {
        // foxglove_msgs/CompressedVideo: timestamp, frame_id, data, format.
        let mut w = Writer::new();
        w.i32(7);
        w.u32(9);
        w.string("cam");
        w.bytes(&[0, 0, 1, 0x65]);
        w.string("h264");
        let cdr = w.finish();
        let header = Header { sec: 7, nanosec: 9, frame_id: "cam".into() };
        let fox = VideoPacket::decode_foxglove(&cdr).expect("decodes");
        let data: &[u8] = &[0, 0, 1, 0x65];
        assert_eq!(
            fox,
            VideoPacket { header: header.clone(), format: "h264".into(), pts: None, data }
        );
        assert_eq!(
            VideoPacket::decode_foxglove(&cdr[..cdr.len() - 3]).unwrap_err().field,
            "format"
        );
        // ffmpeg_image_transport_msgs/FFMPEGPacket: header, width, height, encoding, pts
        // (8-aligned), flags, is_bigendian, data.
        let mut w = Writer::new();
        header.write(&mut w);
        w.i32(640);
        w.i32(480);
        w.string("hevc;yuv420p;bgr8;bgr8");
        w.u64(1 << 40);
        w.u8(1);
        w.u8(0);
        w.bytes(data);
        let cdr = w.finish();
        let ff = VideoPacket::decode_ffmpeg(&cdr).expect("decodes");
        let format = "hevc;yuv420p;bgr8;bgr8".to_string();
        assert_eq!(ff, VideoPacket { header, format, pts: Some(1 << 40), data });
        assert_eq!(VideoPacket::decode_ffmpeg(&cdr[..cdr.len() - 2]).unwrap_err().field, "data");
    }

    #[test]
    fn image_round_trip_and_corruption() {
        let data = [1u8, 2, 3, 4, 5, 6];
        let header = Header { sec: 5, nanosec: 7, frame_id: "cam".into() };
        let img = Image::packed(header, "rgb8", 2, 1, &data);
        assert_eq!(img.step, 6);
        let cdr = img.encode();
        assert_eq!(Image::decode(&cdr).unwrap(), img);
        // Truncated: the data field is cut.
        let e = Image::decode(&cdr[..cdr.len() - 2]).unwrap_err();
        assert_eq!(e.field, "data");
    }

    #[test]
    fn compressed_image_round_trip_and_truncation() {
        let payload = [0xFFu8, 0xD8, 0xFF, 0xE0, 1, 2, 3, 0xFF, 0xD9];
        let msg = CompressedImage {
            header: Header { sec: 1_700_000_000, nanosec: 5, frame_id: "camera".into() },
            format: "bgr8; jpeg compressed bgr8".into(),
            data: &payload,
        };
        let cdr = msg.encode();
        assert_eq!(CompressedImage::decode(&cdr).expect("decodes"), msg);
        // The stamp is where every message with a header has it (`play --restamp`).
        assert_eq!(header_stamp_ns(&cdr).expect("a header"), 1_700_000_000_000_000_005);
        // Cut inside the payload: the data field; inside the format string: the format.
        let e = CompressedImage::decode(&cdr[..cdr.len() - 3]).expect_err("payload cut");
        assert_eq!(e.field, "data");
        let format_at = 4 + 8 + 4 + "camera".len() + 1 + 1 + 4;
        let e = CompressedImage::decode(&cdr[..format_at + 5]).expect_err("format cut");
        assert_eq!(e.field, "format");
        // An empty payload is a message (the decoder refuses it later, by name).
        let empty = CompressedImage { data: &[], ..msg };
        assert_eq!(CompressedImage::decode(&empty.encode()).expect("decodes"), empty);
    }

    #[test]
    fn schemas_carry_dependencies() {
        let s = schema("vision_preproc_msgs/msg/Tensor").unwrap();
        assert!(s.contains("std_msgs/Header header") && s.contains("MSG: builtin_interfaces/Time"));
        assert!(schema("sensor_msgs/msg/Image").is_none());
    }
}
