"""An rclpy subscription to `tensor_ref` that maps the node's pool and calls back with
taken Frames; on the node's machine it takes them from the pool's socket (the ready
signal, protocol version 2) as soon as the node announces them."""

from __future__ import annotations

import struct
import sys
import threading
import time
from typing import Any, Callable

from vision_preproc_consumer.frame import Frame
from vision_preproc_consumer.pool import (DESCRIPTOR, FLAG_SKIPPED, FLAG_TOPIC, FLAG_WITHDRAWN, SIGNAL_VERSION,
                                          PoolClient, PoolError)

#: After a failed connection to a pool, messages of that pool are dropped (counted in
#: `errors`) for this long before the next attempt.
RETRY_S = 1.0
#: How often a socket reader looks at whether its subscription was closed, and sends the
#: reports that wait.
READER_POLL_S = 0.1
#: On the socket path, Python's switch interval is lowered to this (if it was longer; the
#: default is 5 ms): the socket's thread and the executor's share one interpreter, and a
#: descriptor must not wait milliseconds behind the executor's Python code (its handling of
#: the same tensor's topic message arrives in the same instants).
SWITCH_INTERVAL_S = 0.0002


class TensorRefSubscription:
    """Subscribes `node` to `topic` (vision_preproc_msgs/TensorRef) and calls
    `callback(frame)` with a taken Frame for every tensor whose block still holds it, once
    the tensor is ready to read (`Frame.wait_ready()`: the node's GPU work on it is done;
    the wait, up to frame.EVENT_TIMEOUT_S, runs before `callback`).

    Where the tensors come from (`path[pool_id]`, logged once per pool): the topic tells
    this subscription where the node's pool is; when the node speaks protocol version 2
    (docs/HANDOFF.md, *The socket protocol*) and `fast_path` is True, the subscription
    asks it for the ready signal and from then on takes each tensor's descriptor from the
    pool's socket, the moment the node announces it ("socket"), in a thread of its own
    that calls `callback` (one at a time: never two callbacks of this subscription at
    once, topic or socket); else it takes them from the topic's messages in the
    executor's thread ("topic"). Either way it reports to the node when it acquired and
    released each tensor (version 2), which the node publishes per consumer in
    `/diagnostics`.

    The callback owns the frame: it must give it back, with `frame.release()` or
    `with frame:`, as soon as it is done with the tensor (it may keep it past the callback,
    e.g. for another thread, but never longer than the node's `shared_lease_ms`: the node
    then disconnects this consumer and takes every block back). If the callback raises
    (or the wait, on a driver error), the frame is released and the exception goes on to
    the executor (on the socket's thread: logged, and the thread goes on).

    One PoolClient per pool (a node run), keyed by the message's pool_id and connected on
    the pool's first message; a connection the node closed is replaced by a new one on the
    next message. Counters: `received` descriptors (topic messages, socket descriptors;
    not the topic's messages that the socket carried), `delivered` frames, `skipped` (the
    block was reused before it could be taken), `withdrawn` (taken, but never ready: the
    node withdrew the set as its GPU work failed, closed the connection, or did not end its
    work within frame.EVENT_TIMEOUT_S; given back without a callback), `reconnects`
    (connections the node closed that were replaced), `errors` (messages dropped because
    the pool could not be reached), `dropped` (descriptors the node did not send on the
    socket because this consumer fell behind; the node says so), `via_socket` and
    `via_topic` (frames delivered from each).
    """

    def __init__(self, node: Any, topic: str, callback: Callable[[Frame], Any], qos: Any = 10,
                 fast_path: bool = True) -> None:
        from vision_preproc_msgs.msg import TensorRef

        self._type = TensorRef
        self.node = node
        self.callback = callback
        self.fast_path = fast_path
        self.received = 0
        self.delivered = 0
        self.skipped = 0
        self.withdrawn = 0
        self.reconnects = 0
        self.errors = 0
        self.via_socket = 0
        self.via_topic = 0
        self.path: dict[str, str] = {}
        self.clients: dict[str, PoolClient] = {}
        self._readers: dict[str, threading.Thread] = {}
        self._retry_at: dict[str, float] = {}
        self._warned: set[str] = set()
        self._deliver_lock = threading.RLock()
        self._closed = False
        self.subscription = node.create_subscription(TensorRef, topic, self._on_message, qos)

    @property
    def dropped(self) -> int:
        return sum(c.dropped for c in self.clients.values())

    def _on_message(self, msg: Any) -> None:
        received_ns = time.time_ns()
        client = self._client(msg)
        if client is None:
            self.received += 1
            self.errors += 1
            return
        if client.signal and int(msg.generation) >= client.from_generation:
            return  # its descriptor came (or comes) on the socket
        self.received += 1
        self._deliver(client, msg, received_ns, FLAG_TOPIC if client.signal else 0)

    def _deliver(self, client: PoolClient, msg: Any, received_ns: int, flags: int, sent_ns: int = 0) -> None:
        """Take the tensor of `msg`, wait until it is ready and call back (one at a time)."""
        with self._deliver_lock:
            # (reports only to a node of protocol 2)
            stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec if client.signal else 0
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
                client.report(int(msg.generation), stamp, received_ns, 0, 0, int(msg.block_index),
                              flags | FLAG_SKIPPED)
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
                client.report(int(msg.generation), stamp, received_ns, 0, 0, int(msg.block_index),
                              flags | FLAG_WITHDRAWN)
                return
            self.delivered += 1
            if flags & FLAG_TOPIC or not client.signal:
                self.via_topic += 1
            else:
                self.via_socket += 1
            if client.signal:
                frame.report = (received_ns, time.time_ns(), flags)
            frame.received_ns, frame.sent_ns = received_ns, sent_ns
            try:
                self.callback(frame)
            except BaseException:
                frame.release()
                raise

    def _client(self, msg: Any) -> PoolClient | None:
        """The connected client of the message's pool: the cached one, or a new connection
        (replacing one the node closed, and upgraded to the ready signal where the node
        speaks it); None while the pool cannot be reached."""
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
        self._choose_path(pool, client)
        return client

    def _choose_path(self, pool: str, client: PoolClient) -> None:
        """Upgrade `client` to the ready signal where the node speaks it (and fast_path),
        start its reader, and say which path the tensors take."""
        why = "fast_path=False"
        if self.fast_path and SIGNAL_VERSION not in client.hello.versions:
            why = "the node speaks protocol version 1 only"
        elif self.fast_path:
            try:
                if client.upgrade(self.node.get_name()):
                    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
                        sys.setswitchinterval(SWITCH_INTERVAL_S)
                    reader = threading.Thread(target=self._read_socket, args=(client,), daemon=True,
                                              name=f"tensor_ref socket {pool}")
                    self._readers[pool] = reader
                    reader.start()
                    why = ""
                else:
                    why = "the node speaks protocol version 1 only"
            except (OSError, PoolError, ValueError) as e:
                why = f"the upgrade failed: {e}"
        path = "topic" if why else "socket"
        if self.path.get(pool) != path:
            where = f"the topic ({why})" if why else "the pool's socket (ready signal, protocol 2)"
            self.node.get_logger().info(f"tensor_ref: pool {pool}: tensors from {where}")
        self.path[pool] = path

    def _read_socket(self, client: PoolClient) -> None:
        """The socket's thread: each descriptor taken and called back as it arrives; ends
        with the connection (the next topic message of the pool connects again)."""
        while not self._closed:
            try:
                frames = client.messages(READER_POLL_S)
            except (OSError, PoolError):
                return
            for kind, body in frames:
                if kind != DESCRIPTOR or len(body) < 8:
                    continue
                received_ns = time.time_ns()
                try:
                    self._on_descriptor(client, body, received_ns)
                except Exception as e:  # noqa: BLE001 (the callback's: logged, the thread goes on)
                    self._warn(f"callback raised {type(e).__name__}: {e}")
            client.flush_reports(force=False)

    def _on_descriptor(self, client: PoolClient, body: bytes, received_ns: int) -> None:
        from rclpy.serialization import deserialize_message

        (sent_ns,) = struct.unpack_from("<q", body)
        msg = deserialize_message(body[8:], self._type)
        self.received += 1
        self._deliver(client, msg, received_ns, 0, sent_ns)

    def _warn(self, text: str) -> None:
        if text not in self._warned and len(self._warned) < 100:
            self._warned.add(text)
            self.node.get_logger().warning(f"tensor_ref: {text}")

    def close(self) -> None:
        """Stop the subscription and the socket readers and close every pool connection
        (the node takes back the blocks still held; arrays still referenced keep their
        mapping until they go)."""
        self._closed = True
        if self.subscription is not None:
            self.node.destroy_subscription(self.subscription)
            self.subscription = None
        for reader in self._readers.values():
            if reader is not threading.current_thread():
                reader.join(timeout=2 * READER_POLL_S + 1.0)
        self._readers.clear()
        for c in self.clients.values():
            c.flush_reports()
            c.close()
        self.clients.clear()
