//! The pipeline's unit tests: one set at a time, its message and buffers, a batch's
//! items (the sets in flight: `inflight.rs`).

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::wire::msgs::{Tensor, TensorBatch};
use std::time::Duration;

fn pipeline(inputs: &[&str]) -> Pipeline {
    let cfg = Config {
        network_image_width: 16,
        network_image_height: 8,
        inputs: inputs.iter().map(|t| t.to_string()).collect(),
        ..Config::default()
    };
    Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("pipeline")
}

const TOPICS: [&str; 2] = ["a/image", "b/image"];

/// One 8x4 rgb8 frame per topic, pixels `v + camera index` (a batch of one with one
/// topic).
fn frames(p: &mut Pipeline, topics: &[&str], v: u8, stamp: i32) -> Result<Processed> {
    with_inputs(topics, v, stamp, |inputs, _| p.process_frames(inputs))
}

#[test]
fn a_taken_message_stays_while_the_next_batch_is_written_and_its_buffer_comes_back() {
    let mut p = pipeline(&TOPICS);
    frames(&mut p, &TOPICS, 10, 1).expect("batch 1");
    let first = p.message().to_vec();
    let mut taken = p.take_message();
    assert_eq!(taken.bytes(), &first[..]);
    frames(&mut p, &TOPICS, 200, 2).expect("batch 2");
    let second = p.message().to_vec();
    assert_ne!(second, first, "the second batch went into another buffer");
    assert_eq!(taken.bytes(), &first[..], "the taken message is untouched");
    // Ages are written into the taken message; everything else stays.
    taken.set_ages(&[5.0, 7.0]).expect("ages");
    let (before, after) = (
        TensorBatch::decode(&first).expect("decode"),
        TensorBatch::decode(taken.bytes()).expect("decode"),
    );
    assert_eq!(before.items.iter().map(|i| i.age_us).collect::<Vec<_>>(), [0.0, 0.0]);
    assert_eq!(after.items.iter().map(|i| i.age_us).collect::<Vec<_>>(), [5.0, 7.0]);
    assert_eq!(
        (after.data, &after.shape, after.header),
        (before.data, &before.shape, before.header)
    );
    assert_eq!(p.pool.counts(), (1, 0));
    drop(taken);
    assert_eq!(p.pool.counts(), (0, 1), "the buffer came back for the next take");
    let _second_taken = p.take_message();
    assert_eq!(p.pool.counts(), (1, 0), "...and was reused");
}

#[test]
fn a_replaced_backend_frees_the_buffers_of_its_messages() {
    let mut p = pipeline(&TOPICS);
    frames(&mut p, &TOPICS, 10, 1).expect("batch");
    let taken = p.take_message();
    let publisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50)); // publishing
        drop(taken);
    });
    // The replacement waits for the message being published, then frees its buffer
    // instead of taking it back.
    let left = p.replace_backend(Box::new(CpuBackend::new()), &mut NoOthers);
    assert_eq!(left, 0);
    assert_eq!(p.pool.counts(), (0, 0), "no buffer of the old backend kept");
    publisher.join().expect("publisher");
    frames(&mut p, &TOPICS, 10, 2).expect("a batch on the new backend");
}

/// Frames of `topics` (8x4 rgb8, pixels `v + camera index`) as the pipeline's inputs,
/// given to `f`.
fn with_inputs<T>(
    topics: &[&str],
    v: u8,
    stamp: i32,
    f: impl FnOnce(&[FrameInput<'_, '_>], &Header) -> T,
) -> T {
    let data: Vec<Vec<u8>> = (0..topics.len()).map(|i| vec![v + i as u8; 8 * 4 * 3]).collect();
    let images: Vec<ImageView<'_>> =
        data.iter().map(|d| ImageView::new(8, 4, 24, "rgb8", false, d).expect("image")).collect();
    let header = Header { sec: stamp, nanosec: 0, frame_id: "cam".into() };
    let inputs: Vec<FrameInput<'_, '_>> = topics
        .iter()
        .zip(&images)
        .map(|(topic, image)| FrameInput {
            topic,
            image: Some(image.into()),
            header: &header,
            source_encoding: "rgb8",
            repeated: false,
        })
        .collect();
    f(&inputs, &header)
}

#[test]
fn one_input_is_a_tensor_and_each_batch_item_is_that_tensor() {
    let mut single = pipeline(&[]);
    let info = frames(&mut single, &["image"], 10, 1).expect("single");
    let msg = single.take_message();
    let tensor = Tensor::decode(msg.bytes()).expect("a Tensor");
    assert_eq!(tensor.data, msg.tensor());
    assert_eq!(info.geometries.len(), 1);
    let mut batched = pipeline(&TOPICS);
    frames(&mut batched, &TOPICS, 10, 1).expect("batch");
    let batch = TensorBatch::decode(batched.message()).expect("a TensorBatch");
    assert_eq!(&batch.data[..tensor.data.len()], tensor.data, "item 0 = the single tensor");
    assert_eq!(batch.shape[0], 2);
}

#[test]
fn the_preview_of_a_batch_stacks_its_items() {
    let mut single = pipeline(&[]);
    frames(&mut single, &["image"], 10, 1).expect("single");
    let one = single.preview_image().expect("preview");
    assert_eq!((one.width, one.height, one.channels), (16, 8, 3));
    let mut batched = pipeline(&TOPICS);
    frames(&mut batched, &TOPICS, 10, 1).expect("batch");
    let taken = batched.take_message();
    let both = taken.preview().expect("preview");
    assert_eq!((both.width, both.height), (16, 16));
    assert_eq!(&both.data[..one.data.len()], &one.data[..], "item 0 on top");
    assert_ne!(&both.data[one.data.len()..], &one.data[..], "item 1 (pixels + 1) below");
}
