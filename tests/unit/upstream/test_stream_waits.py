"""How the replication stream waits between drains (upstream/postgres/stream.py, StreamWaits): after a busy drain the socket
wakes the reader only once BUSY_BYTES are queued (or after BUSY_WAIT), after a quiet one at the first byte again."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from upstream.postgres.stream import StreamWaits


class _Conn:
    """What StreamWaits reads of a psycopg2 connection: its socket's descriptor."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


@pytest.fixture
def tcp() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected TCP pair on the loopback: (the reader's end, the sender's end)."""
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    reader, _ = server.accept()
    server.close()
    yield reader, sender
    reader.close()
    sender.close()


def _readable(sock: Any) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_a_busy_stream_is_woken_by_a_batch_a_quiet_one_by_the_first_byte(tcp: tuple[socket.socket, socket.socket]
                                                                         ) -> None:
    reader, sender = tcp
    waits = StreamWaits(_Conn(reader))
    sender.sendall(b"x" * 100)
    waits.wait(reader, StreamWaits.BUSY_MESSAGES)  # busy: returns after BUSY_WAIT with 100 bytes queued
    assert not _readable(reader), "100 bytes must not wake a busy reader"
    sender.sendall(b"y" * StreamWaits.BUSY_BYTES)
    waits.wait(reader, StreamWaits.BUSY_MESSAGES)
    assert _readable(reader)
    reader.recv(2 * StreamWaits.BUSY_BYTES)
    sender.sendall(b"z")
    waits.wait(reader, 0)  # quiet again: the first byte wakes it
    assert _readable(reader)
    waits.close()
    assert reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1


def test_closing_while_busy_leaves_the_connection_as_it_found_it(tcp: tuple[socket.socket, socket.socket]) -> None:
    reader, sender = tcp
    waits = StreamWaits(_Conn(reader))
    waits.wait(reader, 10 * StreamWaits.BUSY_MESSAGES)
    assert reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == StreamWaits.BUSY_BYTES
    waits.close()
    assert reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    sender.sendall(b"x")
    assert select.select([reader], [], [], 5)[0], "the connection's own descriptor still works"


def test_a_unix_socket_waits_as_before() -> None:
    a, b = socket.socketpair()
    try:
        waits = StreamWaits(_Conn(a))
        b.sendall(b"x")
        waits.wait(a, 10 * StreamWaits.BUSY_MESSAGES)
        assert _readable(a)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        waits.close()
    finally:
        a.close()
        b.close()
