"""An rclpy subscription to `tensor_ref` that maps the node's pool and calls back with
taken Frames."""

from __future__ import annotations

import time
from typing import Any, Callable

from vision_preproc_consumer.frame import Frame
from vision_preproc_consumer.pool import PoolClient, PoolError

#: After a failed connection to a pool, messages of that pool are dropped (counted in
#: `errors`) for this long before the next attempt.
RETRY_S = 1.0


class TensorRefSubscription:
    """Subscribes `node` to `topic` (vision_preproc_msgs/TensorRef) and calls
    `callback(frame)` with a taken Frame for every message whose block still holds its
    tensor, once the tensor is ready to read (`Frame.wait_ready()`: the node's GPU work on
    it is done; the wait, up to frame.EVENT_TIMEOUT_S, runs before `callback`, in the
    executor's thread).

    The callback owns the frame: it must give it back, with `frame.release()` or
    `with frame:`, as soon as it is done with the tensor (it may keep it past the callback,
    e.g. for another thread, but never longer than the node's `shared_lease_ms`: the node
    then disconnects this consumer and takes every block back). If the callback raises
    (or the wait, on a driver error), the frame is released and the exception goes on to
    the executor.

    One PoolClient per pool (a node run), keyed by the message's pool_id and connected on
    the pool's first message; a connection the node closed is replaced by a new one on the
    next message. Counters: `received` messages, `delivered` frames, `skipped` (the block
    was reused before it could be taken), `withdrawn` (taken, but never ready: the node
    withdrew the set as its GPU work failed, closed the connection, or did not end its
    work within frame.EVENT_TIMEOUT_S; given back without a callback), `reconnects`
    (connections the node closed that were replaced), `errors` (messages dropped because
    the pool could not be reached).
    """

    def __init__(self, node: Any, topic: str, callback: Callable[[Frame], Any], qos: Any = 10) -> None:
        from vision_preproc_msgs.msg import TensorRef

        self.node = node
        self.callback = callback
        self.received = 0
        self.delivered = 0
        self.skipped = 0
        self.withdrawn = 0
        self.reconnects = 0
        self.errors = 0
        self.clients: dict[str, PoolClient] = {}
        self._retry_at: dict[str, float] = {}
        self._warned: set[str] = set()
        self.subscription = node.create_subscription(TensorRef, topic, self._on_message, qos)

    def _on_message(self, msg: Any) -> None:
        self.received += 1
        client = self._client(msg)
        if client is None:
            self.errors += 1
            return
        try:
            if int(msg.block_size) != client.hello.block_size:
                raise PoolError(f"TensorRef block_size {msg.block_size}, the pool's hello says "
                                f"{client.hello.block_size}")
            taken = client.acquire(int(msg.block_index), int(msg.generation))
        except PoolError as e:  # (the node closed the connection just now, or a bad message)
            self.errors += 1
            self._warn(str(e))
            return
        if not taken:
            self.skipped += 1
            return
        frame = Frame(client, msg)
        try:
            ready = frame.wait_ready()
        except BaseException:
            frame.release()
            raise
        if not ready:
            frame.release()
            self.withdrawn += 1
            return
        self.delivered += 1
        try:
            self.callback(frame)
        except BaseException:
            frame.release()
            raise

    def _client(self, msg: Any) -> PoolClient | None:
        """The connected client of the message's pool: the cached one, or a new connection
        (replacing one the node closed); None while the pool cannot be reached."""
        pool = msg.pool_id
        # Another pool's connection that its node closed (a node run that ended): drop it.
        for other, c in list(self.clients.items()):
            if other != pool and not c.connected:
                c.close()
                del self.clients[other]
        client = self.clients.get(pool)
        if client is not None:
            if client.connected:
                return client
            client.close()
            del self.clients[pool]
            self.reconnects += 1
        if time.monotonic() < self._retry_at.get(pool, 0.0):
            return None
        try:
            client = PoolClient(msg.socket_path, pool_id=pool)
        except (OSError, PoolError) as e:
            self._retry_at[pool] = time.monotonic() + RETRY_S
            self._warn(f"pool {pool} at {msg.socket_path}: {e}")
            return None
        self._retry_at.pop(pool, None)
        self.clients[pool] = client
        return client

    def _warn(self, text: str) -> None:
        if text not in self._warned and len(self._warned) < 100:
            self._warned.add(text)
            self.node.get_logger().warning(f"tensor_ref: {text}")

    def close(self) -> None:
        """Stop the subscription and close every pool connection (the node takes back the
        blocks still held; arrays still referenced keep their mapping until they go)."""
        if self.subscription is not None:
            self.node.destroy_subscription(self.subscription)
            self.subscription = None
        for c in self.clients.values():
            c.close()
        self.clients.clear()
