"""vision_preproc_consumer: read the node's tensors in place, from the shared memory
blocks that `tensor_ref` describes (docs/HANDOFF.md), instead of receiving their bytes on
`tensor`.

    import rclpy
    from vision_preproc_consumer import TensorRefSubscription

    def on_frame(frame):
        with frame:                     # gives the block back at the end
            x = frame.array()           # NumPy view of the block: no copy, read-only
            net.run(x)                  # (CUDA memory: torch.as_tensor(x, device="cuda"))

    rclpy.init()
    node = rclpy.create_node("detector")
    sub = TensorRefSubscription(node, "/camera/vision_preproc/tensor_ref", on_frame)
    rclpy.spin(node)

The rules:

- The callback owns the frame and gives it back (`release()`, `with frame:`) when its
  work on the tensor is done; nothing `array()` returned may be read after that, as the
  node writes the next tensors into the block. A frame may be kept past the callback, but
  never longer than the node's `shared_lease_ms` (2 s by default): the node then
  disconnects the consumer and takes all its blocks back (the subscription reconnects on
  the next message; `sub.reconnects`).
- A message whose block was already reused is skipped (`sub.skipped`): the node never
  waits for a consumer.
- CUDA memory: the node publishes a message while its GPU work on the block may still
  run; the subscription waits for that work (`Frame.wait_ready()`, polling the node's
  interprocess event from the host) before the callback, so a callback's frame is ready.
  A set the node withdrew (its GPU work failed) or that did not end within 1 s is dropped
  (`sub.withdrawn`).
- Host memory: `array()` is a read-only NumPy array of the message's shape, dtype and
  strides. CUDA memory: an object with `__cuda_array_interface__`, for
  `torch.as_tensor(..., device="cuda")` or `cupy.asarray`; pass the stream that reads it
  to `release(stream)` (without one, release waits for the whole context). The blocks
  are imported with cuda-python when it is installed, else with ctypes on the driver's
  libcuda.so.1 (`VISION_PREPROC_CUDA_BINDING=cuda-python|ctypes` forces one).

Detections back to source pixels: `to_source(boxes, frame.msg.items[i], "xyxy")` (and
`to_network`), module `boxes`.

Modules: `pool` (PoolClient: the connection, the mapped blocks, taking and giving back
references), `frame` (Frame), `subscription` (TensorRefSubscription, rclpy), `cuda` (CUDA
blocks, imported only for a CUDA pool), `boxes`. Only `subscription` needs ROS 2.
"""

from vision_preproc_consumer.boxes import to_network, to_source
from vision_preproc_consumer.frame import MEMORY_CUDA, MEMORY_HOST, Frame
from vision_preproc_consumer.pool import Hello, PoolClient, PoolError
from vision_preproc_consumer.subscription import TensorRefSubscription

__all__ = ["Frame", "Hello", "MEMORY_CUDA", "MEMORY_HOST", "PoolClient", "PoolError", "TensorRefSubscription",
           "to_network", "to_source"]
