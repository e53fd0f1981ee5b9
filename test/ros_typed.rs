//! The node's raw-published `Tensor` and `FrameTiming` through real DDS, received by
//! r2r's typed subscriber: the node runs as its own process (CPU backend) and publishes
//! the CDR its pipeline wrote in place (`publish_raw`); this process publishes a real
//! photograph and subscribes to each output twice, typed (rmw deserializes, r2r builds
//! the Rust message) and raw (the bytes as received). Checked: field by field (the typed
//! message against the frame sent and against the crate's own CDR reader on the raw
//! bytes), and byte by byte: this process republishes each typed message with r2r's
//! typed publisher and receives that raw too; the node's bytes equal it, plus the zero
//! padding to 4 bytes that inter-process delivery adds (in-process delivery adds none).
//! (`to_serialized_bytes` is not the reference: rmw_serialize leaves the alignment
//! padding uninitialized, the wire does not.) rclpy's side is
//! `test/ros/test_transport.py`.
//!
//! Own ROS_DOMAIN_ID, loopback only; every wait has a timeout.

use futures::{FutureExt, StreamExt};
use r2r::sensor_msgs::msg::Image;
use r2r::vision_preproc_msgs::msg::{FrameTiming, Tensor};
use r2r::QosProfile;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use vision_preproc::wire::msgs::{FrameTiming as RawTiming, Tensor as RawTensor};

const NET_W: u32 = 61; // odd sizes: float16 data ends off a 4-byte boundary
const NET_H: u32 = 37;

struct NodeProc(Child);

impl Drop for NodeProc {
    fn drop(&mut self) {
        // SIGINT, as a user would; the node stops within a second.
        let _ = Command::new("kill").arg("-INT").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn photo() -> (u32, u32, Vec<u8>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/test/data/chelsea.png");
    let img = image::open(path).expect("test/data/chelsea.png").to_rgb8();
    (img.width(), img.height(), img.into_raw())
}

/// `node_raw` is `typed_wire` plus the zero padding to 4 bytes of inter-process delivery.
fn same_bytes(node_raw: &[u8], typed_wire: &[u8], what: &str) -> Result<(), String> {
    let n = typed_wire.len();
    let padded = n.next_multiple_of(4);
    let first = node_raw.iter().zip(typed_wire).position(|(a, b)| a != b);
    if first.is_some() || node_raw.len() != padded || node_raw[n..].iter().any(|&b| b != 0) {
        return Err(format!(
            "raw {what} ({} bytes) is not the typed publisher's {n} bytes padded to {padded}: \
             first difference at byte {first:?}",
            node_raw.len()
        ));
    }
    Ok(())
}

fn check(tensor: &Tensor, raw: &[u8], typed_wire: &[u8], sent: &Image) -> Result<(), String> {
    same_bytes(raw, typed_wire, "Tensor")?;
    // Field by field: typed against the crate's reader of the raw bytes, and the frame.
    let r = RawTensor::decode(raw).map_err(|e| e.to_string())?;
    let fields = [
        ("header.frame_id", r.header.frame_id == tensor.header.frame_id),
        (
            "header.stamp",
            (r.header.sec, r.header.nanosec)
                == (tensor.header.stamp.sec, tensor.header.stamp.nanosec),
        ),
        ("name", r.name == tensor.name),
        ("layout", r.layout == tensor.layout),
        ("dtype", r.dtype == tensor.dtype),
        ("shape", r.shape == tensor.shape),
        ("data", r.data == tensor.data.as_slice()),
        (
            "geometry",
            r.geometry == [tensor.scale_x, tensor.scale_y, tensor.offset_x, tensor.offset_y],
        ),
        (
            "source size",
            (r.source_width, r.source_height) == (tensor.source_width, tensor.source_height),
        ),
        ("source_encoding", r.source_encoding == tensor.source_encoding),
    ];
    if let Some((f, _)) = fields.iter().find(|(_, ok)| !ok) {
        return Err(format!("field {f} differs between the typed and the raw message"));
    }
    let want = [
        ("header", tensor.header == sent.header),
        ("name", tensor.name == "images"),
        ("layout/dtype", (tensor.layout.as_str(), tensor.dtype.as_str()) == ("NHWC", "float16")),
        ("shape", tensor.shape == [1, NET_H, NET_W, 3]),
        ("data length", tensor.data.len() == (NET_W * NET_H * 3 * 2) as usize),
        ("source", (tensor.source_width, tensor.source_height) == (sent.width, sent.height)),
        ("source_encoding", tensor.source_encoding == sent.encoding),
    ];
    if let Some((f, _)) = want.iter().find(|(_, ok)| !ok) {
        return Err(format!("field {f} does not match the frame sent: {:?}", tensor.header));
    }
    // Letterbox geometry of the sent size: scale = min(W / w, H / h) on both axes.
    let s = (NET_W as f32 / sent.width as f32).min(NET_H as f32 / sent.height as f32);
    if (tensor.scale_x - s).abs() > 0.02 || (tensor.scale_y - s).abs() > 0.02 {
        return Err(format!(
            "scale {} x {} for a letterbox of {s}",
            tensor.scale_x, tensor.scale_y
        ));
    }
    Ok(())
}

fn check_timing(
    t: &FrameTiming,
    raw: &[u8],
    typed_wire: &[u8],
    sent: &Image,
) -> Result<(), String> {
    same_bytes(raw, typed_wire, "FrameTiming")?;
    let r = RawTiming::decode(raw).map_err(|e| e.to_string())?;
    let stages = [t.upload_us, t.preprocess_us, t.conv_us, t.download_us, t.total_us, t.age_us];
    if r.stages_us != stages
        || r.sequence != t.sequence
        || r.backend != t.backend
        || r.decode_us != t.decode_us
    {
        return Err("FrameTiming fields differ between the typed and the raw message".into());
    }
    if t.header != sent.header
        || t.backend != "cpu"
        || t.total_us < t.preprocess_us
        || t.preprocess_us.is_nan()
    {
        return Err(format!("FrameTiming does not fit the frame: {t:?}"));
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let domain = 101 + std::process::id() % 99;
    std::env::set_var("ROS_DOMAIN_ID", domain.to_string());
    std::env::set_var("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST");
    let ns = format!("/typed_{}", std::process::id());
    let _node = NodeProc(
        Command::new(env!("CARGO_BIN_EXE_vision_preproc_node"))
            .args(["--ros-args", "-r", &format!("__ns:={ns}"), "-p", "backend:=cpu"])
            .args(["-p", &format!("network_image_width:={NET_W}")])
            .args(["-p", &format!("network_image_height:={NET_H}")])
            .args(["-p", "output_layout:=NHWC", "-p", "output_dtype:=float16"])
            .args(["-p", "tensor_name:=images"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the node: {e}"))?,
    );
    let ctx = r2r::Context::create().map_err(|e| e.to_string())?;
    let mut node = r2r::Node::create(ctx, "typed_peer", &ns).map_err(|e| e.to_string())?;
    let qos = QosProfile::default().keep_last(10);
    let publisher =
        node.create_publisher::<Image>("image", qos.clone()).map_err(|e| e.to_string())?;
    let err = |e: r2r::Error| e.to_string();
    let mut typed = node.subscribe::<Tensor>("tensor", qos.clone()).map_err(err)?;
    let mut raw =
        node.subscribe_raw("tensor", "vision_preproc_msgs/msg/Tensor", qos.clone()).map_err(err)?;
    let mut typed_t = node.subscribe::<FrameTiming>("timing", qos.clone()).map_err(err)?;
    let mut raw_t = node
        .subscribe_raw("timing", "vision_preproc_msgs/msg/FrameTiming", qos.clone())
        .map_err(err)?;
    // The typed publisher of the same messages, and its samples as received.
    let typed_pub = node.create_publisher::<Tensor>("tensor_typed", qos.clone()).map_err(err)?;
    let typed_pub_t =
        node.create_publisher::<FrameTiming>("timing_typed", qos.clone()).map_err(err)?;
    let mut wire = node
        .subscribe_raw("tensor_typed", "vision_preproc_msgs/msg/Tensor", qos.clone())
        .map_err(err)?;
    let mut wire_t = node
        .subscribe_raw("timing_typed", "vision_preproc_msgs/msg/FrameTiming", qos)
        .map_err(err)?;

    let (w, h, data) = photo();
    let mut sent = Image {
        height: h,
        width: w,
        encoding: "rgb8".into(),
        is_bigendian: 0,
        step: w * 3,
        data,
        ..Default::default()
    };
    sent.header.frame_id = "cam_odd".into(); // 7 bytes: later fields move off alignment
    sent.header.stamp.sec = 1_700_000_123;
    sent.header.stamp.nanosec = 456_789;
    let (mut tensors, mut raws, mut timings, mut raw_timings) = (vec![], vec![], vec![], vec![]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next_send = Instant::now();
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out: {} typed / {} raw tensors, {} / {} timings",
                tensors.len(),
                raws.len(),
                timings.len(),
                raw_timings.len()
            ));
        }
        if Instant::now() >= next_send && tensors.is_empty() {
            publisher.publish(&sent).map_err(err)?;
            next_send = Instant::now() + Duration::from_millis(500);
        }
        node.spin_once(Duration::from_millis(20));
        while let Some(Some(m)) = typed.next().now_or_never() {
            tensors.push(m);
        }
        while let Some(Some(m)) = raw.next().now_or_never() {
            raws.push(m);
        }
        while let Some(Some(m)) = typed_t.next().now_or_never() {
            timings.push(m);
        }
        while let Some(Some(m)) = raw_t.next().now_or_never() {
            raw_timings.push(m);
        }
        if !tensors.is_empty()
            && raws.len() >= tensors.len()
            && !timings.is_empty()
            && raw_timings.len() >= timings.len()
        {
            break;
        }
    }
    // Republish the first of each, typed, and take it back raw.
    typed_pub.publish(&tensors[0]).map_err(err)?;
    typed_pub_t.publish(&timings[0]).map_err(err)?;
    let (mut back, mut back_t) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while back.is_none() || back_t.is_none() {
        if Instant::now() > deadline {
            return Err("the typed republication did not come back".into());
        }
        node.spin_once(Duration::from_millis(20));
        if let Some(Some(m)) = wire.next().now_or_never() {
            back = Some(m);
        }
        if let Some(Some(m)) = wire_t.next().now_or_never() {
            back_t = Some(m);
        }
    }
    let (back, back_t) = (back.unwrap_or_default(), back_t.unwrap_or_default());
    // The same samples arrive in the same order on both subscriptions of a topic.
    check(&tensors[0], &raws[0], &back, &sent)?;
    check_timing(&timings[0], &raw_timings[0], &back_t, &sent)?;
    println!(
        "ros_typed: {} tensors and {} timings, raw == the typed publisher's bytes, fields equal",
        tensors.len(),
        timings.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ros_typed FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
